// Pretrained weights straight into ZeRO shards: a stage-3 model loaded with
// load_safetensors_into_shards from a consolidated file or a Hugging Face
// sharded set equals the same model loaded whole by load_safetensors, then
// trains like it; each rank reads exactly the bytes of its shards (plus the
// frozen parameters and buffers, whole), and no rank allocates a whole
// sharded tensor on the way.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include <torch/torch.h>

#include "core/torch_internals.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "support/tied_model.h"
#include "tandem/checkpoint/module_weights.h"
#include "tandem/checkpoint/safetensors_set.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/zero/init.h"
#include "tandem/zero/zero_weights.h"

namespace tandem {
// Named after the file: its helpers share a unity batch with other areas'.
namespace zero_pretrained {
namespace {

using testing::run_ranks;
using testing::ScratchDir;
using testing::TiedLmOptions;
using Tensors = std::map<std::string, torch::Tensor>;

// The tied LM of the ZeRO tests (embedding tied to the head, Sharded
// blocks, odd sizes), plus what users' models also have: a buffer and a
// frozen parameter, both outside ZeRO's management.
struct PretrainedLmImpl : torch::nn::Module {
  explicit PretrainedLmImpl(const TiedLmOptions& o) {
    lm = register_module("lm", testing::TiedLm(o));
    scale = register_buffer("scale", torch::rand({o.vocab}) + 0.5);
    offset = register_parameter("offset", torch::randn({o.vocab}) * 0.1, /*requires_grad=*/false);
  }
  torch::Tensor forward(const torch::Tensor& ids) { return lm->forward(ids) * scale + offset; }
  testing::TiedLm lm{nullptr};
  torch::Tensor scale, offset;
};
TORCH_MODULE(PretrainedLm);

// Initialisation draws from the global generator: build models before the
// rank threads start, one at a time.
PretrainedLm make_lm(uint64_t seed, const TiedLmOptions& o = {}) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(seed);
  return PretrainedLm(o);
}

// Parameters and buffers: what a load must fill.
Tensors snapshot(const torch::nn::Module& model) { return testing::snapshot(model, true); }

::testing::AssertionResult same(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " vs " << b.size();
  for (const auto& [name, t] : b) {
    if (!a.count(name)) return ::testing::AssertionFailure() << name << " missing";
    if (!torch::equal(a.at(name), t)) return ::testing::AssertionFailure() << name << " differs";
  }
  return ::testing::AssertionSuccess();
}

double max_relative_diff(const Tensors& a, const Tensors& b) {
  double worst = 0;
  for (const auto& [name, ref] : b) {
    auto err = (a.at(name) - ref).abs() / ref.abs().clamp_min(1e-3);
    worst = std::max(worst, err.max().item<double>());
  }
  return worst;
}

// The "pretrained" weights: another seed's model, as save_safetensors writes
// it (the tied weight once).
std::vector<std::pair<std::string, torch::Tensor>> pretrained_tensors(const TiedLmOptions& o) {
  ScratchDir scratch;
  save_safetensors(*make_lm(7, o), scratch.file("w.safetensors"));
  SafetensorsReader reader(scratch.file("w.safetensors"));
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& entry : reader.entries()) out.emplace_back(entry.name, reader.read(entry.name));
  return out;
}

std::string write_file(const ScratchDir& dir, const TiedLmOptions& o = {}) {
  const std::string path = dir.file("model.safetensors");
  write_safetensors(path, pretrained_tensors(o));
  return path;
}

// A Hugging Face sharded set of three or more files; returns the directory.
std::string write_set(const ScratchDir& dir, const TiedLmOptions& o = {}) {
  const auto tensors = pretrained_tensors(o);
  std::vector<int64_t> bytes;
  int64_t total = 0;
  for (const auto& [name, t] : tensors) {
    bytes.push_back(t.numel() * static_cast<int64_t>(t.element_size()));
    total += bytes.back();
  }
  const auto shards = plan_safetensors_shards(bytes, total / 3);
  EXPECT_GE(shards.size(), 3u);
  std::map<std::string, std::string> weight_map;
  for (std::size_t k = 0; k < shards.size(); ++k) {
    const std::string file =
        safetensors_shard_file_name(static_cast<int>(k + 1), static_cast<int>(shards.size()));
    std::vector<std::pair<std::string, torch::Tensor>> part;
    for (std::size_t i : shards[k]) {
      part.push_back(tensors[i]);
      weight_map[tensors[i].first] = file;
    }
    write_safetensors(dir.file(file), part);
  }
  std::FILE* f = std::fopen(dir.file(kSafetensorsIndexName).c_str(), "w");
  std::fputs(safetensors_index_json(weight_map, total).c_str(), f);
  std::fclose(f);
  return dir.path();
}

constexpr int kSteps = 3;
constexpr int kGlobalBatch = 6;  // splits evenly over 1, 2 and 3 ranks

// Each tensor once: LibTorch's parameters() lists the tied one twice.
std::vector<torch::Tensor> trainable(PretrainedLm& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : unique_parameters(*model)) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

// The reference: one whole model loaded by load_safetensors, trained on
// the global batch.
std::pair<Tensors, Tensors> reference(const std::string& path, const TiedLmOptions& o) {
  PretrainedLm model = make_lm(1, o);
  load_safetensors(*model, path);
  const Tensors loaded = snapshot(*model);
  torch::optim::AdamW adamw(trainable(model), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    adamw.zero_grad();
    auto [ids, targets] = testing::tied_lm_batch(o, step, kGlobalBatch);
    torch::nn::functional::cross_entropy(model->forward(ids), targets).backward();
    adamw.step();
  }
  return {loaded, snapshot(*model)};
}

struct RankOutcome {
  Tensors loaded, trained;
  int64_t bytes_read = 0;
  int64_t shard_and_whole_bytes = 0;  // what this rank should read
  int64_t parameter_bytes_before = 0, parameter_bytes_after = 0;
};

// Runs fn(pg, model, zero) on `world` rank threads, each with its own model
// (built before the threads start, in `dtype`) sharded by ZeRO `stage`
// under AdamW.
void run_zero(int world, const TiedLmOptions& o, int stage,
              const std::function<void(ProcessGroup&, PretrainedLm&, ZeroOptimizer&)>& fn,
              torch::ScalarType dtype = torch::kFloat) {
  std::vector<PretrainedLm> models;
  for (int r = 0; r < world; ++r) {
    models.push_back(make_lm(1, o));
    models.back()->to(dtype);
  }
  run_ranks(world, [&](ProcessGroup& pg) {
    PretrainedLm& model = models[pg.rank()];
    torch::optim::AdamW adamw(trainable(model), torch::optim::AdamWOptions(1e-2));
    ZeroOptions options;
    options.stage = stage;
    ZeroOptimizer zero(model, adamw, pg.shared_from_this(), options);
    fn(pg, model, zero);
  });
}

std::vector<RankOutcome> load_and_train_zero(int world, const std::string& path,
                                             const TiedLmOptions& o, int stage = 3) {
  std::vector<RankOutcome> out(world);
  run_zero(world, o, stage, [&](ProcessGroup& pg, PretrainedLm& model, ZeroOptimizer& zero) {
    RankOutcome& mine = out[pg.rank()];
    mine.parameter_bytes_before = zero.memory_stats().parameter_bytes;
    const LoadSafetensorsResult result = load_safetensors_into_shards(zero, path);
    mine.parameter_bytes_after = zero.memory_stats().parameter_bytes;
    mine.bytes_read = result.bytes_read;
    for (const auto& f : zero.shard_fragments()) mine.shard_and_whole_bytes += f.value.numel() * 4;
    mine.shard_and_whole_bytes += (model->scale.numel() + model->offset.numel()) * 4;
    {
      ZeroOptimizer::GatheredParameters whole(zero);
      mine.loaded = snapshot(*model);
    }
    for (int step = 0; step < kSteps; ++step) {
      zero.zero_grad();
      auto [ids, targets] = testing::tied_lm_batch(o, step, kGlobalBatch);
      const int64_t per = kGlobalBatch / pg.world_size();
      ids = ids.narrow(0, pg.rank() * per, per);
      targets = targets.view({kGlobalBatch, -1}).narrow(0, pg.rank() * per, per).reshape({-1});
      torch::nn::functional::cross_entropy(model->forward(ids), targets).backward();
      zero.step();
    }
    ZeroOptimizer::GatheredParameters whole(zero);
    mine.trained = snapshot(*model);
  });
  return out;
}

using PretrainedCase = std::tuple<int /*world*/, bool /*sharded set*/, bool /*head in unit*/>;

class ZeroPretrained : public ::testing::TestWithParam<PretrainedCase> {};

TEST_P(ZeroPretrained, Stage3LoadEqualsPlainLoadReadsOnlyItsShardsAndTrainsTheSame) {
  const auto [world, sharded_set, head_in_unit] = GetParam();
  TiedLmOptions o;
  o.head_in_unit = head_in_unit;
  ScratchDir dir;
  const std::string path = sharded_set ? write_set(dir, o) : write_file(dir, o);
  const auto [loaded, trained] = reference(path, o);
  // The load changed the model at all (a fresh model has other values).
  ASSERT_GT(max_relative_diff(snapshot(*make_lm(1, o)), loaded), 0.1);

  const std::vector<RankOutcome> got = load_and_train_zero(world, path, o);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(world));
    EXPECT_TRUE(same(got[r].loaded, loaded));
    EXPECT_LT(max_relative_diff(got[r].trained, trained), 1e-5);
    // Exactly its shard of every parameter ZeRO manages, and the frozen
    // parameter and the buffer whole.
    EXPECT_EQ(got[r].bytes_read, got[r].shard_and_whole_bytes);
    EXPECT_EQ(got[r].parameter_bytes_after, got[r].parameter_bytes_before);
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldsSources, ZeroPretrained,
    ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool(), ::testing::Bool()),
    [](const ::testing::TestParamInfo<PretrainedCase>& info) {
      return "World" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) ? "ShardedSet" : "OneFile") +
             (std::get<2>(info.param) ? "TieAcrossUnits" : "");
    });

