// The quickstart model (examples/quickstart/accelerated.cpp), launched from
// inside the program: tandem::spawn forks N workers, each trains with its own
// Accelerator, and no `tandem launch` is needed.
//
//   build/bin/spawn_quickstart --nprocs 3
//   build/bin/spawn_quickstart --nprocs 3 --fail-rank 1   # rank 1 throws
//
// Rank 0 ends with one JSON line, {"world": N, "loss": L}. With --fail-rank
// the program exits 1 with a message naming that rank.
#include <torch/torch.h>
#include <tandem/comm/spawn.h>
#include <tandem/tandem.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../quickstart/sum_dataset.h"

namespace {

void train(int rank, int fail_rank) {
  tandem::Accelerator accelerator;
  torch::manual_seed(0);
  auto model = torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 1));
  auto adam = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
  auto [optimizer, loader] = accelerator.prepare(model, adam, SumDataset(), 64);
  float last = 0;
  for (int epoch = 0; epoch < 5; ++epoch) {
    for (auto& batch : *loader) {
      // Mid-training, while the other ranks wait in the gradient all-reduce.
      if (rank == fail_rank) {
        throw std::runtime_error("--fail-rank " + std::to_string(rank) +
                                 ": rank " + std::to_string(rank) + " fails on purpose");
      }
      optimizer->zero_grad();
      auto loss = torch::mse_loss(model->forward(batch.data), batch.target);
      accelerator.backward(loss);
      optimizer->step();
      last = loss.item<float>();
    }
  }
  if (accelerator.is_main_process()) {
    std::printf("{\"world\": %d, \"loss\": %.6f}\n", accelerator.num_processes(), last);
  }
}

int parse_count(const char* flag, const char* text) {
  char* end = nullptr;
  long value = text != nullptr ? std::strtol(text, &end, 10) : -1;
  if (text == nullptr || *end != '\0' || value < 0 || value > 4096) {
    std::fprintf(stderr, "spawn_quickstart: %s needs a whole number 0-4096, got '%s'\n", flag,
                 text != nullptr ? text : "");
    std::exit(2);
  }
  return static_cast<int>(value);
}

}  // namespace

int main(int argc, char** argv) {
  int nprocs = 2;
  int fail_rank = -1;
  for (int i = 1; i < argc; ++i) {
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (std::strcmp(argv[i], "--nprocs") == 0) {
      nprocs = parse_count("--nprocs", next);
      ++i;
    } else if (std::strcmp(argv[i], "--fail-rank") == 0) {
      fail_rank = parse_count("--fail-rank", next);
      ++i;
    } else {
      std::fprintf(stderr, "usage: %s [--nprocs N] [--fail-rank R]\n", argv[0]);
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  try {
    tandem::spawn([&](int rank) { train(rank, fail_rank); }, nprocs);
  } catch (const tandem::UsageError& e) {
    std::fprintf(stderr, "spawn_quickstart: %s\n", e.what());
    return 2;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "spawn_quickstart: %s\n", e.what());
    return 1;
  }
  return 0;
}
