#include "launch/elastic_node.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "launch/failure_report.h"
#include "launch/node_names.h"
#include "launch/node_rendezvous.h"
#include "launch/worker_group.h"
#include "launch/worker_plan.h"
#include "tandem/comm/store_server.h"
#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

using std::chrono::milliseconds;

milliseconds to_ms(double seconds) { return milliseconds(static_cast<int64_t>(seconds * 1000)); }

// How the other nodes know this one: its host name and the address it
// reaches the store from ("node2/10.0.0.2"), which tells apart machines
// (or network namespaces) that share a host name.
std::string this_host(const std::string& store_host, int store_port) {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) std::snprintf(name, sizeof(name), "unknown");
  std::string out = name;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;  // an IPv6 endpoint too
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(store_host.c_str(), std::to_string(store_port).c_str(), &hints, &found) != 0) {
    return out;
  }
  // A UDP connect() picks the route and sends nothing.
  const int fd = ::socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
    const std::string text = address_text(reinterpret_cast<const sockaddr*>(&local));
    if (!text.empty()) out += "/" + text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return out;
}

// "rank 3 exited with code 1" for the store's record of why a round ended.
std::string short_cause(const FailureReport& report) {
  return fmt::format("rank {} {}", report.root_cause.exit.global_rank,
                     describe_exit(report.root_cause.exit));
}

// The rounds of run_elastic_node(), whose waits may throw StoppedBySignal.
int run_rounds(const LaunchOptions& opts, const ElasticNode& node);

}  // namespace

void throw_if_stop_signal() {
  if (const int sig = take_stop_signal(); sig != 0) throw StoppedBySignal{sig};
}

c10::intrusive_ptr<c10d::Store> connect_rendezvous_store(const std::string& host, int port,
                                                         const std::string& token,
                                                         milliseconds timeout,
                                                         const std::string& run_scope) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    throw_if_stop_signal();
    const auto left = std::chrono::duration_cast<milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      return connect_store(host, port, token,
                           std::max(milliseconds(1), std::min(left, milliseconds(1000))),
                           run_scope);
    } catch (const TimeoutError& e) {
      // Not up yet: look at the signals, then try again, until the deadline.
      if (left > milliseconds(1000)) continue;
      // The last slice's error, with the whole wait in it.
      std::string why = e.what();
      const auto within = why.find(" within ");
      const auto ms = why.find(" ms", within);
      if (within != std::string::npos && ms != std::string::npos) {
        why.replace(within, ms - within, fmt::format(" within {}", timeout.count()));
      }
      TANDEM_THROW(TimeoutError, "{}", why);
    }
  }
}

int run_elastic_node(const LaunchOptions& opts, const ElasticNode& node) {
  try {
    return run_rounds(opts, node);
  } catch (const StoppedBySignal& stopped) {
    std::fprintf(stderr,
                 "tandem launch: received SIG%s while waiting at rendezvous '%s'; stopped "
                 "(no worker of this node was running)\n",
                 sigabbrev_np(stopped.signal), opts.rdzv_id.c_str());
    return 128 + stopped.signal;
  }
}

