// A small CNN with BatchNorm, converted to SyncBatchNorm and trained through
// tandem::Accelerator on synthetic images: which quadrant of a 16x16 image
// holds a bright square. With SyncBatchNorm the batch statistics are those
// of the global batch, as if one process trained on all of it.
//
//   tandem launch --nproc-per-node 2 build/bin/cnn_syncbn

#include <torch/torch.h>

#include "tandem/tandem.h"

namespace {

// Images of noise with a bright 4x4 square in one quadrant; the label is
// the quadrant (0..3).
std::pair<torch::Tensor, torch::Tensor> make_images(int64_t n, uint64_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  auto images = at::randn({n, 1, 16, 16}, generator) * 0.5;
  auto labels = at::randint(0, 4, {n}, generator);
  auto offsets = at::randint(0, 5, {n, 2}, generator);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t q = labels[i].item<int64_t>();
    const int64_t row = (q / 2) * 8 + offsets[i][0].item<int64_t>();
    const int64_t col = (q % 2) * 8 + offsets[i][1].item<int64_t>();
    images[i][0].narrow(0, row, 4).narrow(1, col, 4).add_(3.0);
  }
  return {images, labels};
}

torch::nn::Sequential make_cnn() {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)), torch::nn::BatchNorm2d(8),
      torch::nn::ReLU(), torch::nn::MaxPool2d(2),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)), torch::nn::BatchNorm2d(16),
      torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
      torch::nn::Linear(16 * 4 * 4, 4));
}

}  // namespace

int main() {
  tandem::Accelerator accelerator;
  accelerator.set_seed(0);
  auto [train_x, train_y] = make_images(4096, 1);
  auto [test_x, test_y] = make_images(1024, 2);

  auto model = make_cnn();
  tandem::convert_sync_batchnorm(model, accelerator.process_group());
  auto adam = std::make_shared<torch::optim::Adam>(
      model->parameters(), torch::optim::AdamOptions(1e-3));
  auto [optimizer, loader] = accelerator.prepare(model, adam, {train_x, train_y}, 32);

  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    loader->set_epoch(epoch);
    double loss_sum = 0;
    int64_t batches = 0;
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
      accelerator.backward(loss);
      optimizer->step();
      loss_sum += loss.item<double>();
      ++batches;
    }
    accelerator.print("epoch {} loss {:.4f}", epoch, loss_sum / static_cast<double>(batches));
  }

  // Evaluation: each rank scores its shard; gather_for_metrics counts every
  // test image once.
  torch::NoGradGuard no_grad;
  model->eval();
  tandem::DistributedLoaderOptions eval_options;
  eval_options.batch_size = 128;
  eval_options.shuffle = false;
  auto eval_loader = accelerator.prepare_data_loader({test_x, test_y}, eval_options);
  std::vector<torch::Tensor> hits;
  for (auto& batch : *eval_loader) {
    auto correct = (model->forward(batch[0]).argmax(1) == batch[1]).to(torch::kFloat);
    hits.push_back(accelerator.gather_for_metrics(correct));
  }
  const auto all = torch::cat(hits);
  const double accuracy = all.mean().item<double>();
  accelerator.print("{{\"test_images\": {}, \"accuracy\": {:.4f}}}", all.size(0), accuracy);
  accelerator.end_training();
  return accuracy > 0.9 ? 0 : 1;
}
