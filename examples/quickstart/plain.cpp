// The README's quickstart pair: plain.cpp is a single-process LibTorch loop,
// accelerated.cpp the same program on tandem (`tandem launch --nproc-per-node 2
// build/bin/quickstart_accelerated`). tests/docs checks that README.md shows
// exactly their diff.
#include <torch/torch.h>

#include "sum_dataset.h"

int main() {
  torch::manual_seed(0);
  auto model = torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 1));
  auto optimizer = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
  auto loader = torch::data::make_data_loader(SumDataset().map(torch::data::transforms::Stack<>()), 64);
  float last = 0;
  for (int epoch = 0; epoch < 5; ++epoch) {
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      auto loss = torch::mse_loss(model->forward(batch.data), batch.target);
      loss.backward();
      optimizer->step();
      last = loss.item<float>();
    }
  }
  std::printf("final loss %.4f\n", last);
  return last < 0.5 ? 0 : 1;
}