namespace {

int run_rounds(const LaunchOptions& opts, const ElasticNode& node) {
  RendezvousSettings settings;
  settings.run_id = opts.rdzv_id;
  settings.max_nodes = opts.nnodes;
  settings.min_nodes = opts.min_nodes > 0 ? opts.min_nodes : opts.nnodes;
  settings.coordinator = node.coordinator;
  settings.host = this_host(opts.master_addr, opts.master_port);
  settings.slots = node.slots;
  settings.join_timeout = to_ms(opts.rdzv_timeout_s);
  settings.last_call = to_ms(opts.rdzv_last_call_s);
  settings.keep_alive = to_ms(opts.rdzv_keep_alive_interval_s * opts.rdzv_keep_alive_attempts);
  settings.on_wait = throw_if_stop_signal;
  NodeRendezvous rendezvous(*node.store, settings);
  rendezvous.set_max_restarts(opts.max_restarts);
  const RunDirectory run_dir(opts.log_dir);
  // torchrun's default exit barrier: how long the store's node waits for
  // the others to finish with it.
  const milliseconds exit_barrier(300000);

  Round previous;
  for (;;) {
    Round round;
    if (!rendezvous.join(round)) {
      std::fprintf(stderr, "tandem launch: rendezvous '%s': the job finished without this node\n",
                   opts.rdzv_id.c_str());
      return 0;
    }
    const int world = round.layout.world_size;
    std::fprintf(stderr,
                 "tandem launch: rendezvous '%s': this node is node %d of %zu (%zu of %d "
                 "processes)%s\n",
                 opts.rdzv_id.c_str(), round.layout.node_rank, round.members.size(),
                 round.layout.slots.size(), world,
                 round.number > 0 ? fmt::format(" in round {}", round.number).c_str() : "");
    if (const std::string left = NodeRendezvous::who_left(previous, round); !left.empty()) {
      std::fprintf(stderr, "tandem launch: rendezvous '%s': lost %s; going on with %zu nodes\n",
                   opts.rdzv_id.c_str(), left.c_str(), round.members.size());
    }
    previous = round;
    if (node.check_world) node.check_world(world);

    Plan plan;
    plan.layout = round.layout;
    plan.nodes = static_cast<int>(round.members.size());
    plan.set_visible_devices = node.set_visible_devices;
    if (opts.keep_global_batch) {
      const int64_t total = opts.base_accumulation * round.first_world;
      if (total % world != 0) {
        std::fprintf(stderr,
                     "tandem launch: --keep-global-batch: %lld accumulation step(s) x %d ranks "
                     "= %lld micro-batches per step do not split over %d ranks; stopping\n",
                     static_cast<long long>(opts.base_accumulation), round.first_world,
                     static_cast<long long>(total), world);
        rendezvous.restart_after_failure(round, "--keep-global-batch cannot split the batch", 0);
        return 1;
      }
      plan.accumulation = total / world;
      if (world != round.first_world) {
        std::fprintf(stderr,
                     "tandem launch: --keep-global-batch: gradient accumulation %lld on %d ranks "
                     "(%lld on %d)\n",
                     static_cast<long long>(*plan.accumulation), world,
                     static_cast<long long>(opts.base_accumulation), round.first_world);
      }
    }
    const std::string attempt_dir = run_dir.attempt_dir(round.number);
    WorkerGroup group(opts.program,
                      make_workers(opts, plan, node.master_port, /*agent_store=*/true,
                                   round.number, attempt_dir),
                      opts.grace_period_s, opts.prefix_output);
    group.stop_when([&] { return rendezvous.check(round); }, monitor_interval(opts, 0.5));
    const GroupResult result = group.run();
    if (result.success) {
      if (rendezvous.finish(round, exit_barrier)) return 0;
      continue;  // a node failed after this one's workers finished: run again
    }
    if (result.launcher_signal != 0) {
      std::fprintf(stderr, "tandem launch: received SIG%s; stopped all %zu workers%s\n",
                   sigabbrev_np(result.launcher_signal), result.exits.size(),
                   failure_before_signal(result, attempt_dir, run_dir.kept()).c_str());
      return 128 + result.launcher_signal;
    }
    if (!result.stop_reason.empty()) {
      std::fprintf(stderr, "tandem launch: %s; stopped this node's %zu workers\n",
                   result.stop_reason.c_str(), result.exits.size());
      if (rendezvous.store_lost()) return 1;
      continue;
    }
    const FailureReport report = make_failure_report(result, attempt_dir);
    // Workers that fail because another node moved the job on (its own
    // workers stopped, so their collectives broke) are no new failure. A
    // CommError or a SIGPIPE is usually such a consequence: the node whose
    // worker caused it gets a moment to say so first, so that the job
    // records the cause.
    std::string moved = rendezvous.check(round);
    const bool consequence = is_consequence(report.root_cause);
    const auto give_way = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (moved.empty() && consequence && std::chrono::steady_clock::now() < give_way) {
      std::this_thread::sleep_for(milliseconds(100));
      moved = rendezvous.check(round);
    }
    if (!moved.empty()) {
      std::fprintf(stderr, "tandem launch: %s; this node's workers ended with it (%s)\n",
                   moved.c_str(), short_cause(report).c_str());
      if (rendezvous.store_lost()) return 1;
      continue;
    }
    const std::string logs =
        run_dir.kept()
            ? fmt::format("{}/rank_{}/", attempt_dir, report.root_cause.exit.global_rank)
            : "";
    std::fprintf(stderr, "tandem launch: node %d (%s) failed in round %d. %s\n",
                 round.layout.node_rank, settings.host.c_str(), round.number,
                 render_failure_report(report, logs).c_str());
    if (!rendezvous.restart_after_failure(round, short_cause(report), opts.max_restarts)) {
      std::fprintf(stderr,
                   "tandem launch: job failed; the restart budget of the whole job is spent "
                   "(--max-restarts %d)\n",
                   opts.max_restarts);
      return 1;
    }
  }
}

}  // namespace

}  // namespace tandem::cli
