// Trains a small regression model with tandem::Accelerator and prints, on
// rank 0, one JSON line: world size, final loss, and the sum and sum of
// squares of every parameter. `app B` uses B samples per rank per step, so a
// 2-rank run with B and a 1-rank run with 2B take the same optimizer steps.
#include <cstdio>
#include <cstdlib>

#include <torch/torch.h>
#include <tandem/tandem.h>

namespace {

struct Lines : torch::data::datasets::Dataset<Lines> {
  torch::data::Example<> get(size_t i) override {
    auto x = torch::linspace(-1.0, 1.0, 8) * static_cast<double>(i % 17) / 17.0 +
             static_cast<double>(i % 5) / 5.0;
    return {x, (x * torch::arange(1, 9)).sum(0, true)};
  }
  torch::optional<size_t> size() const override { return 256; }
};

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 16;
  tandem::Accelerator accelerator;
  torch::manual_seed(0);
  auto model = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                     torch::nn::Linear(16, 1));
  // Each distinct tensor once, as the docs advise (and <tandem/tandem.h>
  // alone declares it).
  auto sgd = std::make_shared<torch::optim::SGD>(
      tandem::unique_parameters(*model), torch::optim::SGDOptions(0.05));
  auto [optimizer, loader] = accelerator.prepare(model, sgd, Lines(), batch);
  double last = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (auto& b : *loader) {
      optimizer->zero_grad();
      auto loss = torch::mse_loss(model->forward(b.data), b.target);
      accelerator.backward(loss);
      optimizer->step();
      last = loss.item<double>();
    }
  }
  double sum = 0, sumsq = 0;
  for (const auto& p : model->parameters()) {
    sum += p.sum().item<double>();
    sumsq += p.pow(2).sum().item<double>();
  }
  if (accelerator.is_main_process()) {
    std::printf("{\"world_size\": %d, \"loss\": %.6f, \"param_sum\": %.9g, \"param_sumsq\": %.9g}\n",
                accelerator.num_processes(), last, sum, sumsq);
  }
  return 0;
}
