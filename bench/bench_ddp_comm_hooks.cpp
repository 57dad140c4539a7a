// DDP training step under each communication hook: plain all-reduce, fp16
// compression and PowerSGD (Gloo / shared memory, CPU).
//
// A rank program: start it with `tandem launch` (or any launcher that sets
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT). bench_ddp_comm_hooks.py is its
// peer and measures PyTorch DDP with PyTorch's hooks the same way;
// compare_ddp_comm_hooks.py runs both.
//
// Model: depth x (Linear(W, W) + ReLU), then Linear(W, 10): a few large
// matrices, which is what PowerSGD compresses. Cross-entropy on a fixed
// random batch per rank, SGD (lr 1e-3). Buckets: all at --bucket-mb
// (default 100: one bucket for the default model; compare_ddp_comm_hooks.py
// says why). Per hook: a fresh DDP-wrapped copy
// of the model, `warmup` untimed steps (PowerSGD starts compressing at
// iteration 2, inside the warmup), then `steps` timed steps with a barrier
// before each; a step's time is the slowest rank's and the figure is the
// median. Bytes per step: what the hook hands to all-reduce per rank and
// step, the payload (a ring all-reduce moves 2(n-1)/n times it):
// 4 x parameters for the average, 2 x for fp16, and for PowerSGD 4 x its
// elements after compression (P, Q and the gradients it sends as they are),
// counted over the timed steps.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tandem/tandem.h"

namespace {

constexpr std::int64_t kClasses = 10;

struct Options {
  std::int64_t width = 2048;
  std::int64_t depth = 3;
  std::int64_t batch = 32;
  int steps = 20;
  int warmup = 5;
  double bucket_mb = 100.0;
  std::int64_t rank = 4;  // PowerSGD's matrix_approximation_rank
  std::string hooks = "allreduce,fp16,powersgd";
};

torch::nn::Sequential make_model(const Options& options) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (std::int64_t i = 0; i < options.depth; ++i) {
    model->push_back(torch::nn::Linear(options.width, options.width));
    model->push_back(torch::nn::ReLU());
  }
  model->push_back(torch::nn::Linear(options.width, kClasses));
  return model;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

tandem::DDPOptions hook_options(const std::string& hook, const Options& options) {
  tandem::DDPOptions ddp;
  // Every bucket at one cap, as PyTorch 2.13's DDP makes them when given
  // bucket_cap_mb.
  ddp.bucket_cap_mb = options.bucket_mb;
  ddp.first_bucket_cap_mb = options.bucket_mb;
  if (hook == "allreduce") return ddp;
  if (hook == "fp16") {
    ddp.comm_hook = tandem::CommHook::kFp16Compress;
    return ddp;
  }
  TANDEM_CHECK_ARG(hook == "powersgd",
                   "bench_ddp_comm_hooks: unknown hook '{}'; use allreduce, fp16 or powersgd",
                   hook);
  ddp.comm_hook = tandem::CommHook::kPowerSGD;
  ddp.powersgd.matrix_approximation_rank = options.rank;
  ddp.powersgd.start_powerSGD_iter = 2;
  return ddp;
}

// Times `steps` steps of a fresh DDP copy under `hook`: {median slowest-rank
// step in ms, payload bytes per step}.
std::pair<double, double> time_hook(tandem::ProcessGroup& pg, const std::string& hook,
                                    const at::Tensor& inputs, const at::Tensor& labels,
                                    std::int64_t params, const Options& options) {
  using Clock = std::chrono::steady_clock;
  TANDEM_CHECK_ARG(options.warmup >= 2 || hook != "powersgd",
                   "bench_ddp_comm_hooks: --warmup must be at least 2, so that PowerSGD "
                   "compresses in every timed step");
  auto model = make_model(options);
  tandem::DistributedDataParallel ddp(model, pg.shared_from_this(), hook_options(hook, options));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(1e-3));
  auto* powersgd = dynamic_cast<tandem::PowerSGDHook*>(&ddp.comm_hook());
  at::Tensor seconds = at::zeros({options.steps}, at::kDouble);
  double* out = seconds.data_ptr<double>();
  std::int64_t sent_before = 0;
  at::Tensor loss;
  for (int i = 0; i < options.warmup + options.steps; ++i) {
    if (i == options.warmup && powersgd) sent_before = powersgd->numel_after_compression();
    pg.barrier();
    const auto start = Clock::now();
    optimizer.zero_grad();
    loss = torch::nn::functional::cross_entropy(model->forward(inputs), labels);
    loss.backward();
    optimizer.step();
    const auto end = Clock::now();
    if (i < options.warmup) continue;
    out[i - options.warmup] = std::chrono::duration<double>(end - start).count();
  }
  TANDEM_CHECK(std::isfinite(loss.item<double>()), "bench_ddp_comm_hooks: the loss is {}",
               loss.item<double>());
  pg.all_reduce(seconds, tandem::ReduceOp::kMax);
  const double* data = seconds.data_ptr<double>();
  const double step_ms = median(std::vector<double>(data, data + options.steps)) * 1e3;
  double bytes = 4.0 * static_cast<double>(params);
  if (hook == "fp16") bytes = 2.0 * static_cast<double>(params);
  if (powersgd) {
    bytes = 4.0 * static_cast<double>(powersgd->numel_after_compression() - sent_before) /
            options.steps;
  }
  return {step_ms, bytes};
}

