// `tandem checkpoint import DS_DIR OUT_DIR` (tandem::import_deepspeed_checkpoint):
// a checkpoint the real DeepSpeed saved (ZeRO-1, 2 and 3, 2 CPU ranks;
// tests/checkpoint/deepspeed_resume_reference.py) resumes in tandem at
// worlds 1, 2 and 3 and trains to what the Python run continued to. The
// model has odd sizes, a frozen layer and a tied weight; the optimizer is
// AdamW over two param groups with a WarmupLR schedule and clipping, so
// weights, moments, step counts, per-group hyperparameters and the scheduler
// must all carry over. Malformed folders are refused by name
// without Python.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include <torch/torch.h>

#include "checkpoint/safetensors_test_util.h"
#include "support/checkpoint_testing.h"
#include "support/scratch_dir.h"
#include "support/subprocess.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/deepspeed_import.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"
#include "tandem/optim/lr_scheduler.h"
#include "tandem/zero/sharded.h"

namespace tandem {
namespace {

// deepspeed_resume_reference.py's model, with the same names; embed and
// head are ZeRO-3 units (parameters sharded), the rest is the root unit.
struct DsTiedLinearImpl : torch::nn::Module {
  explicit DsTiedLinearImpl(const torch::Tensor& w) { weight = register_parameter("weight", w); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(DsTiedLinear);

struct DsReferenceModelImpl : torch::nn::Module {
  DsReferenceModelImpl() {
    embed = register_module("embed", Sharded<torch::nn::LinearImpl>(5, 7));
    frozen = register_module("frozen", torch::nn::Linear(7, 7));
    hidden = register_module("hidden", torch::nn::Linear(torch::nn::LinearOptions(7, 7).bias(false)));
    tied = register_module("tied", DsTiedLinear(hidden->weight));
    head = register_module("head", Sharded<torch::nn::LinearImpl>(7, 3));
    for (auto& p : frozen->parameters()) p.requires_grad_(false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(embed->forward(x));
    h = torch::tanh(frozen(h));
    h = torch::relu(hidden(h));
    h = torch::tanh(tied(h));
    return head->forward(h);
  }
  Sharded<torch::nn::LinearImpl> embed{nullptr}, head{nullptr};
  torch::nn::Linear frozen{nullptr}, hidden{nullptr};
  DsTiedLinear tied{nullptr};
};
TORCH_MODULE(DsReferenceModel);

constexpr int kSavedAt = 3;  // the reference's SAVE_AT
constexpr int kSteps = 8;    // and STEPS
// bf16 runs: measured 2026-11-28, losses within 5.2e-3 and parameters within
// 2e-3 (one bf16 step at their size) of DeepSpeed's; twice that, rounded up.
constexpr double kBf16Tolerance = 1e-2;

struct ResumeResult {
  std::map<std::string, at::Tensor> params;  // rank 0's whole parameters
  std::vector<double> losses;                // global mean loss of each step after the load
  nlohmann::json client_state;
};

// Loads `imported` at `world` ranks (ZeRO `stage`) and trains the remaining
// steps on the reference's batches: rank r takes its 6/world rows.
// With `bf16` the model's parameters are bf16 (fp32 masters in the
// optimizer), as DeepSpeed's bf16 mode trains; with `resave_to` every rank
// saves right after the load, before training; with `sgd` the optimizer is
// the reference's torch SGD with momentum instead of AdamW.
ResumeResult resume_imported(const std::string& imported, const std::string& data, int world,
                             int stage, bool bf16 = false, const std::string& resave_to = "",
                             bool sgd = false) {
  SafetensorsReader batches(data);
  const at::Tensor xs = batches.read("x");
  const at::Tensor ys = batches.read("y");
  Config config;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;  // tiny model: shard all
  config.gradient_clipping = 0.2;  // the reference's, below its gradients' norms
  AcceleratorOptions options;
  options.step_scheduler_with_optimizer = false;  // DeepSpeed steps it once per step
  ResumeResult result;
  std::mutex mutex;
  testing::run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config, options);
    DsReferenceModel model;
    if (bf16) model->to(at::kBFloat16);
    // Each tensor once, as Python's parameters(); biases in a second group
    // without weight decay, as the reference (and HF scripts) build them.
    std::vector<at::Tensor> decay, no_decay;
    for (const auto& item : model->named_parameters()) {
      const at::Tensor& p = item.value();
      auto same = [&](const at::Tensor& t) { return t.is_same(p); };
      if (!p.requires_grad() || std::any_of(decay.begin(), decay.end(), same)) continue;
      const std::string& name = item.key();
      (name.size() > 4 && name.substr(name.size() - 4) == "bias" ? no_decay : decay).push_back(p);
    }
    const auto options =
        torch::optim::AdamWOptions(1e-2).betas({0.8, 0.95}).eps(1e-7).weight_decay(0.05);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options));
    auto no_decay_options = std::make_unique<torch::optim::AdamWOptions>(options);
    no_decay_options->weight_decay(0.0);
    groups.emplace_back(no_decay, std::move(no_decay_options));
    std::shared_ptr<torch::optim::Optimizer> base;
    if (sgd) {
      const auto sgd_options = torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(0.05);
      std::vector<torch::optim::OptimizerParamGroup> sgd_groups;
      sgd_groups.emplace_back(decay, std::make_unique<torch::optim::SGDOptions>(sgd_options));
      auto no_decay_sgd = std::make_unique<torch::optim::SGDOptions>(sgd_options);
      no_decay_sgd->weight_decay(0.0);
      sgd_groups.emplace_back(no_decay, std::move(no_decay_sgd));
      base = std::make_shared<torch::optim::SGD>(std::move(sgd_groups), sgd_options);
    } else {
      base = std::make_shared<torch::optim::AdamW>(std::move(groups), options);
    }
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(base);
    WarmupLROptions warmup;
    warmup.warmup_min_lr = 1e-3;
    warmup.warmup_max_lr = 2e-2;
    warmup.warmup_num_steps = 5;
    warmup.warmup_type = WarmupType::kLinear;
    auto scheduler =
        accelerator.prepare_scheduler(std::make_shared<WarmupLR>(*optimizer, warmup));
    const nlohmann::json client = accelerator.load_state(imported);
    EXPECT_EQ(accelerator.step(), kSavedAt);
    if (!resave_to.empty()) accelerator.save_state(resave_to);
    const int64_t rows = 6 / world;
    std::vector<double> losses;
    for (int step = kSavedAt; step < kSteps; ++step) {
      auto x = xs[step].narrow(0, pg.rank() * rows, rows);
      if (bf16) x = x.to(at::kBFloat16);
      const auto y = ys[step].narrow(0, pg.rank() * rows, rows);
      optimizer->zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      accelerator.backward(loss);
      optimizer->step();
      scheduler->step();
      at::Tensor mean = loss.detach().to(at::kFloat);
      pg.all_reduce(mean);
      losses.push_back(mean.item<double>() / world);
    }
    auto state = accelerator.get_state_dict();
    if (pg.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto& [name, t] : state) result.params[name] = t;
      result.losses = losses;
      result.client_state = client;
    }
  });
  return result;
}

