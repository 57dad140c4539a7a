// The Accelerator under Accelerate FSDP configs (distributed_type: FSDP):
// each sharding strategy trains exactly as the DeepSpeed config it maps to
// (FULL_SHARD as zero_stage 3, SHARD_GRAD_OP as 2, NO_SHARD as DDP) at
// worlds 2 and 3, holding the model the same way; HYBRID_SHARD at 4 ranks
// with 2 per host shards inside each host's pair and replicates across the
// pairs, as zero_hpz_partition_size 2 does; fsdp_offload_params keeps the
// shards on the host; fsdp_activation_checkpointing switches the marked
// blocks on.

#include <gtest/gtest.h>

#include <optional>

#include <torch/torch.h>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/parallel/activation_checkpoint.h"

namespace tandem {
namespace accelerator_fsdp_test {

using testing::Params;

// What a run ends with: rank 0's whole parameters and how it held them.
struct Held {
  Params params;
  int64_t steps = 0;              // optimizer steps taken
  int stage = -1;                 // the ZeroOptimizer's; 0: none (DDP)
  int shard_ranks = 0;            // the group the state is sharded over
  int replicate_ranks = 0;        // HSDP's replicate group; 0: none
  int64_t replicate_bytes = -1;   // across shard groups, last step
  bool offload_param = false;
  bool offload_optimizer = false;
  int checkpointed_blocks = 0;    // blocks whose checkpointing is on
};

// Sharded blocks that can also be checkpointed.
struct NetImpl : torch::nn::Module {
  NetImpl(int in, int width, int out, int depth) {
    input = register_module("input", torch::nn::Linear(in, width));
    output = register_module("output", torch::nn::Linear(width, out));
    for (int i = 0; i < depth; ++i) {
      blocks.push_back(register_module(
          "block" + std::to_string(i),
          Sharded<CheckpointedImpl<testing::BlockImpl>>(width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = input(x);
    for (auto& block : blocks) x = block->forward(x);
    return output(x);
  }
  torch::nn::Linear input{nullptr}, output{nullptr};
  std::vector<Sharded<CheckpointedImpl<testing::BlockImpl>>> blocks;
};
TORCH_MODULE(Net);

// Trains 3 optimizer steps of 2 micro-steps with clipping under the config
// read from `text` (`name` gives its format). ranks_per_host: the launcher's
// LOCAL_WORLD_SIZE (-1: the whole world on one host).
Held train(const std::string& text, const std::string& name, int world, int ranks_per_host = -1) {
  Config config = parse_config_text(text, name);
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;
  // Test seams, the same for every config: shard even the small tensors,
  // and several buckets at stage 2.
  config.zero.stage3_param_persistence_threshold = 0;
  config.zero.reduce_bucket_size = 97;
  LauncherEnv launcher;
  launcher.local_world_size = ranks_per_host;
  auto gen = at::detail::createCPUGenerator(11);
  const auto x = torch::randn({48, 6}, gen);
  const auto y = torch::randint(0, 4, {48}, gen);
  Held out;
  std::mutex mutex;
  testing::run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config, {}, launcher);
    std::optional<Net> built;
    {
      std::lock_guard<std::mutex> lock(testing::init_mutex());
      torch::manual_seed(7);
      auto init = accelerator.zero_init();  // FSDP's cpu_ram_efficient_loading
      built.emplace(6, 13, 4, 3);  // width 13: shards end inside parameters
    }
    Net model = *built;
    auto adam = std::make_shared<torch::optim::Adam>(model->parameters(),
                                                     torch::optim::AdamOptions(1e-2));
    accelerator.prepare_model(model);
    DistributedLoaderOptions options;
    options.batch_size = 2;
    options.shuffle = false;
    auto loader = accelerator.prepare_data_loader({x, y}, options);
    auto optimizer = accelerator.prepare_optimizer(adam);
    int micro = 0;
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      accelerator.backward(
          torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]));
      optimizer->step();
      if (++micro == 6) break;
    }
    auto zero = accelerator.zero_optimizer();
    std::optional<ZeroOptimizer::GatheredParameters> whole;
    if (zero && zero->stage() == 3) whole.emplace(*zero);
    std::lock_guard<std::mutex> lock(mutex);
    if (pg.rank() != 0) return;
    out.params = testing::snapshot(*model);
    out.steps = accelerator.step();
    out.stage = zero ? zero->stage() : 0;
    if (zero) {
      out.shard_ranks = zero->process_group().world_size();
      out.replicate_ranks = zero->replicate_group() ? zero->replicate_group()->world_size() : 0;
      out.replicate_bytes = zero->comm_stats().last_step_replicate_bytes;
      out.offload_param = zero->options().offload_param;
      out.offload_optimizer = zero->options().offload_optimizer;
    }
    for (auto& block : model->blocks) out.checkpointed_blocks += block->checkpointing();
  });
  return out;
}

std::string fsdp_yaml(const std::string& entries) {
  return "distributed_type: FSDP\nfsdp_config:\n" + entries;
}

