// Activation checkpointing under DDP (ranks as threads): training with
// checkpointed blocks ends with bit-identical parameters to the same DDP
// training without, on 2 and 3 ranks, with gradient accumulation and
// several buckets. The net's head is checkpointed, so the first gradients of
// each backward, and the reducer's first hook, come from inside a
// checkpoint's nested backward: the reducer must still finalize at the end
// of the whole backward, or the input layer's gradient would be missing.

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "parallel/checkpoint_test_models.h"
#include "support/thread_ranks.h"
#include "tandem/parallel/ddp.h"

namespace tandem {
namespace {

using testing::CheckpointNet;
using testing::run_ranks;

constexpr int kCkptSteps = 3, kCkptMicro = 2, kCkptPerRank = 3;

using CkptParams = std::map<std::string, torch::Tensor>;

// Trains one net per rank; every rank ends with the same parameters, so
// rank 0's are returned (and each rank's are checked against it).
CkptParams train_checkpoint_net(int world, bool checkpointing) {
  // Models and data before the threads: they share torch's global generator.
  std::vector<CheckpointNet> nets;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(21);
    nets.emplace_back(5, 12, 4, /*depth=*/3, /*dropout=*/0.0);
    set_activation_checkpointing(*nets.back(), checkpointing);
  }
  auto gen = at::detail::createCPUGenerator(77);
  const auto batch = torch::randn({kCkptSteps, kCkptMicro, world * kCkptPerRank, 5}, gen);
  const auto labels = torch::randint(0, 4, {kCkptSteps, kCkptMicro, world * kCkptPerRank}, gen);
  std::vector<CkptParams> out(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    CheckpointNet& net = nets[pg.rank()];
    DDPOptions options;
    options.bucket_cap_mb = 0.0005;  // several buckets on a small net
    options.first_bucket_cap_mb = 0.0005;
    DistributedDataParallel ddp(net, pg.shared_from_this(), options);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < kCkptSteps; ++step) {
      sgd.zero_grad();
      for (int micro = 0; micro < kCkptMicro; ++micro) {
        ddp.set_gradient_sync(micro == kCkptMicro - 1);
        auto x = batch[step][micro].narrow(0, pg.rank() * kCkptPerRank, kCkptPerRank);
        auto y = labels[step][micro].narrow(0, pg.rank() * kCkptPerRank, kCkptPerRank);
        (torch::nn::functional::cross_entropy(net->forward(x), y) / kCkptMicro).backward();
      }
      sgd.step();
    }
    EXPECT_EQ(ddp.sync_count(), kCkptSteps);
    for (const auto& item : net->named_parameters()) {
      out[pg.rank()][item.key()] = item.value().detach().clone();
    }
  });
  for (int r = 1; r < world; ++r) {
    for (const auto& [name, value] : out[0]) {
      EXPECT_TRUE(torch::equal(out[r].at(name), value)) << "rank " << r << " " << name;
    }
  }
  return out[0];
}

class CheckpointUnderDdp : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointUnderDdp, TrainsToBitIdenticalParameters) {
  const int world = GetParam();
  const CkptParams plain = train_checkpoint_net(world, false);
  const CkptParams checkpointed = train_checkpoint_net(world, true);
  torch::manual_seed(21);
  CheckpointNet initial(5, 12, 4, 3, 0.0);
  for (const auto& [name, value] : plain) {
    EXPECT_TRUE(torch::equal(checkpointed.at(name), value)) << name;
    EXPECT_FALSE(torch::equal(initial->named_parameters()[name], value)) << name << " trained";
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, CheckpointUnderDdp, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "World" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace tandem