void expect_matches_python(const ResumeResult& got, const std::string& continued,
                           const std::string& what, double tolerance = 1e-5) {
  SafetensorsReader reference(continued);
  const at::Tensor losses = reference.read("losses");
  ASSERT_EQ(static_cast<int64_t>(got.losses.size()), kSteps - kSavedAt) << what;
  for (int i = 0; i < kSteps - kSavedAt; ++i) {
    EXPECT_NEAR(got.losses[i], losses[kSavedAt + i].item<double>(), tolerance)
        << what << ": loss of step " << kSavedAt + i + 1;
  }
  int compared = 0;
  for (const auto& entry : reference.entries()) {
    if (entry.name == "losses") continue;
    auto it = got.params.find(entry.name);
    ASSERT_NE(it, got.params.end()) << what << ": no parameter " << entry.name;
    const at::Tensor want = reference.read(entry.name);
    const double diff = (it->second.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
    EXPECT_LE(diff, tolerance) << what << ": " << entry.name;
    ++compared;
  }
  EXPECT_EQ(compared, 7) << what;  // 5 trainable (one tied) and 2 frozen
  EXPECT_EQ(got.client_state, nlohmann::json({{"epoch", 4}, {"best", 0.25}})) << what;
}

TEST(DeepSpeedImportInterop, Zero1To3CheckpointsResumeAtWorlds1To3LikePython) {
  if (!testing::peer_can_import("deepspeed")) GTEST_SKIP() << "no deepspeed in the peer";
  for (int stage : {1, 2, 3}) {
    std::string output;
    const testing::ScratchDir* reference = testing::deepspeed_reference_run(stage, output);
    ASSERT_NE(reference, nullptr) << output;
    const testing::ScratchDir& ref = *reference;
    testing::ScratchDir dir;  // what the import writes
    // The command line says what it carried over.
    const auto cli = testing::run_process(
        {testing::bin("tandem"), "checkpoint", "import", ref / "ds", dir / "by_cli"}, 120);
    EXPECT_EQ(cli.exit_code, 0) << cli.err;
    EXPECT_NE(cli.out.find("imported DeepSpeed ZeRO-" + std::to_string(stage) +
                           " checkpoint"),
              std::string::npos)
        << cli.out;
    EXPECT_NE(cli.out.find("7 parameters (2 frozen), AdamW state [exp_avg, exp_avg_sq], "
                           "scheduler"),
              std::string::npos)
        << cli.out;
    EXPECT_TRUE(fs::is_regular_file(dir / "by_cli/global_step3/meta.json"));
    const DeepSpeedImportResult r = import_deepspeed_checkpoint(ref / "ds", dir / "imported");
    EXPECT_EQ(r.zero_stage, stage);
    EXPECT_EQ(r.world_size, 2);
    EXPECT_EQ(r.step, kSavedAt);
    EXPECT_EQ(r.parameters, 7);
    EXPECT_EQ(r.frozen, 2);
    EXPECT_EQ(r.optimizer_type, "AdamW");
    EXPECT_EQ(r.optimizer_states, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
    EXPECT_TRUE(r.scheduler);
    for (int world : {1, 2, 3}) {
      const std::string what = "ZeRO-" + std::to_string(stage) + " at world " +
                               std::to_string(world);
      expect_matches_python(resume_imported(dir / "imported", ref / "data.safetensors", world,
                                            world == 1 ? 0 : stage),
                            ref / "continued.safetensors", what);
    }
  }
}

// Saved by 3 DeepSpeed ranks (odd partitions: ZeRO-2 aligns its flat groups
// to 2 x world, ZeRO-3 pads each parameter to a multiple of 3), resumed at
// worlds 1, 2 and 3.
TEST(DeepSpeedImportInterop, CheckpointsOf3RanksResumeAtWorlds1To3LikePython) {
  if (!testing::peer_can_import("deepspeed")) GTEST_SKIP() << "no deepspeed in the peer";
  for (int stage : {2, 3}) {
    std::string output;
    const testing::ScratchDir* reference = testing::deepspeed_reference_run(stage, output, 3);
    ASSERT_NE(reference, nullptr) << output;
    const testing::ScratchDir& dir = *reference;
    testing::ScratchDir out;
    const DeepSpeedImportResult r = import_deepspeed_checkpoint(dir / "ds", out / "imported");
    EXPECT_EQ(r.world_size, 3);
    EXPECT_EQ(r.zero_stage, stage);
    for (int world : {1, 2, 3}) {
      expect_matches_python(resume_imported(out / "imported", dir / "data.safetensors", world,
                                            world == 1 ? 0 : stage),
                            dir / "continued.safetensors",
                            "ZeRO-" + std::to_string(stage) + " of 3 ranks at world " +
                                std::to_string(world));
    }
  }
}

// bf16: the module's bf16 weights and the fp32 masters both carry over. A
// run that loads the import and saves again at once (ZeRO-2 at worlds 2 and
// 3) holds exactly the imported masters, moments and weights; training on
// from there follows DeepSpeed's bf16 run as closely as bf16 arithmetic
// allows (different kernels and reduction orders round differently).
TEST(DeepSpeedImportInterop, Bf16CheckpointsKeepTheirFp32Masters) {
  if (!testing::peer_can_import("deepspeed")) GTEST_SKIP() << "no deepspeed in the peer";
  std::string output;
  const testing::ScratchDir* reference =
      testing::deepspeed_reference_run(2, output, 2, "bf16");
  ASSERT_NE(reference, nullptr) << output;
  const testing::ScratchDir& ref = *reference;
  testing::ScratchDir dir;  // what the import writes
  import_deepspeed_checkpoint(ref / "ds", dir / "imported");
  const auto imported = testing::consolidated(dir / "imported");
  ASSERT_TRUE(imported.count("master/embed.weight"));
  EXPECT_EQ(imported.at("model/embed.weight").scalar_type(), at::kBFloat16);
  EXPECT_TRUE(torch::equal(imported.at("model/embed.weight"),
                           imported.at("master/embed.weight").to(at::kBFloat16)));
  for (int world : {2, 3}) {
    testing::ScratchDir resaved;
    const ResumeResult r = resume_imported(dir / "imported", ref / "data.safetensors", world, 2,
                                           /*bf16=*/true, resaved.path());
    EXPECT_TRUE(testing::same_tensors(testing::consolidated(resaved.path()), imported))
        << "world " << world;
    expect_matches_python(r, ref / "continued.safetensors", "bf16 at world " +
                                                               std::to_string(world),
                          kBf16Tolerance);
  }
}

// The program's own torch.optim.SGD with momentum (DeepSpeed's
// zero_allow_untested_optimizer): SGD keeps no step count, so the momentum
// buffers must carry over by the real steps taken. Resumed under DDP, and
// under ZeRO-1 and 2, whose shards restart a momentum loaded at step 0.
TEST(DeepSpeedImportInterop, AClientSgdCheckpointKeepsItsMomentumUnderEveryStrategy) {
  if (!testing::peer_can_import("deepspeed")) GTEST_SKIP() << "no deepspeed in the peer";
  std::string output;
  const testing::ScratchDir* reference = testing::deepspeed_reference_run(2, output, 2, "sgd");
  ASSERT_NE(reference, nullptr) << output;
  const testing::ScratchDir& ref = *reference;
  testing::ScratchDir dir;
  const DeepSpeedImportResult r = import_deepspeed_checkpoint(ref / "ds", dir / "imported");
  EXPECT_EQ(r.optimizer_states, (std::vector<std::string>{"momentum_buffer"}));
  for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{2, 0}, {2, 1}, {2, 2},
                                                                      {3, 2}, {1, 0}}) {
    expect_matches_python(resume_imported(dir / "imported", ref / "data.safetensors", world,
                                          stage, /*bf16=*/false, "", /*sgd=*/true),
                          ref / "continued.safetensors",
                          "SGD at world " + std::to_string(world) + ", ZeRO-" +
                              std::to_string(stage));
  }
}

