// Worker for the checkpoint fault tests (tests/faults): saves checkpoints
// in a loop until killed, checks that the latest one loads exactly, or
// saves into a directory that is too small.
//
//   checkpoint_worker save-loop DIR     save step1, step2, ... until killed
//   checkpoint_worker verify DIR        load `latest`; exit 0 when every
//                                       parameter equals its saved step
//   checkpoint_worker disk-full DIR     save step1, then fail to save step2
//
// Each parameter of step s holds the value s everywhere, so a checkpoint
// that mixes two saves, or holds a partial write, is caught.

#include <dirent.h>

#include <cstdio>
#include <string>

#include <torch/torch.h>

#include "tandem/tandem.h"

// One of the programs in tandem_test_workers (workers/main.cpp picks it by
// the name it runs under).
namespace checkpoint_worker {

namespace {

struct Model : torch::nn::Module {
  explicit Model(int width) {
    for (int i = 0; i < 4; ++i) {
      layers.push_back(register_module("layer" + std::to_string(i), torch::nn::Linear(width, width)));
    }
    register_buffer("seen", torch::zeros({3}));
  }
  std::vector<torch::nn::Linear> layers;
};

void fill(torch::nn::Module& model, double value) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.fill_(value);
  for (auto& b : model.buffers()) b.fill_(value);
}

void save_step(tandem::Accelerator& accelerator, const std::string& dir, int64_t step) {
  tandem::SaveStateOptions options;
  options.tag = "step" + std::to_string(step);
  options.client_state = {{"step", step}};
  options.total_limit = 2;
  accelerator.save_state(dir, options);
}

bool has_temporaries(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) found |= std::string(e->d_name).rfind(".tmp-", 0) == 0;
  ::closedir(d);
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_worker save-loop|verify|disk-full DIR\n");
    return 2;
  }
  const std::string mode = argv[1];
  const std::string dir = argv[2];
  tandem::Accelerator accelerator;
  auto model = std::make_shared<Model>(mode == "disk-full" ? 64 : 512);
  accelerator.prepare_model(model);
  if (mode == "save-loop") {
    for (int64_t step = 1;; ++step) {
      fill(*model, static_cast<double>(step));
      save_step(accelerator, dir, step);
      std::printf("saved %ld\n", static_cast<long>(step));
      std::fflush(stdout);
    }
  }
  if (mode == "verify") {
    if (!tandem::Accelerator::has_checkpoint(dir)) {
      std::printf("no checkpoint\n");
      return 3;
    }
    fill(*model, -1.0);
    const auto client = accelerator.load_state(dir);
    const double step = client.at("step").get<double>();
    for (const auto& p : model->parameters()) {
      if (!torch::all(p == step).item<bool>()) {
        std::printf("parameter does not hold step %g\n", step);
        return 1;
      }
    }
    for (const auto& b : model->buffers()) {
      if (!torch::all(b == step).item<bool>()) return 1;
    }
    std::printf("ok %g\n", step);
    return 0;
  }
  if (mode == "disk-full") {
    fill(*model, 1.0);
    save_step(accelerator, dir, 1);
    fill(*model, 2.0);
    try {
      save_step(accelerator, dir, 2);
      std::printf("the second save succeeded; the directory was not full\n");
      return 1;
    } catch (const tandem::CheckpointError& e) {
      std::printf("%s\n", e.what());
    }
    const auto latest = tandem::latest_checkpoint_tag(dir);
    if (!latest || *latest != "step1" || has_temporaries(dir)) {
      std::printf("after the failed save: latest=%s, temporaries left=%d\n",
                  latest ? latest->c_str() : "none", has_temporaries(dir));
      return 1;
    }
    fill(*model, 0.0);
    accelerator.load_state(dir);
    for (const auto& p : model->parameters()) {
      if (!torch::all(p == 1.0).item<bool>()) return 1;
    }
    std::printf("previous checkpoint intact\n");
    return 0;
  }
  std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
  return 2;
}

}  // namespace checkpoint_worker
