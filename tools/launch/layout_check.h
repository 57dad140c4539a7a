#pragma once
// Whether the nodes of a static multi-node launch agree on the job's size.
//
// Each static node computes its first global rank and the world size from
// its own flags (host_filter.h: layout_nodes). Nodes given different
// process counts (`--num_processes 4` on one, `2` on the other, with
// `--nnodes 2`) would hand out the same ranks twice and hang until the
// rendezvous timeout. Before any worker starts, each node's launcher
// publishes its count at the store and reads every other node's, so that
// every node refuses such a job at once, naming both counts. A --hostfile
// job's hosts skip it: the head gives them all one --include.

#include <chrono>

#include "launch/host_filter.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tandem::cli {

// Publishes `layout` (this node's process count, first rank and world size)
// under node `layout.node_rank` of `nnodes`, waits for every other node's
// (the store's timeout bounds the wait), and throws UsageError, naming this
// node's and the first disagreeing node's counts and the fix, when they do
// not add up to one world. `hosts_store`: this node hosts the store, so on
// a refusal it waits (up to `linger`) until every node has read what it
// needs before it returns and takes the store down. Thread-safe as `store`.
void check_node_layouts(c10d::Store& store, const NodeLayout& layout, int nnodes,
                        bool hosts_store,
                        std::chrono::milliseconds linger = std::chrono::seconds(10));

}  // namespace tandem::cli