// The flow for a model no rank can hold: built under zero::Init (each unit
// cut as it is built), adopted by stage 3, then the pretrained set read
// straight into the shards.
TEST(ZeroPretrained, AModelBuiltUnderZeroInitLoadsIntoItsShards) {
  TiedLmOptions o;
  ScratchDir dir;
  const std::string path = write_set(dir, o);
  const Tensors loaded = reference(path, o).first;
  std::mutex build;
  run_ranks(3, [&](ProcessGroup& pg) {
    std::optional<PretrainedLm> model;
    {
      std::lock_guard<std::mutex> lock(build);
      torch::manual_seed(1);
      zero::Init init(pg);
      model.emplace(o);
      EXPECT_EQ(init.units_cut(), o.depth);
    }
    torch::optim::AdamW adamw(trainable(*model), torch::optim::AdamWOptions(1e-2));
    ZeroOptions options;
    options.stage = 3;
    ZeroOptimizer zero(*model, adamw, pg.shared_from_this(), options);
    load_safetensors_into_shards(zero, path);
    ZeroOptimizer::GatheredParameters whole(zero);
    EXPECT_TRUE(same(snapshot(**model), loaded));
  });
}

TEST(ZeroPretrained, EachRankReadsAboutOneNthOfTheShardedBytes) {
  TiedLmOptions o;
  o.dim = 61;  // blocks dominate the model; 61x61 splits inside tensors
  ScratchDir dir;
  const std::string path = write_file(dir, o);
  int64_t file_bytes = 0;
  {
    SafetensorsReader reader(path);
    for (const auto& e : reader.entries()) file_bytes += e.data_end - e.data_begin;
  }
  const int64_t whole = 2 * o.vocab * 4;  // the buffer and the frozen parameter
  for (int world : {2, 3}) {
    for (const auto& rank : load_and_train_zero(world, path, o)) {
      const double share = static_cast<double>(rank.bytes_read - whole) / (file_bytes - whole);
      EXPECT_NEAR(share, 1.0 / world, 0.01) << "world " << world;
    }
  }
}

