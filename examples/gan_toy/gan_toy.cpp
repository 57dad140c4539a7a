// gan_toy: a generator and a discriminator, each with its own optimizer,
// trained with alternating steps on a synthetic 2-D distribution (a ring of
// eight Gaussians), prepared on one tandem::Accelerator. The global batch is
// fixed, so runs at any world size take the same steps:
//
//   build/bin/gan_toy --steps 200 --global-batch 64 --save gan1.safetensors
//   tandem launch --nproc-per-node 2 build/bin/gan_toy --steps 200 --global-batch 64
//       --save gan2.safetensors     (one command)
//
// save the same parameters: the players train in float64, so the rounding
// that differs between one rank's mean and two ranks' averaged halves stays
// far below 1e-4 even through a GAN's unstable dynamics. Rank 0 writes both
// models' parameters to --save as safetensors, named by module path behind
// "generator." and "discriminator.", and prints a last JSON line.

#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <tandem/tandem.h>

namespace {

constexpr int kNoise = 4;

struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kNoise, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    out = register_module("out", torch::nn::Linear(64, 2));
  }
  torch::Tensor forward(const torch::Tensor& z) {
    return out(torch::relu(fc2(torch::relu(fc1(z)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(2, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    out = register_module("out", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return out(torch::leaky_relu(fc2(torch::leaky_relu(fc1(x), 0.2)), 0.2));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(Discriminator);

// `n` samples of a ring of eight Gaussians (radius 2, std 0.05), and `n`
// noise vectors, from one seeded generator: the same on every rank.
std::pair<torch::Tensor, torch::Tensor> make_data(int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto mode = torch::randint(0, 8, {n}, gen, torch::kLong).to(torch::kFloat);
  auto angle = mode * (2 * M_PI / 8);
  auto centres = torch::stack({2 * torch::cos(angle), 2 * torch::sin(angle)}, 1);
  auto real = centres + 0.05 * torch::randn({n, 2}, gen);
  return {real.to(torch::kDouble), torch::randn({n, kNoise}, gen).to(torch::kDouble)};
}

std::vector<std::pair<std::string, at::Tensor>> named_weights(const std::string& prefix,
                                                              const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) {
    out.emplace_back(prefix + item.key(), item.value().detach().cpu());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 200;
  uint64_t seed = 0;
  int64_t global_batch = 64;
  double lr = 1e-3;
  std::string save;
  CLI::App app("tandem example: a toy GAN, two models and two optimizers on one Accelerator");
  app.add_option("--steps", steps, "iterations (one discriminator and one generator step each)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "seed for the initial weights and the data");
  app.add_option("--global-batch", global_batch, "samples per step across all ranks")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "Adam learning rate of both players")->check(CLI::PositiveNumber);
  app.add_option("--save", save, "rank 0 writes both models' parameters here (safetensors)");
  CLI11_PARSE(app, argc, argv);

  try {
    tandem::Accelerator accelerator;
    const int world = accelerator.num_processes();
    if (global_batch % world != 0) {
      std::fprintf(stderr, "gan_toy: --global-batch %lld does not split over %d ranks; pick a "
                   "multiple of the world size\n", static_cast<long long>(global_batch), world);
      return 2;
    }
    torch::manual_seed(seed);
    Generator generator;
    Discriminator discriminator;
    generator->to(torch::kDouble);
    discriminator->to(torch::kDouble);
    accelerator.prepare_model(generator);
    accelerator.prepare_model(discriminator);
    auto g_opt = accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(
        generator->parameters(), torch::optim::AdamOptions(lr).betas({0.5, 0.999})));
    auto d_opt = accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(
        discriminator->parameters(), torch::optim::AdamOptions(lr).betas({0.5, 0.999})));
    auto [real, noise] = make_data(steps * global_batch, seed + 1);
    tandem::DistributedLoaderOptions options;
    options.batch_size = global_batch / world;
    options.shuffle = false;  // step i sees samples [i * B, (i + 1) * B) at any world size
    auto loader = accelerator.prepare_data_loader({real, noise}, options);

    namespace F = torch::nn::functional;
    double d_loss = 0, g_loss = 0;
    for (auto& batch : *loader) {
      const auto ones = torch::ones({batch[0].size(0), 1}, torch::kDouble);
      const auto zeros = torch::zeros({batch[0].size(0), 1}, torch::kDouble);
      // The discriminator: real against generated samples (the generator
      // gets no gradient: its output is detached).
      d_opt->zero_grad();
      const auto fake = generator->forward(batch[1]);
      auto loss_d = F::binary_cross_entropy_with_logits(discriminator->forward(batch[0]), ones) +
                    F::binary_cross_entropy_with_logits(discriminator->forward(fake.detach()), zeros);
      accelerator.backward(loss_d);
      d_opt->step();
      // The generator: fool the discriminator.
      g_opt->zero_grad();
      auto loss_g = F::binary_cross_entropy_with_logits(discriminator->forward(fake), ones);
      accelerator.backward(loss_g);
      g_opt->step();
      d_loss = accelerator.reduce(loss_d.detach()).item<double>() / world;
      g_loss = accelerator.reduce(loss_g.detach()).item<double>() / world;
    }
    // How close generated samples lie to the ring (radius 2).
    torch::NoGradGuard no_grad;
    const auto sample = generator->forward(make_data(512, seed + 2).second);
    const double ring_error = (sample.norm(2, 1) - 2).abs().mean().item<double>();
    if (accelerator.is_main_process() && !save.empty()) {
      auto weights = named_weights("generator.", *generator);
      for (auto& w : named_weights("discriminator.", *discriminator)) weights.push_back(w);
      tandem::write_safetensors(save, weights);
    }
    nlohmann::json result = {{"world", world},           {"steps", accelerator.step()},
                             {"global_batch", global_batch}, {"d_loss", d_loss},
                             {"g_loss", g_loss},         {"ring_error", ring_error}};
    if (!save.empty()) result["save"] = save;
    accelerator.print("{}", result.dump());
    accelerator.end_training();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gan_toy: %s\n", e.what());
    return 1;
  }
}
