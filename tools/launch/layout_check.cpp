// Static nodes agree on the job's size before any worker starts
// (layout_check.h).

#include "launch/layout_check.h"

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

// Under "tandem/launch/": the workers' keys are "tandem/<restart>/...".
std::string layout_key(int node) { return fmt::format("tandem/launch/layout/{}", node); }
std::string read_key(int node) { return fmt::format("tandem/launch/layout_read/{}", node); }

struct Published {
  int count = 0, offset = 0, world = 0;
};

std::vector<uint8_t> published_bytes(const NodeLayout& layout) {
  const std::string text = fmt::format("{} {} {}", layout.slots.size(), layout.rank_offset,
                                       layout.world_size);
  return {text.begin(), text.end()};
}

Published parse_published(const std::vector<uint8_t>& bytes) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  Published p;
  in >> p.count >> p.offset >> p.world;
  return p;
}

}  // namespace

void check_node_layouts(c10d::Store& store, const NodeLayout& layout, int nnodes,
                        bool hosts_store, std::chrono::milliseconds linger) {
  store.set(layout_key(layout.node_rank), published_bytes(layout));
  std::vector<Published> nodes(static_cast<size_t>(nnodes));
  bool agree = true;
  int sum = 0;
  for (int k = 0; k < nnodes; ++k) {
    // get() waits for a node that has not started yet, as its workers would.
    nodes[k] = parse_published(store.get(layout_key(k)));
    agree = agree && nodes[k].world == layout.world_size && nodes[k].offset == sum;
    sum += nodes[k].count;
  }
  agree = agree && sum == layout.world_size;
  store.set(read_key(layout.node_rank), std::vector<uint8_t>{'1'});
  if (agree) return;
  if (hosts_store) {
    // The others still need the store to read this node's count and refuse
    // too; it goes when this launcher exits.
    std::vector<std::string> keys;
    for (int k = 0; k < nnodes; ++k) keys.push_back(read_key(k));
    try {
      store.wait(keys, linger);
    } catch (const std::exception&) {
      // A node that never reads is told by its own timeout.
    }
  }
  std::string counts;
  for (int k = 0; k < nnodes; ++k) {
    counts += fmt::format("{}node {}{} runs {} of a world of {}", k == 0 ? "" : ", ", k,
                          k == layout.node_rank ? " (this node)" : "", nodes[k].count,
                          nodes[k].world);
  }
  TANDEM_THROW(UsageError,
               "the {} nodes disagree on the job's size: {} process(es) in all, but {}. Every "
               "node of a static launch must run as many processes: give each the same "
               "--nproc-per-node (accelerate's --num_processes counts the processes of all "
               "nodes and is divided by --nnodes), name every node's slots with --include "
               "(host1:0,1@host2:0), or let nodes differ with --rdzv-backend c10d",
               nnodes, sum, counts);
}

}  // namespace tandem::cli