// A bf16 model keeps fp32 master shards: an fp32 file goes into them at full
// precision, and the bf16 parameters get its rounding.
TEST(ZeroPretrained, Bf16ModelTakesAnFp32FileIntoItsMastersAtFullPrecision) {
  TiedLmOptions o;
  ScratchDir dir;
  const std::string path = write_file(dir, o);
  const SafetensorsReader file(path);
  run_zero(
      2, o, 3,
      [&](ProcessGroup&, PretrainedLm&, ZeroOptimizer& zero) {
        load_safetensors_into_shards(zero, path);
        for (const auto& f : zero.shard_fragments()) {
          ASSERT_TRUE(f.master.defined()) << f.name;
          auto expected = torch::empty({f.value.numel()});
          file.read_range_into(f.name, f.begin, expected);
          EXPECT_TRUE(torch::equal(f.master, expected)) << f.name;
          EXPECT_TRUE(torch::equal(f.value, expected.to(torch::kBFloat16))) << f.name;
        }
      },
      torch::kBFloat16);
}

TEST(ZeroPretrained, StagesOneAndTwoLoadThroughTheShardsToo) {
  TiedLmOptions o;
  ScratchDir dir;
  const std::string path = write_set(dir, o);
  const auto [loaded, trained] = reference(path, o);
  for (int stage : {1, 2}) {
    for (const auto& rank : load_and_train_zero(2, path, o, stage)) {
      EXPECT_TRUE(same(rank.loaded, loaded)) << "stage " << stage;
      EXPECT_LT(max_relative_diff(rank.trained, trained), 1e-5) << "stage " << stage;
      EXPECT_EQ(rank.bytes_read, rank.shard_and_whole_bytes) << "stage " << stage;
    }
  }
}