// ---- refusals, on hand-made folders -----------------------------------------

std::string import_error(const std::string& source, const std::string& out) {
  try {
    import_deepspeed_checkpoint(source, out);
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find(".cpp:"), std::string::npos) << "a source location: " << what;
    return what;
  }
  return "";
}

void touch(const std::string& path) { std::ofstream(path) << "not a checkpoint"; }

TEST(DeepSpeedImport, AFolderWithoutLatestAsksForTheTag) {
  testing::ScratchDir dir;
  fs::create_directories(dir / "global_step5");
  touch(dir / "global_step5/mp_rank_00_model_states.pt");
  EXPECT_TRUE(is_deepspeed_checkpoint(dir.path()));
  const std::string error = import_error(dir.path(), dir / "out");
  EXPECT_NE(error.find("no 'latest' file"), std::string::npos) << error;
  EXPECT_NE(error.find("--tag"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir / "out")) << "nothing is written";
}

TEST(DeepSpeedImport, TensorAndPipelineParallelFoldersAreRefusedByName) {
  testing::ScratchDir dir;
  std::ofstream(dir / "latest") << "global_step5\n";
  fs::create_directories(dir / "global_step5");
  touch(dir / "global_step5/zero_pp_rank_0_mp_rank_01_optim_states.pt");
  std::string error = import_error(dir.path(), dir / "out");
  EXPECT_NE(error.find("tensor-parallel rank 01"), std::string::npos) << error;
  fs::remove(dir / "global_step5/zero_pp_rank_0_mp_rank_01_optim_states.pt");
  touch(dir / "global_step5/layer_01-model_states.pt");
  error = import_error(dir.path(), dir / "out");
  EXPECT_NE(error.find("pipeline-parallel"), std::string::npos) << error;
}

