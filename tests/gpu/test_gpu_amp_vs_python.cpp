// 4.3 Mixed precision against Python on the same GPU: CUDA autocast bf16, and
// fp16 with dynamic loss scaling, through the Accelerator, against
// torch.autocast + torch.amp.GradScaler (tests/gpu/amp_reference.py) with the
// same model, weights and batches for 200 steps. The fp16 scaler starts at
// 2^24 and grows every 25 clean steps, so the run backs off, grows and
// overflows again many times. The scale and skip sequences must be
// identical, and every loss within 1e-5 relative: both sides run the same
// kernels in the same order, and SGD with momentum is the same arithmetic
// in LibTorch's C++ optimizer and Python's single-tensor loop.

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "support/scratch_dir.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/comm/process_group.h"

namespace tandem {
namespace gpu_amp_test {

constexpr int kSteps = 200, kBatches = 10, kBatch = 64, kIn = 32, kHidden = 64, kOut = 16;
constexpr int kInitScalePower = 24, kGrowthInterval = 25;
constexpr double kLr = 0.05;

struct ThreeLayersImpl : torch::nn::Module {
  ThreeLayersImpl() {
    fc0 = register_module("fc0", torch::nn::Linear(kIn, kHidden));
    fc1 = register_module("fc1", torch::nn::Linear(kHidden, kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kOut));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc2(torch::relu(fc1(torch::relu(fc0(x)))));
  }
  torch::nn::Linear fc0{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(ThreeLayers);

struct Trace {
  std::vector<double> loss, scale;
  std::vector<bool> skipped;
};

// The model's initial weights and the batches, for both sides.
struct AmpInputs {
  ThreeLayers init;
  torch::Tensor x, y;
};

AmpInputs make_inputs() {
  auto gen = at::detail::createCPUGenerator(2026);
  AmpInputs s;
  {
    torch::manual_seed(11);
    s.init = ThreeLayers();
  }
  s.x = torch::randn({kBatches, kBatch, kIn}, gen);
  s.y = 4 * torch::randn({kBatches, kBatch, kOut}, gen);  // large targets: large gradients
  return s;
}

Trace train_tandem(const AmpInputs& s, MixedPrecision precision) {
  Config config;
  config.mixed_precision = precision;
  config.fp16.initial_scale_power = kInitScalePower;
  config.fp16.loss_scale_window = kGrowthInterval;
  Accelerator accelerator(ProcessGroup::local(), config);
  EXPECT_TRUE(accelerator.device().is_cuda());
  ThreeLayers model;
  {
    torch::NoGradGuard no_grad;
    auto from = s.init->named_parameters();
    for (auto& p : model->named_parameters()) p.value().copy_(from[p.key()]);
  }
  auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                 torch::optim::SGDOptions(kLr).momentum(0.9));
  accelerator.prepare_model(model);
  auto optimizer = accelerator.prepare_optimizer(sgd);
  const auto x = s.x.to(accelerator.device()), y = s.y.to(accelerator.device());
  Trace t;
  for (int step = 0; step < kSteps; ++step) {
    const double scale = precision == MixedPrecision::kFp16 ? accelerator.loss_scale() : 1.0;
    optimizer->zero_grad();
    torch::Tensor loss;
    {
      auto autocast = accelerator.autocast();
      loss = torch::mse_loss(model->forward(x[step % kBatches]), y[step % kBatches]);
    }
    accelerator.backward(loss);
    optimizer->step();
    t.loss.push_back(loss.item<double>());
    t.scale.push_back(scale);
    t.skipped.push_back(optimizer->step_was_skipped());
  }
  return t;
}

Trace train_python(const AmpInputs& s, const std::string& precision, const std::string& dir) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& p : s.init->named_parameters()) tensors.emplace_back(p.key(), p.value());
  tensors.emplace_back("x", s.x);
  tensors.emplace_back("y", s.y);
  const std::string file = dir + "/amp_inputs.safetensors";
  write_safetensors(file, tensors);
  const std::string command =
      std::string(TANDEM_PEER_PYTHON) + " " + TANDEM_SOURCE_DIR + "/tests/gpu/amp_reference.py " +
      file + " --precision " + precision + " --steps " + std::to_string(kSteps) +
      " --init-scale-power " + std::to_string(kInitScalePower) + " --growth-interval " +
      std::to_string(kGrowthInterval) + " --lr " + std::to_string(kLr) + " 2>&1";
  std::string output;
  if (std::FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
    EXPECT_EQ(::pclose(pipe), 0) << command << "\n" << output;
  }
  const auto last_line = output.substr(output.rfind('{'));
  const auto json = nlohmann::json::parse(last_line, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(json.is_discarded()) << output;
  Trace t;
  if (json.is_discarded()) return t;
  t.loss = json["loss"].get<std::vector<double>>();
  t.scale = json["scale"].get<std::vector<double>>();
  t.skipped = json["skipped"].get<std::vector<bool>>();
  return t;
}

void compare(const Trace& tandem, const Trace& python, const std::string& precision) {
  ASSERT_EQ(python.loss.size(), static_cast<std::size_t>(kSteps));
  double worst = 0;
  int skips = 0, first_difference = -1;
  for (int s = 0; s < kSteps; ++s) {
    const double rel = std::abs(tandem.loss[s] - python.loss[s]) / std::abs(python.loss[s]);
    worst = std::max(worst, rel);
    skips += tandem.skipped[s];
    if (first_difference < 0 && (tandem.scale[s] != python.scale[s] ||
                                 tandem.skipped[s] != python.skipped[s] || rel > 1e-5)) {
      first_difference = s;
    }
  }
  EXPECT_EQ(tandem.scale, python.scale) << precision;
  EXPECT_EQ(tandem.skipped, python.skipped) << precision;
  EXPECT_LT(worst, 1e-5) << precision << ": first difference at step " << first_difference;
  EXPECT_LT(python.loss.back(), 0.8 * python.loss.front()) << precision << " did not train";
  if (precision == "fp16") {
    EXPECT_GE(skips, 3) << "the run should overflow and back off several times";
  }
  testing::record_gpu_figures("amp_vs_python_" + precision,
                              {{"steps", kSteps},
                               {"max_loss_rel_diff", worst},
                               {"skipped_steps", skips},
                               {"final_scale", tandem.scale.back()},
                               {"first_loss", tandem.loss.front()},
                               {"last_loss", tandem.loss.back()}});
}

TEST(GpuAmpVsPython, Bf16AutocastMatchesTorchAutocast) {
  TANDEM_REQUIRE_CUDA();
  testing::ScratchDir dir;
  const AmpInputs s = make_inputs();
  compare(train_tandem(s, MixedPrecision::kBf16), train_python(s, "bf16", dir.path()), "bf16");
}

TEST(GpuAmpVsPython, Fp16ScaleAndSkipSequencesEqualTorchGradScaler) {
  TANDEM_REQUIRE_CUDA();
  testing::ScratchDir dir;
  const AmpInputs s = make_inputs();
  compare(train_tandem(s, MixedPrecision::kFp16), train_python(s, "fp16", dir.path()), "fp16");
}

}  // namespace gpu_amp_test
}  // namespace tandem