std::string deepspeed_yaml(int stage, const std::string& entries = "") {
  return "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: " +
         std::to_string(stage) + "\n" + entries;
}

TEST(AcceleratorFsdp, EachShardingStrategyTrainsAsItsDeepSpeedStageAtWorlds2And3) {
  struct Case {
    std::string strategy;
    int stage;
  };
  for (int world : {2, 3}) {
    for (const Case& c : {Case{"FULL_SHARD", 3}, Case{"SHARD_GRAD_OP", 2}, Case{"NO_SHARD", 0}}) {
      const Held fsdp =
          train(fsdp_yaml("  fsdp_sharding_strategy: " + c.strategy + "\n"), "a.yaml", world);
      const Held deepspeed = train(deepspeed_yaml(c.stage), "a.yaml", world);
      EXPECT_EQ(fsdp.steps, 3);
      EXPECT_EQ(fsdp.stage, c.stage) << c.strategy << " world " << world;
      EXPECT_EQ(deepspeed.stage, c.stage);
      EXPECT_EQ(fsdp.shard_ranks, c.stage ? world : 0) << c.strategy;
      EXPECT_EQ(fsdp.replicate_ranks, 0) << c.strategy;
      EXPECT_LE(testing::max_relative_diff(fsdp.params, deepspeed.params), 1e-6)
          << c.strategy << " world " << world;
    }
  }
  // FSDP2's spelling of FULL_SHARD.
  const Held v2 = train(fsdp_yaml("  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n"),
                        "a.yaml", 2);
  EXPECT_EQ(v2.stage, 3);
  EXPECT_LE(testing::max_relative_diff(v2.params, train(deepspeed_yaml(3), "a.yaml", 2).params),
            1e-6);
}

TEST(AcceleratorFsdp, HybridShardAtFourRanksTwoPerHostShardsInsideEachHost) {
  for (const auto& [strategy, stage] :
       std::vector<std::pair<std::string, int>>{{"HYBRID_SHARD", 3}, {"HYBRID_SHARD_ZERO2", 2}}) {
    const Held hybrid =
        train(fsdp_yaml("  fsdp_sharding_strategy: " + strategy + "\n"), "a.yaml", 4, 2);
    EXPECT_EQ(hybrid.stage, stage) << strategy;
    EXPECT_EQ(hybrid.shard_ranks, 2) << strategy;
    EXPECT_EQ(hybrid.replicate_ranks, 2) << strategy;
    EXPECT_GT(hybrid.replicate_bytes, 0) << strategy;
    // The DeepSpeed JSON for the same layout: hpZ partitions of 2.
    const Held hpz = train("{\"zero_optimization\": {\"stage\": " + std::to_string(stage) +
                               ", \"zero_hpz_partition_size\": 2}}",
                           "ds.json", 4);
    EXPECT_EQ(hpz.shard_ranks, 2);
    EXPECT_LE(testing::max_relative_diff(hybrid.params, hpz.params), 1e-6) << strategy;
  }
  // One host of four: one shard group, nothing to replicate across.
  const Held one_host = train(fsdp_yaml("  fsdp_sharding_strategy: HYBRID_SHARD\n"), "a.yaml", 4);
  EXPECT_EQ(one_host.shard_ranks, 4);
  EXPECT_EQ(one_host.replicate_ranks, 0);
}

TEST(AcceleratorFsdp, OffloadParamsKeepsTheShardsAndTheStepOnTheHost) {
  const Held fsdp = train(fsdp_yaml("  fsdp_offload_params: true\n"), "a.yaml", 2);
  EXPECT_TRUE(fsdp.offload_param);
  EXPECT_TRUE(fsdp.offload_optimizer);
  const Held deepspeed = train(deepspeed_yaml(3, "  offload_optimizer_device: cpu\n"
                                                 "  offload_param_device: cpu\n"),
                               "a.yaml", 2);
  EXPECT_LE(testing::max_relative_diff(fsdp.params, deepspeed.params), 1e-6);
  // SHARD_GRAD_OP: the optimizer side only (parameters stay whole).
  const Held grad_op = train(
      fsdp_yaml("  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_offload_params: true\n"),
      "a.yaml", 2);
  EXPECT_FALSE(grad_op.offload_param);
  EXPECT_TRUE(grad_op.offload_optimizer);
}

TEST(AcceleratorFsdp, ActivationCheckpointingSwitchesTheMarkedBlocksOnAndTrainsTheSame) {
  const Held on = train(fsdp_yaml("  fsdp_activation_checkpointing: true\n"), "a.yaml", 2);
  const Held off = train(fsdp_yaml("  fsdp_activation_checkpointing: false\n"), "a.yaml", 2);
  EXPECT_EQ(on.checkpointed_blocks, 3);
  EXPECT_EQ(off.checkpointed_blocks, 0);
  EXPECT_EQ(testing::max_relative_diff(on.params, off.params), 0.0);
}

}  // namespace accelerator_fsdp_test
}  // namespace tandem