TEST(DeepSpeedImport, ACheckpointWithoutZeroOrWithAMissingRankIsRefused) {
  testing::ScratchDir dir;
  std::ofstream(dir / "latest") << "global_step5\n";
  fs::create_directories(dir / "global_step5");
  touch(dir / "global_step5/mp_rank_00_model_states.pt");
  std::string error = import_error(dir.path(), dir / "out");
  EXPECT_NE(error.find("saved without ZeRO"), std::string::npos) << error;
  EXPECT_NE(error.find("mp_rank_00_model_states.pt OUT.safetensors"), std::string::npos) << error;
  touch(dir / "global_step5/zero_pp_rank_1_mp_rank_00_optim_states.pt");
  error = import_error(dir.path(), dir / "out");
  EXPECT_NE(error.find("lacks the optimizer states of data-parallel rank 0"), std::string::npos)
      << error;
  touch(dir / "global_step5/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  error = import_error(dir.path(), dir / "out");  // now the files themselves are read
  EXPECT_NE(error.find("not a torch.save archive"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(DeepSpeedImport, TheFolderOnlyFlagsAreRefusedForATorchSaveFile) {
  testing::ScratchDir dir;
  touch(dir / "model.pt");
  const auto cli = testing::run_process({testing::bin("tandem"), "checkpoint", "import",
                                         dir / "model.pt", dir / "out.safetensors", "--tag",
                                         "global_step3"},
                                        60);
  EXPECT_EQ(cli.exit_code, 2);
  EXPECT_NE(cli.err.find("--tag and --optimizer-type apply to a DeepSpeed checkpoint folder"),
            std::string::npos)
      << cli.err;
  EXPECT_FALSE(fs::exists(dir / "out.safetensors"));
}

TEST(DeepSpeedImport, ALatestNamingNoFolderIsRefused) {
  testing::ScratchDir dir;
  std::ofstream(dir / "latest") << "global_step9\n";
  const std::string error = import_error(dir.path(), dir / "out");
  EXPECT_NE(error.find("no checkpoint 'global_step9'"), std::string::npos) << error;
}

}  // namespace
}  // namespace tandem
