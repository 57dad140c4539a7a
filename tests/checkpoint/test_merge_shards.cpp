// `tandem checkpoint merge DIR OUT_DIR --max-shard-size`: a ZeRO-3
// checkpoint merged into a Hugging Face sharded set (several files and the
// index, checked by Python's json and safetensors), loaded back with
// Accelerator::load_model_weights under ZeRO-3 at another world size, under
// ZeRO-1, DDP and in one process, giving the checkpoint's weights exactly.

#include <gtest/gtest.h>

#include <mutex>

#include <torch/torch.h>

#include "checkpoint/safetensors_test_util.h"
#include "support/checkpoint_testing.h"
#include "support/subprocess.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/checkpoint/safetensors_set.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace {

using testing::ScratchDir;

testing::Recipe recipe() {
  testing::Recipe r;
  r.width = 13;  // odd sizes: shards end inside parameters
  return r;
}

std::shared_ptr<torch::optim::Adam> adam_over(testing::Stack& model) {
  return std::make_shared<torch::optim::Adam>(model->parameters(),
                                              torch::optim::AdamOptions(1e-2));
}

// Two ZeRO-3 steps at world 2, saved to `dir`.
void train_and_save(const std::string& dir) {
  const testing::Recipe r = recipe();
  Config config;
  config.zero.stage = 3;
  std::vector<testing::Stack> models;
  for (int rank = 0; rank < 2; ++rank) models.push_back(testing::make_model(r));
  testing::run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    testing::Stack& model = models[pg.rank()];
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adam_over(model));
    for (int step = 0; step < 2; ++step) {
      optimizer->zero_grad();
      auto [x, y] = testing::micro_batch(r, step, 0, pg.rank(), 2);
      accelerator.backward(torch::nn::functional::cross_entropy(model->forward(x), y));
      optimizer->step();
    }
    accelerator.save_state(dir);
  });
}

// The model's parameters after Accelerator::load_model_weights(path) at
// `world` ranks with ZeRO `stage` (0: none).
std::map<std::string, torch::Tensor> load_back(const std::string& path, int world, int stage) {
  const testing::Recipe r = recipe();
  Config config;
  config.zero.stage = stage;
  std::vector<testing::Stack> models;
  for (int rank = 0; rank < world; ++rank) models.push_back(testing::make_model(r));
  std::map<std::string, torch::Tensor> out;
  std::mutex mutex;
  testing::run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    testing::Stack& model = models[pg.rank()];
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adam_over(model));
    EXPECT_EQ(accelerator.zero_optimizer() != nullptr, stage > 0);
    const LoadSafetensorsResult result = accelerator.load_model_weights(model, path);
    EXPECT_TRUE(result.missing.empty() && result.unexpected.empty());
    std::unique_ptr<ZeroOptimizer::GatheredParameters> whole;
    if (auto zero = accelerator.zero_optimizer()) {
      whole = std::make_unique<ZeroOptimizer::GatheredParameters>(*zero);
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (pg.rank() == 0) {
      for (const auto& item : model->named_parameters()) {
        out["model/" + item.key()] = item.value().detach().clone();
      }
    }
  });
  return out;
}

testing::ProcessResult merge(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::bin("tandem"), "checkpoint", "merge"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_process(argv, 120);
}

// Python's own reading of the set: the index's weight_map names exactly the
// tensors of each file, total_size is their byte sum, and the file names
// follow model-0000k-of-0000n.
constexpr const char* kPythonCheck = R"(
import json, os, re, sys
from safetensors import safe_open
d = sys.argv[1]
index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
n = len(files)
assert files == ["model-%05d-of-%05d.safetensors" % (k, n) for k in range(1, n + 1)], files
seen, total = {}, 0
for f in files:
    with safe_open(os.path.join(d, f), framework="pt") as st:
        for k in st.keys():
            seen[k] = f
            t = st.get_tensor(k)
            total += t.numel() * t.element_size()
assert seen == index["weight_map"], (seen, index["weight_map"])
assert total == index["metadata"]["total_size"], (total, index["metadata"])
print("ok", n, "files", len(seen), "tensors")
)";

