// Static nodes agree on the job's size before any worker starts
// (layout_check.h): nodes as threads over an in-memory store.

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "launch/host_filter.h"
#include "launch/layout_check.h"
#include "support/usage_error.h"

namespace tandem::cli {
namespace {

using testing::usage_error_message;

// What layout_nodes() gives node `node` of `nnodes` running `count` each.
NodeLayout static_layout(int node, int nnodes, int count) {
  return layout_nodes(count, nnodes, node, "", "", {"localhost"});
}

// Runs check_node_layouts() for every layout on its own thread; returns
// each node's refusal ("" when it accepted).
std::vector<std::string> check_all(const std::vector<NodeLayout>& layouts) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(std::chrono::seconds(30));
  std::vector<std::string> refusals(layouts.size());
  std::vector<std::thread> nodes;
  for (size_t k = 0; k < layouts.size(); ++k) {
    nodes.emplace_back([&, k] {
      refusals[k] = usage_error_message([&] {
        check_node_layouts(*store, layouts[k], static_cast<int>(layouts.size()),
                           /*hosts_store=*/k == 0);
      });
    });
  }
  for (auto& node : nodes) node.join();
  return refusals;
}

TEST(LayoutCheck, NodesOfTheSameCountAgree) {
  for (int nnodes : {2, 3}) {
    std::vector<NodeLayout> layouts;
    for (int k = 0; k < nnodes; ++k) layouts.push_back(static_layout(k, nnodes, 2));
    for (const auto& refusal : check_all(layouts)) EXPECT_EQ(refusal, "");
  }
}

TEST(LayoutCheck, NodesOfDifferentCountsAreAllRefusedNamingBoth) {
  // --num_processes 4 on node 0 and 2 on node 1, with --nnodes 2.
  const auto refusals = check_all({static_layout(0, 2, 2), static_layout(1, 2, 1)});
  for (const auto& refusal : refusals) {
    EXPECT_NE(refusal.find("the 2 nodes disagree on the job's size: 3 process(es) in all"),
              std::string::npos)
        << refusal;
    EXPECT_NE(refusal.find("runs 2 of a world of 4"), std::string::npos) << refusal;
    EXPECT_NE(refusal.find("runs 1 of a world of 2"), std::string::npos) << refusal;
  }
  EXPECT_NE(refusals[0].find("node 0 (this node) runs 2"), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[1].find("node 1 (this node) runs 1"), std::string::npos) << refusals[1];
}

TEST(LayoutCheck, AnIncludeNamingEveryNodeAgreesWithUnequalCounts) {
  const std::string include = "a:0,1@b:0";
  const auto refusals = check_all({layout_nodes(2, 2, std::nullopt, include, "", {"a"}),
                                   layout_nodes(2, 2, std::nullopt, include, "", {"b"})});
  for (const auto& refusal : refusals) EXPECT_EQ(refusal, "");
}

}  // namespace
}  // namespace tandem::cli
