#pragma once
// Nodes that agree on their node ranks through the store, as torchrun's
// `--rdzv-backend c10d` lets them: no --node-rank on any node.

#include <chrono>
#include <string>
#include <vector>

#include "launch/host_filter.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tandem::cli {

// A fixed number of nodes meet at `store` under the job id `run_id`: the
// node that hosts the store is node 0, the others take node ranks 1, 2, ...
// in the order they arrive, and each publishes how many processes it runs,
// so that every node computes the same world size and rank offsets (nodes
// may run different numbers of processes). Throws UsageError when more than
// `nnodes` nodes arrive, TimeoutError naming how many arrived when fewer
// than `nnodes` do within `timeout`.
NodeLayout rendezvous_nodes(c10d::Store& store, const std::string& run_id, int nnodes,
                            bool hosts_store, std::vector<int> slots,
                            std::chrono::milliseconds timeout);

}  // namespace tandem::cli