// A CPU allocator (through tandem's internals, the one place allowed to
// replace LibTorch's) that records the largest allocation made while
// `g_recording` is set.
std::atomic<bool> g_recording{false};
std::atomic<std::size_t> g_largest{0};

void* probe_allocate(std::size_t n) {
  if (g_recording.load()) {
    std::size_t seen = g_largest.load();
    while (n > seen && !g_largest.compare_exchange_weak(seen, n)) {
    }
  }
  void* p = nullptr;
  return ::posix_memalign(&p, 64, std::max<std::size_t>(n, 1)) == 0 ? p : nullptr;
}

void probe_free(void* p) { std::free(p); }

TEST(ZeroPretrained, NoRankAllocatesAWholeShardedTensorWhileLoading) {
  TiedLmOptions o;
  o.dim = 64;  // block fc.weight: 16 KiB, the largest tensor by far
  ScratchDir dir;
  const std::string path = write_file(dir, o);
  const std::size_t fc_bytes = static_cast<std::size_t>(o.dim) * o.dim * 4;
  constexpr int kWorld = 2;
  g_largest = 0;
  const internals::InstalledCpuAllocator installed =
      internals::install_cpu_allocator({probe_allocate, probe_free});
  try {
    run_zero(kWorld, o, 3, [&](ProcessGroup& pg, PretrainedLm&, ZeroOptimizer& zero) {
      pg.barrier();
      if (pg.rank() == 0) g_recording = true;
      pg.barrier();
      load_safetensors_into_shards(zero, path);
      pg.barrier();
      if (pg.rank() == 0) g_recording = false;
      pg.barrier();
    });
  } catch (...) {
    internals::restore_cpu_allocator(installed);
    throw;
  }
  internals::restore_cpu_allocator(installed);
  RecordProperty("largest_allocation_bytes", std::to_string(g_largest.load()));
  EXPECT_GT(g_largest.load(), 0u);
  EXPECT_LT(g_largest.load(), fc_bytes / 2 + 1024) << "an allocation of " << g_largest.load()
                                                   << " bytes";
}

TEST(ZeroPretrained, RefusalOnAnyRankLoadsNothingAnywhere) {
  TiedLmOptions o;
  ScratchDir dir;
  auto tensors = pretrained_tensors(o);
  tensors.pop_back();  // one tensor missing: a strict load refuses
  const std::string path = dir.file("partial.safetensors");
  write_safetensors(path, tensors);
  constexpr int kWorld = 2;
  const Tensors before = snapshot(*make_lm(1, o));
  std::vector<std::string> errors(kWorld);
  run_zero(kWorld, o, 3, [&](ProcessGroup& pg, PretrainedLm& model, ZeroOptimizer& zero) {
    try {
      load_safetensors_into_shards(zero, path);
    } catch (const UsageError& e) {
      errors[pg.rank()] = e.what();
    }
    ZeroOptimizer::GatheredParameters whole(zero);
    EXPECT_TRUE(same(snapshot(*model), before));
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("nothing was loaded"), std::string::npos) << e;
    EXPECT_NE(e.find("missing from the file"), std::string::npos) << e;
  }
}

// A file missing on one rank only: every rank throws, and the others name
// that rank once ("[rank 0/2] [rank 1/2] ..."), not with its prefix twice.
TEST(ZeroPretrained, AFailureOnOneRankIsNamedOnceByTheOthers) {
  TiedLmOptions o;
  ScratchDir dir;
  const std::string path = dir.file("model.safetensors");
  write_safetensors(path, pretrained_tensors(o));
  constexpr int kWorld = 2;
  std::vector<std::string> errors(kWorld);
  run_zero(kWorld, o, 3, [&](ProcessGroup& pg, PretrainedLm&, ZeroOptimizer& zero) {
    try {
      load_safetensors_into_shards(zero, pg.rank() == 1 ? dir.file("missing.safetensors") : path);
    } catch (const Error& e) {
      errors[pg.rank()] = e.what();
    }
  });
  ASSERT_FALSE(errors[0].empty());
  EXPECT_EQ(errors[0].rfind("[rank 0/2] [rank 1/2] ", 0), 0u) << errors[0];
  EXPECT_EQ(errors[0].find("[rank 1/2]", 12), std::string::npos) << "named twice: " << errors[0];
  EXPECT_FALSE(errors[1].empty());
}

}  // namespace
}  // namespace zero_pretrained
}  // namespace tandem
