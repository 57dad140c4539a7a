// The README quickstart's model and data (examples/quickstart), trained for
// a fixed number of steps on a fixed global batch split over however many
// ranks run it, and its parameters written to a safetensors file: run alone
// and under `tandem launch --hostfile`, the two files must match
// (tests/multinode/test_hostfile_job.cpp).
//
//   quickstart_worker STEPS GLOBAL_BATCH OUT.safetensors [CKPT_DIR SAVE_EVERY]
//   quickstart_worker --checkpoint-dir CKPT_DIR STEPS GLOBAL_BATCH OUT.safetensors
//
// (the second form, as examples/slurm/train.sbatch passes it: SAVE_EVERY 0).
// TANDEM_TEST_SHARDED=1 makes both layers tandem::Sharded units (ZeRO-3).
// With TANDEM_TEST_STEP_DELAY_MS=D each step also sleeps D ms and rank 0
// prints "step N" after it, so that a test can signal at a known step.
// With CKPT_DIR it saves a checkpoint every SAVE_EVERY steps and resumes
// from the latest one there (at whatever world size it now runs). With
// TANDEM_TEST_HANG_AFTER_STEP=K (restart 0 only) every rank, having saved
// step K, writes its pid to $TANDEM_TEST_PID_DIR/rank<R>.pid and hangs, so
// that a test can take a host away at a known point. With
// TANDEM_TEST_HANG_ON_RANKS=N:K (any restart) it does the same when it runs
// on N ranks, so that a test can bring a host back while the job runs
// without it. TANDEM_TEST_SAVE_ON_EACH_NODE=1 sets
// AcceleratorOptions::save_on_each_node.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include <tandem/tandem.h>

// One of the programs in tandem_test_workers (workers/main.cpp picks it by
// the name it runs under).
namespace quickstart_worker {

// The quickstart model with its layers as tandem::Sharded units, under
// Sequential's parameter names.
struct ShardedMlp : torch::nn::Module {
  ShardedMlp()
      : first(register_module("0", tandem::Sharded<torch::nn::LinearImpl>(16, 64))),
        last(register_module("2", tandem::Sharded<torch::nn::LinearImpl>(64, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return last->forward(torch::relu(first->forward(x))); }
  tandem::Sharded<torch::nn::LinearImpl> first, last;
};

int main(int argc, char** argv) {
  std::string flag_ckpt;
  if (argc > 2 && std::string(argv[1]) == "--checkpoint-dir") {
    flag_ckpt = argv[2];
    argv[2] = argv[0];
    argv += 2;
    argc -= 2;
  }
  if (argc != 4 && argc != 6) {
    std::fprintf(stderr, "usage: quickstart_worker STEPS GLOBAL_BATCH OUT.safetensors "
                         "[CKPT_DIR SAVE_EVERY]\n");
    return 2;
  }
  const int64_t steps = std::atoll(argv[1]);
  const int64_t global_batch = std::atoll(argv[2]);
  const std::string out = argv[3];
  const std::string ckpt = argc == 6 ? argv[4] : flag_ckpt;
  const int64_t save_every = argc == 6 ? std::atoll(argv[5]) : 0;
  const char* hang_after = std::getenv("TANDEM_TEST_HANG_AFTER_STEP");
  const char* restart = std::getenv("TANDEM_RESTART_COUNT");
  const bool first_attempt = restart == nullptr || std::atoi(restart) == 0;
  tandem::AcceleratorOptions accelerator_options;
  const char* each_node = std::getenv("TANDEM_TEST_SAVE_ON_EACH_NODE");
  accelerator_options.save_on_each_node = each_node != nullptr && std::string(each_node) == "1";
  tandem::Accelerator accelerator(accelerator_options);
  const int world = accelerator.num_processes();
  int64_t hang_at = first_attempt && hang_after != nullptr ? std::atoll(hang_after) : -1;
  if (const char* on_ranks = std::getenv("TANDEM_TEST_HANG_ON_RANKS")) {
    const std::string spec = on_ranks;  // N:K
    if (std::atoi(spec.c_str()) == world) {
      hang_at = std::atoll(spec.substr(spec.find(':') + 1).c_str());
    }
  }
  if (global_batch % world != 0) {
    std::fprintf(stderr, "quickstart_worker: global batch %lld does not split over %d ranks\n",
                 static_cast<long long>(global_batch), world);
    return 2;
  }
  torch::manual_seed(0);
  // TANDEM_TEST_SHARDED=1: the same layers (same initial values) as
  // tandem::Sharded units, which ZeRO-3 needs.
  const char* sharded = std::getenv("TANDEM_TEST_SHARDED");
  const bool as_units = sharded != nullptr && std::string(sharded) == "1";
  auto model = as_units ? std::shared_ptr<torch::nn::Module>(std::make_shared<ShardedMlp>())
                        : torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::ReLU(),
                                                torch::nn::Linear(64, 1))
                              .ptr();
  auto forward = [&](const torch::Tensor& x) {
    return as_units ? std::static_pointer_cast<ShardedMlp>(model)->forward(x)
                    : std::static_pointer_cast<torch::nn::SequentialImpl>(model)->forward(x);
  };
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
  if (!ckpt.empty() && tandem::Accelerator::has_checkpoint(ckpt)) {
    accelerator.load_state(ckpt);
    accelerator.print("resumed at step {} on {} ranks", accelerator.step(), world);
  }
  double loss_value = 0;
  for (auto& batch : *loader) {
    optimizer->zero_grad();
    auto loss = torch::mse_loss(forward(batch[0]), batch[1]);
    accelerator.backward(loss);
    optimizer->step();
    loss_value = accelerator.reduce(loss.detach(), tandem::ReduceOp::kAvg).item<double>();
    const int64_t step = accelerator.step();
    if (save_every > 0 && step % save_every == 0) accelerator.save_state(ckpt);
    if (const char* delay = std::getenv("TANDEM_TEST_STEP_DELAY_MS")) {
      ::usleep(static_cast<useconds_t>(std::atoi(delay)) * 1000);
      accelerator.print("step {}", step);
    }
    if (step == hang_at) {
      if (const char* dir = std::getenv("TANDEM_TEST_PID_DIR")) {
        std::ofstream(std::string(dir) + "/rank" + std::to_string(accelerator.process_index()) +
                      ".pid")
            << ::getpid();
      }
      for (;;) ::pause();
    }
  }
  // Whole parameters on every strategy (gathered under ZeRO-3 and HSDP:
  // collective, so every rank asks).
  const auto weights = accelerator.get_state_dict();
  if (accelerator.is_main_process()) tandem::write_safetensors(out, weights);
  accelerator.print("{{\"world\": {}, \"steps\": {}, \"loss\": {:.6f}}}", world,
                    accelerator.step(), loss_value);
  accelerator.end_training();
  return 0;
}

}  // namespace quickstart_worker