void run(const Options& options) {
  at::set_num_threads(1);  // one intra-op thread per rank, as on the torch side
  auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment());
  torch::manual_seed(1000 + pg->rank());
  const at::Tensor inputs = torch::randn({options.batch, options.width});
  const at::Tensor labels = torch::randint(0, kClasses, {options.batch}, at::kLong);
  std::int64_t params = 0;
  for (const auto& p : make_model(options)->parameters()) params += p.numel();

  nlohmann::json results = nlohmann::json::object();
  std::stringstream list(options.hooks);
  for (std::string hook; std::getline(list, hook, ',');) {
    const auto [step_ms, bytes] = time_hook(*pg, hook, inputs, labels, params, options);
    results[hook] = {{"step_ms", step_ms}, {"bytes_per_step", bytes}};
  }
  pg->barrier();
  if (pg->rank() == 0) {
    nlohmann::json line = {{"impl", "tandem"},         {"world", pg->world_size()},
                           {"params", params},         {"width", options.width},
                           {"depth", options.depth},   {"batch", options.batch},
                           {"steps", options.steps},   {"warmup", options.warmup},
                           {"bucket_mb", options.bucket_mb}, {"rank", options.rank},
                           {"shared_memory", pg->uses_shared_memory()},
                           {"hooks", results}};
    std::cout << line.dump() << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"tandem DDP step under each communication hook (one rank)"};
  app.add_option("--width", options.width, "hidden width W")->check(CLI::PositiveNumber);
  app.add_option("--depth", options.depth, "hidden Linear(W, W) + ReLU layers")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", options.batch, "rows per rank")->check(CLI::PositiveNumber);
  app.add_option("--steps", options.steps, "timed steps per hook")->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "untimed steps per hook (at least 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--bucket-mb", options.bucket_mb,
                 "DDPOptions::bucket_cap_mb and first_bucket_cap_mb")
      ->check(CLI::PositiveNumber);
  app.add_option("--rank", options.rank, "PowerSGD's matrix_approximation_rank")
      ->check(CLI::PositiveNumber);
  app.add_option("--hooks", options.hooks, "comma-separated: allreduce, fp16, powersgd");
  CLI11_PARSE(app, argc, argv);
  try {
    run(options);
  } catch (const std::exception& e) {
    std::cerr << "bench_ddp_comm_hooks: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
