#include "launch/node_rendezvous.h"

#include <cstdio>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

double as_seconds(std::chrono::milliseconds duration) { return duration.count() / 1000.0; }

// "node 2 (host h3, ranks 4-5)"
std::string describe_member(const Round& round, const RoundMember& member) {
  int first = 0;
  for (const auto& m : round.members) {
    if (m.node_rank < member.node_rank) first += m.processes;
  }
  const int last = first + member.processes - 1;
  return fmt::format("node {} (host {}, {})", member.node_rank, member.host,
                     first == last ? fmt::format("rank {}", first)
                                   : fmt::format("ranks {}-{}", first, last));
}

}  // namespace

NodeRendezvous::NodeRendezvous(c10d::Store& store, RendezvousSettings settings)
    : store_(store), settings_(std::move(settings)) {}

std::string NodeRendezvous::key(const std::string& name) const {
  return "tandem/rdzv/" + settings_.run_id + "/" + name;
}

std::string NodeRendezvous::round_key(int round, const std::string& name) const {
  return key(fmt::format("r{}/{}", round, name));
}

void NodeRendezvous::pause() {
  if (settings_.on_wait) settings_.on_wait();
  std::this_thread::sleep_for(settings_.poll);
}

int NodeRendezvous::current_round() {
  // Round 0 until the coordinator says otherwise: nodes may arrive first.
  if (settings_.coordinator) store_.compareSet(key("round"), {}, bytes("0"));
  if (!store_.check({key("round")})) return 0;
  return std::stoi(text(store_.get(key("round"))));
}

void NodeRendezvous::throw_if_failed() {
  if (store_.check({key("failed")})) {
    TANDEM_THROW(Error, "rendezvous '{}': the job stopped: {}", settings_.run_id,
                 text(store_.get(key("failed"))));
  }
}

bool NodeRendezvous::join(Round& round) {
  const bool fixed = settings_.min_nodes == settings_.max_nodes;
  for (;;) {
    throw_if_failed();
    if (store_.check({key("done")})) return false;
    const int r = current_round();
    const std::string closed = round_key(r, "closed");
    int node_rank = 0;
    int members = 0;
    if (settings_.coordinator) {
      store_.set(round_key(r, "node0"),
                 bytes(fmt::format("{} {}", settings_.slots.size(), settings_.host)));
      members = close_round(r);
    } else {
      const bool running = store_.check({closed});
      if (!running) {
        node_rank = static_cast<int>(store_.add(round_key(r, "joined"), 1));
        store_.set(round_key(r, fmt::format("node{}", node_rank)),
                   bytes(fmt::format("{} {}", settings_.slots.size(), settings_.host)));
        const Clock::time_point deadline = Clock::now() + settings_.join_timeout;
        while (!store_.check({closed})) {
          throw_if_failed();
          if (Clock::now() >= deadline) {
            TANDEM_THROW(TimeoutError,
                         "rendezvous '{}': round {} did not close within {:g} s (--rdzv-timeout); "
                         "start `tandem launch` on every node with the same --rdzv-endpoint, "
                         "--rdzv-id and --nnodes, or raise --rdzv-timeout",
                         settings_.run_id, r, as_seconds(settings_.join_timeout));
          }
          pause();
        }
        members = std::stoi(text(store_.get(closed)));
      }
      if (running || node_rank >= members) {
        TANDEM_CHECK_ARG(!fixed || r > 0,
                         "rendezvous '{}' already has its {} nodes (--nnodes {}); this node would "
                         "be node {}. Give every node the same --nnodes, or a new --rdzv-id for a "
                         "new job",
                         settings_.run_id, settings_.max_nodes, settings_.max_nodes,
                         running ? settings_.max_nodes : node_rank);
        // The round runs (or is full): wait for the next one.
        store_.add(round_key(r, "waiting"), 1);
        std::fprintf(stderr,
                     "tandem launch: rendezvous '%s': round %d runs without this node; waiting "
                     "to join the next\n",
                     settings_.run_id.c_str(), r);
        while (current_round() == r && !store_.check({key("failed")}) &&
               !store_.check({key("done")})) {
          pause();
        }
        continue;
      }
    }
    read_members(r, members, node_rank, round);
    round.first_world = std::stoi(text(store_.get(key("first_world"))));
    return true;
  }
}

int NodeRendezvous::close_round(int r) {
  const Clock::time_point deadline = Clock::now() + settings_.join_timeout;
  std::optional<Clock::time_point> last_call;
  int members = 1;
  for (;;) {
    throw_if_failed();
    members = 1 + static_cast<int>(store_.add(round_key(r, "joined"), 0));
    if (members >= settings_.max_nodes) {
      members = settings_.max_nodes;
      break;
    }
    if (members >= settings_.min_nodes) {
      if (!last_call) last_call = Clock::now() + settings_.last_call;
      if (Clock::now() >= *last_call) break;
    } else if (Clock::now() >= deadline) {
      const std::string why = fmt::format(
          "round {}: {} of the {} nodes --nnodes needs joined within {:g} s (--rdzv-timeout)", r,
          members, settings_.min_nodes, as_seconds(settings_.join_timeout));
      store_.set(key("failed"), bytes(why));
      TANDEM_THROW(TimeoutError,
                   "rendezvous '{}': {}; start `tandem launch` on every node with the same "
                   "--rdzv-endpoint, --rdzv-id and --nnodes, or raise --rdzv-timeout",
                   settings_.run_id, why);
    }
    pause();
  }
  Round round;
  read_members(r, members, 0, round);
  store_.compareSet(key("first_world"), {}, bytes(std::to_string(round.layout.world_size)));
  store_.set(round_key(r, "closed"), bytes(std::to_string(members)));
  return members;
}

