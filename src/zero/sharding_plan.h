#pragma once
// What a ZeRO stage shards, decided once from ZeroOptions::stage. This is
// the one place in src/zero where the stage chooses behaviour: the engine
// builds the plan after checking the options, the layout keeps it, and the
// parts ask it a question ("are gradients sharded?"), never the stage. The
// GradientReducer picks its reduction policy from it (reduction_policy.h).
//
// A plain value: copy it, read it from any thread.

namespace tandem::detail {

struct ShardingPlan {
  // Stages 2 and 3: each group's gradients are packed, reduce-scattered into
  // this rank's fp32 gradient shard and freed (ShardedReduceScatter).
  // Stage 1: they are views of one whole flat buffer per group, all-reduced
  // in place as DDP's (FlatAllReduce).
  bool shard_gradients = false;
  // Stage 3: the parameters of Sharded units are partitioned, whole only
  // while the UnitGatherer holds them gathered.
  bool partition_parameters = false;
};

// The plan of `stage`, which the caller has checked is 1, 2 or 3.
inline ShardingPlan plan_for_stage(int stage) {
  ShardingPlan plan;
  plan.shard_gradients = stage >= 2;
  plan.partition_parameters = stage == 3;
  return plan;
}

}  // namespace tandem::detail
