#include "launch/node_rendezvous.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

NodeLayout rendezvous_nodes(c10d::Store& store, const std::string& run_id, int nnodes,
                            bool hosts_store, std::vector<int> slots,
                            std::chrono::milliseconds timeout) {
  const std::string prefix = "tandem/rdzv/" + run_id + "/";
  NodeLayout layout;
  layout.slots = std::move(slots);
  // The host is node 0 without asking: the others count from 1, whenever the
  // host itself arrives.
  layout.node_rank = hosts_store ? 0 : static_cast<int>(store.add(prefix + "joined", 1));
  TANDEM_CHECK_ARG(layout.node_rank < nnodes,
                   "rendezvous '{}' already has its {} nodes (--nnodes {}); this node would be "
                   "node {}. Give every node the same --nnodes, or a new --rdzv-id for a new job",
                   run_id, nnodes, nnodes, layout.node_rank);
  store.set(prefix + "slots/" + std::to_string(layout.node_rank),
            bytes(std::to_string(layout.slots.size())));

  std::vector<std::string> keys;
  for (int node = 0; node < nnodes; ++node) keys.push_back(prefix + "slots/" + std::to_string(node));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {  // the store's timeout (its type depends on the store)
    int arrived = 0;
    for (const auto& key : keys) arrived += store.check({key}) ? 1 : 0;
    TANDEM_THROW(TimeoutError,
                 "rendezvous '{}': {} of {} nodes arrived within {} s; start `tandem launch` "
                 "on every node with the same --rdzv-endpoint, --rdzv-id and --nnodes, or "
                 "raise --rdzv-timeout",
                 run_id, arrived, nnodes,
                 std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
  }
  for (int node = 0; node < nnodes; ++node) {
    const int count = std::stoi(text(store.get(keys[node])));
    if (node < layout.node_rank) layout.rank_offset += count;
    layout.world_size += count;
  }
  return layout;
}

}  // namespace tandem::cli
