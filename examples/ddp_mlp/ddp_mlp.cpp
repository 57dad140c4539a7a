// A plain LibTorch training loop made data-parallel with DistributedDataParallel
// and DistributedLoader. Learns y = sum(x) on synthetic data.
//
//   tandem launch --nproc-per-node 2 build/bin/ddp_mlp

#include <torch/torch.h>

#include "tandem/tandem.h"

int main() {
  auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment());
  torch::manual_seed(0);  // same data on every rank; the loader shards it
  auto inputs = torch::randn({4096, 16});
  auto targets = inputs.sum(1, /*keepdim=*/true);

  auto model = torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::ReLU(),
                                     torch::nn::Linear(64, 1));
  tandem::DistributedDataParallel ddp(model, pg);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  tandem::DistributedLoaderOptions options;
  options.batch_size = 64;  // per process
  tandem::DistributedLoader loader({inputs, targets}, *pg, options);

  float loss_value = 0;
  for (int epoch = 0; epoch < 5; ++epoch) {
    loader.set_epoch(epoch);
    for (auto& batch : loader) {
      optimizer.zero_grad();
      auto loss = torch::mse_loss(model->forward(batch[0]), batch[1]);
      loss.backward();  // gradients are averaged across ranks here
      optimizer.step();
      loss_value = loss.item<float>();
    }
    tandem::print_main("epoch {} loss {:.4f}", epoch, loss_value);
  }
  return loss_value < 0.5 ? 0 : 1;
}
