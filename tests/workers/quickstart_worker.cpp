// The README quickstart's model and data (examples/quickstart), trained for
// a fixed number of steps on a fixed global batch split over however many
// ranks run it, and its parameters written to a safetensors file: run alone
// and under `tandem launch --hostfile`, the two files must match
// (tests/multinode/test_hostfile_job.cpp).
//
//   quickstart_worker STEPS GLOBAL_BATCH OUT.safetensors

#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include <tandem/tandem.h>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: quickstart_worker STEPS GLOBAL_BATCH OUT.safetensors\n");
    return 2;
  }
  const int64_t steps = std::atoll(argv[1]);
  const int64_t global_batch = std::atoll(argv[2]);
  const std::string out = argv[3];
  tandem::Accelerator accelerator;
  const int world = accelerator.num_processes();
  if (global_batch % world != 0) {
    std::fprintf(stderr, "quickstart_worker: global batch %lld does not split over %d ranks\n",
                 static_cast<long long>(global_batch), world);
    return 2;
  }
  torch::manual_seed(0);
  auto model = torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::ReLU(),
                                     torch::nn::Linear(64, 1));
  auto adam = std::make_shared<torch::optim::Adam>(model->parameters(),
                                                   torch::optim::AdamOptions(1e-2));
  const auto x = torch::randn({steps * global_batch, 16});
  const auto y = x.sum(1, /*keepdim=*/true);
  accelerator.prepare_model(model);
  auto optimizer = accelerator.prepare_optimizer(adam);
  tandem::DistributedLoaderOptions options;
  options.batch_size = global_batch / world;
  options.shuffle = false;  // step i sees samples [i * B, (i + 1) * B) at any world size
  auto loader = accelerator.prepare_data_loader({x, y}, options);
  double loss_value = 0;
  for (auto& batch : *loader) {
    optimizer->zero_grad();
    auto loss = torch::mse_loss(model->forward(batch[0]), batch[1]);
    accelerator.backward(loss);
    optimizer->step();
    loss_value = accelerator.reduce(loss.detach(), tandem::ReduceOp::kAvg).item<double>();
  }
  if (accelerator.is_main_process()) {
    std::vector<std::pair<std::string, at::Tensor>> weights;
    for (const auto& item : model->named_parameters()) {
      weights.emplace_back(item.key(), item.value().detach().cpu());
    }
    tandem::write_safetensors(out, weights);
  }
  accelerator.print("{{\"world\": {}, \"steps\": {}, \"loss\": {:.6f}}}", world,
                    accelerator.step(), loss_value);
  accelerator.end_training();
  return 0;
}