TEST(MergeShards, MaxShardSizeWritesAHuggingFaceSetThatLoadsBackIntoZero3AndPlainModels) {
  ScratchDir scratch;
  const std::string checkpoint = scratch.file("ckpt");
  train_and_save(checkpoint);
  std::map<std::string, torch::Tensor> saved;
  for (const auto& [key, t] : testing::consolidated(checkpoint)) {
    if (key.rfind("model/", 0) == 0) saved[key] = t;
  }
  ASSERT_FALSE(saved.empty());
  const std::string out = scratch.file("hf");
  const auto result = merge({checkpoint, out, "--max-shard-size", "1KB"});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("and model.safetensors.index.json"), std::string::npos) << result.out;

  // Several files, each within the limit (tensor data; a bigger tensor alone).
  SafetensorsSet set(out);
  ASSERT_GE(set.files().size(), 3u);
  for (const auto& file : set.files()) {
    SafetensorsReader reader(file);
    int64_t data = 0;
    for (const auto& e : reader.entries()) data += e.data_end - e.data_begin;
    EXPECT_TRUE(data <= 1000 || reader.entries().size() == 1) << file << ": " << data;
  }
  for (const std::string& name : fs::list_directory(scratch.path())) {
    EXPECT_EQ(name.find(".tmp-merge-"), std::string::npos);
  }

  if (testing::peer_can_import("safetensors")) {
    const std::string script = scratch.file("check.py");
    testing::write_bytes(script, kPythonCheck);
    const auto python = testing::run_process({TANDEM_PEER_PYTHON, script, out}, 60);
    EXPECT_EQ(python.exit_code, 0) << python.out << python.err;
    EXPECT_NE(python.out.find("ok " + std::to_string(set.files().size()) + " files"),
              std::string::npos)
        << python.out;
  }

  // Without the flag, merge still writes one file, holding the same tensors.
  const auto single = merge({checkpoint, scratch.file("one.safetensors")});
  ASSERT_EQ(single.exit_code, 0) << single.err;
  const SafetensorsReader one(scratch.file("one.safetensors"));
  ASSERT_EQ(one.entries().size(), set.entries().size());
  for (const auto& entry : one.entries()) {
    EXPECT_TRUE(torch::equal(one.read(entry.name), set.read(entry.name))) << entry.name;
  }

  EXPECT_TRUE(testing::same_tensors(load_back(out, 3, 3), saved));
  EXPECT_TRUE(testing::same_tensors(load_back(out, 1, 0), saved));
  EXPECT_TRUE(testing::same_tensors(load_back(out, 2, 0), saved));  // DDP
  EXPECT_TRUE(testing::same_tensors(load_back(out, 2, 1), saved));
}

TEST(MergeShards, OneShardIsModelSafetensorsAloneAsSavePretrainedWritesIt) {
  ScratchDir scratch;
  const std::string checkpoint = scratch.file("ckpt");
  train_and_save(checkpoint);
  const std::string out = scratch.file("hf");
  const auto result = merge({checkpoint, out, "--max-shard-size", "10GB"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
}

TEST(MergeShards, BadSizesAndUsedDirectoriesAreRefusedBeforeAnythingIsWritten) {
  ScratchDir scratch;
  const std::string checkpoint = scratch.file("ckpt");
  train_and_save(checkpoint);
  const std::string out = scratch.file("hf");
  auto bad = merge({checkpoint, out, "--max-shard-size", "2XB"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("is not a size"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(out));

  fs::create_directories(out);
  testing::write_bytes(out + "/config.json", "{}");
  bad = merge({checkpoint, out, "--max-shard-size", "1KB"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("not an empty directory"), std::string::npos) << bad.err;

  // A failed run (no such tag) leaves no files behind.
  const std::string fresh = scratch.file("fresh");
  bad = merge({checkpoint, fresh, "--max-shard-size", "1KB", "--tag", "nope"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_FALSE(fs::exists(fresh));
  for (const std::string& name : fs::list_directory(scratch.path())) {
    EXPECT_EQ(name.find(".tmp-merge-"), std::string::npos);
  }
}

}  // namespace
}  // namespace tandem
