// A small CNN with BatchNorm, trained by DDP with SyncBatchNorm, equals
// single-process training (plain BatchNorm) on the concatenated batch:
// parameters and running statistics alike.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "tandem/parallel/ddp.h"
#include "tandem/parallel/sync_batch_norm.h"

namespace tandem {
namespace {

using testing::copy_state;
using testing::max_relative_diff;
using testing::run_ranks;

torch::nn::Sequential make_cnn() {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 3).padding(1)), torch::nn::BatchNorm2d(6),
      torch::nn::ReLU(), torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 8, 3).stride(2)),
      torch::nn::BatchNorm2d(8), torch::nn::ReLU(),
      torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions(1)), torch::nn::Flatten(),
      torch::nn::Linear(8, 4));
}

double max_buffer_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  double worst = 0;
  auto bb = b.named_buffers();
  for (const auto& item : a.named_buffers()) {
    auto diff = (item.value().to(torch::kDouble) - bb[item.key()].to(torch::kDouble)).abs();
    worst = std::max(worst, diff.max().item<double>());
  }
  return worst;
}

class DdpCnnParity : public ::testing::TestWithParam<int> {};

TEST_P(DdpCnnParity, SyncBatchNormCnnMatchesSingleProcess) {
  const int world = GetParam(), per_rank = 3, steps = 4;
  torch::manual_seed(11);
  auto init = make_cnn();
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < steps; ++s) {
    xs.push_back(torch::randn({world * per_rank, 3, 8, 8}));
    ys.push_back(torch::randint(0, 4, {world * per_rank}));
  }
  auto single = make_cnn();
  copy_state(*single, *init);
  torch::optim::SGD single_opt(single->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < steps; ++s) {
    single_opt.zero_grad();
    torch::nn::functional::cross_entropy(single->forward(xs[s]), ys[s]).backward();
    single_opt.step();
  }

  std::vector<torch::nn::Sequential> trained(world, nullptr);
  run_ranks(world, [&](ProcessGroup& pg) {
    auto model = make_cnn();
    copy_state(*model, *init);
    convert_sync_batchnorm(model, pg.shared_from_this());
    DistributedDataParallel ddp(model, pg.shared_from_this());
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto x = xs[s].narrow(0, pg.rank() * per_rank, per_rank);
      auto y = ys[s].narrow(0, pg.rank() * per_rank, per_rank);
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      opt.step();
    }
    trained[pg.rank()] = model;
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_LT(max_relative_diff(*trained[r], *single), 1e-5) << "rank " << r;
    EXPECT_LT(max_buffer_diff(*trained[r], *single), 1e-5) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DdpCnnParity, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace tandem
