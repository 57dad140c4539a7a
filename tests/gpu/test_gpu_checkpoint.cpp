// 4.6 Checkpoints on CUDA: training N steps straight equals training k steps,
// saving, building everything again, loading and training the rest, bit for
// bit: parameters, and the CUDA generator's state, which dropout on the GPU
// draws from every step (so a resume that lost it would diverge at once).
// fp16 loss scaling (its scale and growth tracker) and the loader's position
// are in the checkpoint too. One rank: two rank threads on one GPU would
// share its one CUDA generator in a racy order.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "support/scratch_dir.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/comm/process_group.h"

namespace tandem {
namespace gpu_checkpoint_test {

struct DropoutNetImpl : torch::nn::Module {
  DropoutNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(12, 40));
    drop = register_module("drop", torch::nn::Dropout(0.3));
    fc2 = register_module("fc2", torch::nn::Linear(40, 5));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(drop(torch::relu(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(DropoutNet);

struct Segment {
  int stage = 0;
  int64_t stop_at = 7;
  int64_t save_at = -1;
  bool resume = false;
  bool load_rng = true;
};

struct Outcome {
  std::map<std::string, at::Tensor> params;
  at::Tensor cuda_rng;
  double loss_scale = 0;
};

Outcome train(const Segment& run, const std::string& dir) {
  Config config;
  config.mixed_precision = MixedPrecision::kFp16;
  config.zero.stage = run.stage;
  auto gen = at::detail::createCPUGenerator(9);
  const auto x = torch::randn({40, 12}, gen);
  const auto y = torch::randint(0, 5, {40}, gen);
  Accelerator accelerator(ProcessGroup::local(), config);
  accelerator.set_seed(1234);  // CPU and CUDA generators
  DropoutNet model;
  auto adamw = std::make_shared<torch::optim::AdamW>(model->parameters(),
                                                     torch::optim::AdamWOptions(1e-2));
  accelerator.prepare_model(model);
  DistributedLoaderOptions options;
  options.batch_size = 8;  // 5 batches an epoch: step 3 ends mid-epoch
  options.seed = 5;
  auto loader = accelerator.prepare_data_loader({x, y}, options);
  auto optimizer = accelerator.prepare_optimizer(adamw);
  if (run.resume) {
    LoadStateOptions load;
    load.load_rng_states = run.load_rng;
    accelerator.load_state(dir, load);
  }
  for (int64_t epoch = loader->epoch(); accelerator.step() < run.stop_at; ++epoch) {
    loader->set_epoch(epoch);
    for (auto& batch : *loader) {
      EXPECT_TRUE(batch[0].is_cuda());
      optimizer->zero_grad();
      torch::Tensor loss;
      {
        auto autocast = accelerator.autocast();
        loss = torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
      }
      accelerator.backward(loss);
      optimizer->step();
      if (accelerator.step() == run.save_at) accelerator.save_state(dir);
      if (accelerator.step() >= run.stop_at) break;
    }
  }
  Outcome out;
  for (const auto& p : model->named_parameters()) out.params[p.key()] = p.value().cpu().clone();
  out.cuda_rng =
      at::globalContext().defaultGenerator(accelerator.device()).get_state().clone();
  out.loss_scale = accelerator.loss_scale();
  return out;
}

TEST(GpuCheckpoint, SaveAndResumeOnCudaAreBitExactWithTheCudaRngState) {
  TANDEM_REQUIRE_CUDA();
  for (int stage : {0, 2}) {
    testing::ScratchDir dir;
    Segment straight;
    straight.stage = stage;
    const Outcome a = train(straight, "");
    Segment first = straight;
    first.stop_at = 3;
    first.save_at = 3;
    train(first, dir.path());
    Segment second = straight;
    second.resume = true;
    const Outcome b = train(second, dir.path());
    for (const auto& [name, value] : a.params) {
      EXPECT_TRUE(torch::equal(value, b.params.at(name))) << "stage " << stage << ": " << name;
    }
    EXPECT_TRUE(torch::equal(a.cuda_rng, b.cuda_rng)) << "stage " << stage << ": CUDA RNG state";
    EXPECT_EQ(a.loss_scale, b.loss_scale) << "stage " << stage;
    // The generator states matter: the same resume without them diverges.
    Segment without_rng = second;
    without_rng.load_rng = false;
    const Outcome c = train(without_rng, dir.path());
    bool differs = false;
    for (const auto& [name, value] : a.params) differs |= !torch::equal(value, c.params.at(name));
    EXPECT_TRUE(differs) << "stage " << stage << ": dropout did not use the CUDA generator";
  }
}

}  // namespace gpu_checkpoint_test
}  // namespace tandem
