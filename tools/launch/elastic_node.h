#pragma once
// One node of a job whose nodes meet at the store (`tandem launch
// --rdzv-backend c10d` without --node-rank): it joins each round of the
// rendezvous (node_rendezvous.h), runs its workers for that round, and
// moves with the other nodes to the next round on a failure anywhere, a
// node that joins, or a node that is lost, as torchrun's elastic agent does.

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>

#include "launch/launch_options.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tandem::cli {

struct ElasticNode {
  c10d::Store* store = nullptr;  // the rendezvous store (a client of the coordinator's)
  bool coordinator = false;      // this node hosts the store
  int master_port = 0;           // the workers' store port
  std::vector<int> slots;        // this node's processes (slots after --exclude)
  bool set_visible_devices = false;
  // Called with each round's world size before its workers start: the
  // config file's checks (throws UsageError when it does not fit).
  std::function<void(int world_size)> check_world;
};

// A signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that came while this node
// waited for the others, with no worker running: the waits throw it, and
// the launcher exits 128+signal.
struct StoppedBySignal {
  int signal = 0;
};

// Throws StoppedBySignal when the launcher received a stop signal since
// the last look (take_stop_signal()). Call after
// install_launcher_signal_handlers().
void throw_if_stop_signal();

// connect_store(), in slices so that a stop signal ends the wait for a
// store that is not up yet: throws StoppedBySignal then, TimeoutError when
// nothing answers within `timeout`.
c10::intrusive_ptr<c10d::Store> connect_rendezvous_store(const std::string& host, int port,
                                                         const std::string& token,
                                                         std::chrono::milliseconds timeout,
                                                         const std::string& run_scope = "");

// Runs the node's rounds until the job ends; returns the launcher's exit
// code: 0 when the job finished (with or without this node), 1 when it
// failed or lost its store, 128+N when a signal stopped this node (also
// while it waited at the rendezvous).
int run_elastic_node(const LaunchOptions& opts, const ElasticNode& node);

}  // namespace tandem::cli
