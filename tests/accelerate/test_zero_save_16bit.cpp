// save_model under ZeRO-3 and stage3_gather_16bit_weights_on_model_save
// (Accelerate's zero3_save_16bit_model): true writes the gathered parameters
// in the 16-bit training dtype, false refuses as Accelerate does, not given
// keeps their own dtype. Other stages are not affected.

#include <gtest/gtest.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem {
namespace {

using testing::run_ranks;

struct Save16Result {
  std::vector<std::string> errors;            // per rank: the UsageError, if any
  testing::Params whole;                      // rank 0's whole fp32 parameters
};

// Trains one step on 2 ranks and saves to `dir`.
Save16Result save16_train_and_save(int stage, MixedPrecision precision, std::optional<bool> gather16,
                     const std::string& dir) {
  testing::Recipe r;
  Config config;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;
  config.zero.gather_16bit_weights_on_model_save = gather16;
  config.mixed_precision = precision;
  auto gen = at::detail::createCPUGenerator(3);
  const auto x = torch::randn({8, r.in}, gen);
  const auto y = torch::randint(0, r.out, {8}, gen);
  Save16Result out;
  out.errors.assign(2, "");
  std::mutex mutex;
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    testing::Stack model = testing::make_model(r);
    auto adamw = std::make_shared<torch::optim::AdamW>(model->parameters(),
                                                       torch::optim::AdamWOptions(1e-2));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adamw);
    {
      auto autocast = accelerator.autocast();
      auto loss = torch::nn::functional::cross_entropy(
          model->forward(x.narrow(0, 4 * pg.rank(), 4)).to(torch::kFloat),
          y.narrow(0, 4 * pg.rank(), 4));
      accelerator.backward(loss);
    }
    optimizer->step();
    std::string error;
    try {
      accelerator.save_model(dir);
    } catch (const UsageError& e) {
      error = e.what();
    }
    testing::Params whole;
    {
      std::optional<ZeroOptimizer::GatheredParameters> gathered;
      if (stage == 3) gathered.emplace(*accelerator.zero_optimizer());
      whole = testing::snapshot(*model);
    }
    std::lock_guard<std::mutex> lock(mutex);
    out.errors[pg.rank()] = error;
    if (pg.rank() == 0) out.whole = whole;
  });
  return out;
}

TEST(ZeroSave16Bit, TrueWritesTheGatheredParametersInTheTrainingDtype) {
  testing::ScratchDir dir;
  const Save16Result saved = save16_train_and_save(3, MixedPrecision::kBf16, true, dir.path());
  ASSERT_EQ(saved.errors[0], "");
  SafetensorsReader file(dir.path() + "/model.safetensors");
  ASSERT_EQ(file.entries().size(), saved.whole.size());
  for (const auto& [name, value] : saved.whole) {
    const SafetensorsEntry* entry = file.find(name);
    ASSERT_NE(entry, nullptr) << name;
    EXPECT_EQ(entry->dtype, at::kBFloat16) << name;
    EXPECT_TRUE(torch::equal(file.read(name), value.to(torch::kBFloat16))) << name;
  }
}

TEST(ZeroSave16Bit, NotGivenKeepsTheParametersDtype) {
  testing::ScratchDir dir;
  const Save16Result saved = save16_train_and_save(3, MixedPrecision::kBf16, std::nullopt, dir.path());
  ASSERT_EQ(saved.errors[0], "");
  SafetensorsReader file(dir.path() + "/model.safetensors");
  // Accelerate's save_model metadata, which transformers' loaders require.
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  for (const auto& [name, value] : saved.whole) {
    EXPECT_EQ(file.find(name)->dtype, at::kFloat) << name;
    EXPECT_TRUE(torch::equal(file.read(name), value)) << name;
  }
}

TEST(ZeroSave16Bit, FalseRefusesOnEveryRankUnderZero3Only) {
  testing::ScratchDir dir;
  const Save16Result refused = save16_train_and_save(3, MixedPrecision::kBf16, false, dir.path());
  for (const auto& error : refused.errors) {
    EXPECT_NE(error.find("stage3_gather_16bit_weights_on_model_save"), std::string::npos) << error;
    EXPECT_NE(error.find("save_state"), std::string::npos) << error;
  }
  testing::ScratchDir other;
  const Save16Result stage2 = save16_train_and_save(2, MixedPrecision::kBf16, false, other.path());
  EXPECT_EQ(stage2.errors[0], "");
  EXPECT_EQ(stage2.errors[1], "");
  SafetensorsReader file(other.path() + "/model.safetensors");
  for (const auto& [name, value] : stage2.whole) EXPECT_EQ(file.find(name)->dtype, at::kFloat);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// AcceleratorOptions::hidden_size fills the sizes a DeepSpeed config left
// "auto" (tests/config/test_training_keys.cpp checks the formulas against
// accelerate's own), and the ZeRO optimizer runs with them.
TEST(ZeroAutoSizes, TheHiddenSizeFillsTheAutoSizesTheOptimizerUses) {
  const std::string text = R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": 7}})";
  const Config file = parse_config_text(text, "ds.json");
  for (const std::optional<int64_t> hidden : {std::optional<int64_t>(16), std::optional<int64_t>()}) {
    run_ranks(2, [&](ProcessGroup& pg) {
      AcceleratorOptions options;
      options.hidden_size = hidden;
      Accelerator accelerator(pg.shared_from_this(), file, options);
      const HiddenSizeAutoSizes expected = hidden_size_auto_sizes(hidden.value_or(1));
      const ZeroConfig& zero = accelerator.config().zero;
      if (hidden) {
        EXPECT_EQ(zero.reduce_bucket_size, expected.reduce_bucket_size);
        EXPECT_EQ(zero.stage3_prefetch_bucket_size, expected.stage3_prefetch_bucket_size);
        EXPECT_EQ(accelerator.config().auto_keys.count("zero_optimization.reduce_bucket_size"), 0u);
      } else {
        EXPECT_EQ(zero.reduce_bucket_size, ZeroConfig{}.reduce_bucket_size);
        EXPECT_EQ(zero.stage3_prefetch_bucket_size, ZeroConfig{}.stage3_prefetch_bucket_size);
        EXPECT_EQ(accelerator.config().auto_keys.count("zero_optimization.reduce_bucket_size"), 1u);
      }
      EXPECT_EQ(zero.stage3_param_persistence_threshold, 7);  // a number stays
      testing::Recipe r;
      testing::Stack model = testing::make_model(r);
      auto adamw = std::make_shared<torch::optim::AdamW>(model->parameters(),
                                                         torch::optim::AdamWOptions(1e-2));
      accelerator.prepare_model(model);
      accelerator.prepare_optimizer(adamw);
      EXPECT_EQ(accelerator.zero_optimizer()->options().prefetch_bucket_size,
                zero.stage3_prefetch_bucket_size);
    });
  }
}

}  // namespace
}  // namespace tandem
