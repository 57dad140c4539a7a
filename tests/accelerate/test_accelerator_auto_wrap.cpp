// An Accelerate FSDP config's wrap policy (fsdp_auto_wrap_policy with its
// layer names or size), or AcceleratorOptions::zero_auto_wrap, picks the
// ZeRO-3 units of a plain torch::nn::Sequential model, which then trains
// like DDP; without a policy the model trains as FSDP's root unit.

#include <gtest/gtest.h>

#include <mutex>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace {

struct AutoWrapRun {
  testing::Params params;  // rank 0's, whole
  std::size_t groups = 0;  // ZeRO's flat groups: units, then the loose parameters
};

AutoWrapRun train_prepared(const std::string& yaml,
                           const std::optional<AutoWrapOptions>& override_policy = std::nullopt) {
  Config config = parse_config_text(yaml, "fsdp.yaml");
  // Tiny layers: partition them all (tandem's default keeps parameters
  // under 1e5 elements whole, as DeepSpeed's).
  config.zero.stage3_param_persistence_threshold = 0;
  AcceleratorOptions options;
  options.zero_auto_wrap = override_policy;
  auto gen = at::detail::createCPUGenerator(5);
  const auto x = torch::randn({24, 6}, gen);
  const auto y = torch::randint(0, 3, {24}, gen);
  AutoWrapRun out;
  std::mutex mutex;
  testing::run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config, options);
    torch::nn::Sequential model;
    {
      std::lock_guard<std::mutex> lock(testing::init_mutex());
      torch::manual_seed(11);
      model = torch::nn::Sequential(torch::nn::Linear(6, 17), torch::nn::ReLU(),
                                    torch::nn::Linear(17, 17), torch::nn::ReLU(),
                                    torch::nn::Linear(17, 3));
    }
    auto adam = std::make_shared<torch::optim::Adam>(model->parameters(),
                                                     torch::optim::AdamOptions(1e-2));
    accelerator.prepare_model(model);
    DistributedLoaderOptions loader_options;
    loader_options.batch_size = 4;
    loader_options.shuffle = false;
    auto loader = accelerator.prepare_data_loader({x, y}, loader_options);
    auto optimizer = accelerator.prepare_optimizer(adam);
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      accelerator.backward(
          torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]));
      optimizer->step();
    }
    std::size_t groups = 0;
    std::optional<ZeroOptimizer::GatheredParameters> whole;
    if (auto zero = accelerator.zero_optimizer()) {
      groups = zero->group_parameter_names().size();
      whole.emplace(*zero);
    }
    testing::Params p = testing::snapshot(*model);
    std::lock_guard<std::mutex> lock(mutex);
    if (pg.rank() == 0) out = {p, groups};
  });
  return out;
}

const char* const kFsdp = "distributed_type: FSDP\nfsdp_config:\n";

TEST(AcceleratorAutoWrap, TheConfigsPolicyPicksTheUnitsAndTrainsLikeDdp) {
  const AutoWrapRun ddp = train_prepared("distributed_type: MULTI_CPU\n");
  const AutoWrapRun layers = train_prepared(
      std::string(kFsdp) + "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                           "  fsdp_transformer_layer_cls_to_wrap: Linear\n");
  EXPECT_EQ(layers.groups, 3u);  // the three Linears, nothing loose
  EXPECT_LT(testing::max_relative_diff(layers.params, ddp.params), 1e-5);
  const AutoWrapRun size = train_prepared(
      std::string(kFsdp) + "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"
                           "  fsdp_min_num_params: 200\n");
  EXPECT_EQ(size.groups, 2u);  // Linear(17, 17) (306) as a unit; the others loose
  EXPECT_LT(testing::max_relative_diff(size.params, ddp.params), 1e-5);
  const AutoWrapRun root = train_prepared(std::string(kFsdp) + "  fsdp_version: 1\n");
  EXPECT_EQ(root.groups, 1u);  // FSDP's root unit: everything loose
  EXPECT_LT(testing::max_relative_diff(root.params, ddp.params), 1e-5);
}

TEST(AcceleratorAutoWrap, AcceleratorOptionsBeatTheConfig) {
  AutoWrapOptions every_linear;
  every_linear.policy = AutoWrapOptions::kTransformerLayer;
  every_linear.layer_types = {"torch::nn::LinearImpl"};
  const AutoWrapRun run = train_prepared(
      std::string(kFsdp) + "  fsdp_auto_wrap_policy: NO_WRAP\n", every_linear);
  EXPECT_EQ(run.groups, 3u);
}

}  // namespace
}  // namespace tandem
