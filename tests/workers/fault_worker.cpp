// Worker for the fault-injection suite (tests/faults): a small, fully
// deterministic training run on the Accelerator, with checkpoints, that can
// be told to fail in one way at one step on one rank.
//
//   fault_worker [--steps N] [--checkpoint-dir DIR] [--save-every K]
//                [--resume-tag TAG] [--rank R] [--first-attempt-only]
//                [--throw-at S | --hang-at S | --exit-at S | --nan-at S]
//                [--loss-scaling] [--uneven-epochs E] [--join]
//
// - A run with a checkpoint directory resumes from its `latest` (or
//   --resume-tag) by itself, and saves every K optimizer steps and at the end.
// - Injections fire on rank R (default 1) before the forward of step S;
//   --first-attempt-only limits them to TANDEM_RESTART_COUNT == 0.
// - --uneven-epochs E trains E epochs over a dataset whose last batch only
//   rank 0 gets (even_batches off); --join runs them in join mode.
// - Every rank ends by printing "rank R weights <hash> steps N skipped K",
//   the hash covering every parameter's bytes, so runs compare bit-exactly.
// With TANDEM_TEST_PID_DIR set, each rank first writes DIR/rank<R>.pid.

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "tandem/tandem.h"

// One of the programs in tandem_test_workers (workers/main.cpp picks it by
// the name it runs under).
namespace fault_worker {

namespace {

struct Args {
  int64_t steps = 60;
  std::string checkpoint_dir;
  int64_t save_every = 0;
  std::string resume_tag;
  int rank = 1;
  bool first_attempt_only = false;
  int64_t throw_at = -1, hang_at = -1, exit_at = -1, nan_at = -1;
  bool loss_scaling = false;
  int64_t uneven_epochs = 0;
  bool join = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw tandem::UsageError("fault_worker: " + flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--steps") a.steps = std::stoll(value());
    else if (flag == "--checkpoint-dir") a.checkpoint_dir = value();
    else if (flag == "--save-every") a.save_every = std::stoll(value());
    else if (flag == "--resume-tag") a.resume_tag = value();
    else if (flag == "--rank") a.rank = std::stoi(value());
    else if (flag == "--first-attempt-only") a.first_attempt_only = true;
    else if (flag == "--throw-at") a.throw_at = std::stoll(value());
    else if (flag == "--hang-at") a.hang_at = std::stoll(value());
    else if (flag == "--exit-at") a.exit_at = std::stoll(value());
    else if (flag == "--nan-at") a.nan_at = std::stoll(value());
    else if (flag == "--loss-scaling") a.loss_scaling = true;
    else if (flag == "--uneven-epochs") a.uneven_epochs = std::stoll(value());
    else if (flag == "--join") a.join = true;
    else throw tandem::UsageError("fault_worker: unknown flag " + flag);
  }
  return a;
}

void write_pid(int rank) {
  const char* dir = std::getenv("TANDEM_TEST_PID_DIR");
  if (dir == nullptr) return;
  std::ofstream(std::string(dir) + "/rank" + std::to_string(rank) + ".pid") << ::getpid();
}

// FNV-1a over every parameter's bytes.
uint64_t weights_hash(torch::nn::Module& model) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : model.parameters()) {
    auto t = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel() * static_cast<int64_t>(t.element_size()); ++i) {
      h = (h ^ bytes[i]) * 1099511628211ull;
    }
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  tandem::AcceleratorOptions options;
  if (args.loss_scaling) options.loss_scaling = tandem::LossScaleConfig{};
  tandem::Accelerator accelerator(options);
  const int rank = accelerator.process_index();
  write_pid(rank);
  const bool armed = rank == args.rank &&
                     !(args.first_attempt_only && tandem::RankEnv::from_environment().restart_count > 0);

  accelerator.set_seed(0);
  auto model = torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::Tanh(),
                                     torch::nn::Linear(64, 1));
  auto adam = std::make_shared<torch::optim::Adam>(
      model->parameters(), torch::optim::AdamOptions(1e-2));
  // The last batch of each epoch reaches rank 0 alone in the uneven runs.
  const int64_t samples = args.uneven_epochs > 0 ? 2 * 16 * 8 + 1 : 512;
  auto x = torch::randn({samples, 32});
  auto y = x.sum(1, true).sin();
  tandem::DistributedLoaderOptions loader_options;
  loader_options.batch_size = 16;
  loader_options.seed = 0;
  loader_options.even_batches = args.uneven_epochs == 0;
  auto [optimizer, loader] = accelerator.prepare(model, adam, {x, y}, loader_options);

  if (!args.checkpoint_dir.empty() &&
      (!args.resume_tag.empty() || tandem::Accelerator::has_checkpoint(args.checkpoint_dir))) {
    tandem::LoadStateOptions load;
    load.tag = args.resume_tag;
    accelerator.load_state(args.checkpoint_dir, load);
    accelerator.print("resumed at step {}", accelerator.step());
  }
  auto save = [&] {
    tandem::SaveStateOptions save_options;
    save_options.total_limit = 2;
    accelerator.save_state(args.checkpoint_dir, save_options);
  };

  int64_t micro_step = 0;
  bool nan_injected = false;  // a skipped step does not advance step()
  auto train_step = [&](const std::vector<torch::Tensor>& batch) {
    const int64_t s = accelerator.step() + 1;  // the optimizer step this one makes
    ++micro_step;
    if (armed && s == args.throw_at) throw std::runtime_error("injected failure at step " + std::to_string(s));
    if (armed && s == args.exit_at) std::exit(7);
    if (armed && s == args.hang_at) {
      std::fprintf(stderr, "rank %d hangs at step %ld\n", rank, static_cast<long>(s));
      for (;;) ::pause();
    }
    optimizer->zero_grad();
    auto loss = torch::mse_loss(model->forward(batch[0]), batch[1]);
    if (armed && s == args.nan_at && !nan_injected) {
      nan_injected = true;
      loss = loss * std::nan("");
    }
    accelerator.backward(loss);
    optimizer->step();
    if (args.save_every > 0 && accelerator.sync_gradients() &&
        accelerator.step() % args.save_every == 0 && !optimizer->step_was_skipped()) {
      save();
    }
  };

  if (args.uneven_epochs > 0) {
    for (int64_t epoch = 0; epoch < args.uneven_epochs; ++epoch) {
      loader->set_epoch(epoch);
      if (args.join) {
        auto join = accelerator.join_uneven_inputs();
        for (auto& batch : *loader) train_step(batch);
      } else {
        for (auto& batch : *loader) train_step(batch);
      }
    }
  } else {
    for (int64_t epoch = loader->epoch(); accelerator.step() < args.steps; ++epoch) {
      loader->set_epoch(epoch);
      for (auto& batch : *loader) {
        train_step(batch);
        if (accelerator.step() >= args.steps) break;
      }
    }
    const bool saved_last = args.save_every > 0 && accelerator.step() % args.save_every == 0;
    if (!args.checkpoint_dir.empty() && !saved_last) save();
  }
  std::printf("rank %d weights %016llx steps %ld skipped %ld micro %ld\n", rank,
              static_cast<unsigned long long>(weights_hash(*model)),
              static_cast<long>(accelerator.step()), static_cast<long>(accelerator.skipped_steps()),
              static_cast<long>(micro_step));
  return 0;
}

}  // namespace fault_worker