void NodeRendezvous::read_members(int r, int members, int this_rank, Round& out) {
  std::vector<std::string> keys;
  for (int node = 0; node < members; ++node) keys.push_back(round_key(r, fmt::format("node{}", node)));
  store_.wait(keys, settings_.join_timeout);
  out = Round{};
  out.number = r;
  out.layout.node_rank = this_rank;
  out.layout.slots = settings_.slots;
  for (int node = 0; node < members; ++node) {
    std::istringstream entry(text(store_.get(keys[node])));
    RoundMember member;
    member.node_rank = node;
    entry >> member.processes >> member.host;
    if (node < this_rank) out.layout.rank_offset += member.processes;
    out.layout.world_size += member.processes;
    out.members.push_back(member);
  }
}

std::string NodeRendezvous::check(const Round& round) {
  try {
    const int r = round.number;
    store_.add(round_key(r, fmt::format("beat{}", round.layout.node_rank)), 1);
    if (store_.check({key("failed")})) {
      return "the job stopped: " + text(store_.get(key("failed")));
    }
    if (current_round() != r) {
      const std::string why = round_key(r, "why");
      return "the job moved to round " + std::to_string(r + 1) + ": " +
             (store_.check({why}) ? text(store_.get(why)) : "another node restarted it");
    }
    if (!settings_.coordinator) return "";
    if (const std::string lost = lost_member(round); !lost.empty()) {
      const std::string why = fmt::format("lost {}: no heartbeat for {:g} s", lost,
                                          as_seconds(settings_.keep_alive));
      if (!move_on(r, why, /*counted=*/true, max_restarts_)) {
        return "the job stopped: " + text(store_.get(key("failed")));
      }
      return "the job moves to round " + std::to_string(r + 1) + ": " + why;
    }
    const bool below_max = static_cast<int>(round.members.size()) < settings_.max_nodes;
    const std::string waiting = round_key(r, "waiting");
    if (below_max && store_.check({waiting}) && store_.add(waiting, 0) > 0) {
      const std::string why =
          "a node waits to join (a membership change, not counted against --max-restarts)";
      move_on(r, why, /*counted=*/false, 0);
      return "the job moves to round " + std::to_string(r + 1) + ": " + why;
    }
    return "";
  } catch (const std::exception& e) {
    store_lost_ = true;
    return std::string("lost the rendezvous store (the node it runs on, --rdzv-endpoint, may be "
                       "gone): ") + e.what();
  }
}

std::string NodeRendezvous::lost_member(const Round& round) {
  const int r = round.number;
  const auto now = Clock::now();
  if (beats_round_ != r) {
    beats_round_ = r;
    beats_.assign(round.members.size(), -1);
    beats_seen_.assign(round.members.size(), now);
  }
  for (const auto& member : round.members) {
    const size_t i = static_cast<size_t>(member.node_rank);
    const std::string beat = round_key(r, fmt::format("beat{}", member.node_rank));
    const int64_t value = store_.check({beat}) ? store_.add(beat, 0) : 0;
    if (value != beats_[i]) {
      beats_[i] = value;
      beats_seen_[i] = now;
    } else if (now - beats_seen_[i] > settings_.keep_alive &&
               !store_.check({round_key(r, fmt::format("finished{}", member.node_rank))})) {
      return describe_member(round, member);
    }
  }
  return "";
}

bool NodeRendezvous::move_on(int r, const std::string& why, bool counted, int max_restarts) {
  // Whoever writes the round's reason first moves the job on; nodes whose
  // workers failed for the same cause do not count it again.
  const std::string now = text(store_.compareSet(round_key(r, "why"), {}, bytes(why)));
  if (now != why) return true;
  if (counted && store_.add(key("restarts"), 1) > max_restarts) {
    store_.set(key("failed"),
               bytes(fmt::format("{}; the restart budget is spent (--max-restarts {})", why,
                                 max_restarts)));
    return false;
  }
  store_.compareSet(key("round"), bytes(std::to_string(r)), bytes(std::to_string(r + 1)));
  return true;
}

bool NodeRendezvous::restart_after_failure(const Round& round, const std::string& what,
                                           int max_restarts) {
  return move_on(round.number, fmt::format("{} (host {})", what, settings_.host),
                 /*counted=*/true, max_restarts);
}

bool NodeRendezvous::finish(const Round& round, std::chrono::milliseconds exit_barrier) {
  const int r = round.number;
  store_.set(round_key(r, fmt::format("finished{}", round.layout.node_rank)), bytes("1"));
  if (!settings_.coordinator) return true;
  std::vector<std::string> keys;
  for (const auto& m : round.members) {
    keys.push_back(round_key(r, fmt::format("finished{}", m.node_rank)));
  }
  const Clock::time_point deadline = Clock::now() + exit_barrier;
  while (!store_.check(keys)) {
    if (current_round() != r) return false;
    if (store_.check({key("failed")}) || Clock::now() >= deadline) break;
    pause();
  }
  store_.set(key("done"), bytes("1"));
  return true;
}

std::string NodeRendezvous::who_left(const Round& before, const Round& after) {
  std::string out;
  for (const auto& member : before.members) {
    bool stayed = false;
    for (const auto& m : after.members) stayed = stayed || m.host == member.host;
    if (!stayed) out += (out.empty() ? "" : ", ") + describe_member(before, member);
  }
  return out;
}

}  // namespace tandem::cli
