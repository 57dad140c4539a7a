#pragma once
// One node of a job whose nodes meet at the store (`tandem launch
// --rdzv-backend c10d` without --node-rank): it joins each round of the
// rendezvous (node_rendezvous.h), runs its workers for that round, and
// moves with the other nodes to the next round on a failure anywhere, a
// node that joins, or a node that is lost, as torchrun's elastic agent does.

#include <functional>
#include <vector>

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

// Runs the node's rounds until the job ends; returns the launcher's exit
// code: 0 when the job finished (with or without this node), 1 when it
// failed or lost its store, 128+N when a signal stopped this node.
int run_elastic_node(const LaunchOptions& opts, const ElasticNode& node);

}  // namespace tandem::cli
