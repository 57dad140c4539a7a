// save_model under ZeRO-3 and stage3_gather_16bit_weights_on_model_save
// (Accelerate's zero3_save_16bit_model): true writes the gathered parameters
// in the 16-bit training dtype, false refuses as Accelerate does, not given
// keeps their own dtype. Other stages are not affected.

#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/safetensors_set.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace {

using testing::run_ranks;

struct Save16Result {
  std::vector<std::string> errors;            // per rank: the UsageError, if any
  testing::Params whole;                      // rank 0's whole fp32 parameters
};

// Trains one step on 2 ranks and saves to `dir`.
Save16Result save16_train_and_save(int stage, MixedPrecision precision, std::optional<bool> gather16,
                     const std::string& dir, const std::string& max_shard_size = "10GB") {
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
      accelerator.save_model(dir, max_shard_size);
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

// Accelerate's save_model(max_shard_size=...): shards of at most that size
// (a larger tensor alone), an index naming every tensor, the same values as
// the whole model, under DDP and ZeRO-2 and 3. Saving again unsharded into
// the same folder leaves no shard or index a loader would read instead; a
// size it cannot read is refused on every rank.
TEST(SaveModelShards, ShardsHoldEveryTensorOnceWithinTheLimitAndReplaceAnEarlierSave) {
  for (int stage : {0, 2, 3}) {
    testing::ScratchDir dir;
    const Save16Result saved =
        save16_train_and_save(stage, MixedPrecision::kNo, std::nullopt, dir.path(), "1KB");
    ASSERT_EQ(saved.errors[0], "") << "stage " << stage;
    ASSERT_FALSE(fs::exists(dir.path() + "/model.safetensors"));
    const nlohmann::json index = nlohmann::json::parse(
        std::ifstream(dir.path() + "/model.safetensors.index.json"));
    const auto& weight_map = index.at("weight_map");
    EXPECT_EQ(weight_map.size(), saved.whole.size()) << "stage " << stage;
    std::set<std::string> files;
    for (const auto& [name, file] : weight_map.items()) files.insert(file.get<std::string>());
    ASSERT_GT(files.size(), 1u);
    int64_t total = 0;
    for (const std::string& file : files) {
      EXPECT_EQ(file.rfind("model-0000", 0), 0u) << file;
      SafetensorsReader shard(dir.path() + "/" + file);
      EXPECT_EQ(shard.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
      int64_t bytes = 0;
      for (const auto& entry : shard.entries()) {
        bytes += static_cast<int64_t>(entry.data_end - entry.data_begin);
        EXPECT_EQ(weight_map.at(entry.name), file) << entry.name;
      }
      EXPECT_TRUE(bytes <= 1000 || shard.entries().size() == 1) << file << ": " << bytes;
      total += bytes;
    }
    EXPECT_EQ(index.at("metadata").at("total_size").get<int64_t>(), total);
    SafetensorsSet set(dir.path());
    for (const auto& [name, value] : saved.whole) {
      EXPECT_TRUE(torch::equal(set.read(name), value)) << "stage " << stage << " " << name;
    }
    // Again, in one file: the shards and the index go.
    ASSERT_EQ(save16_train_and_save(stage, MixedPrecision::kNo, std::nullopt, dir.path()).errors[0],
              "");
    for (const std::string& left : fs::list_directory(dir.path())) {
      EXPECT_EQ(left, "model.safetensors") << "stage " << stage;
    }
  }
  testing::ScratchDir dir;
  const Save16Result refused =
      save16_train_and_save(0, MixedPrecision::kNo, std::nullopt, dir.path(), "10XB");
  for (const auto& error : refused.errors) EXPECT_NE(error.find("10XB"), std::string::npos) << error;
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
