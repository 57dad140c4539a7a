// Training step under tandem's DistributedDataParallel (Gloo / shared memory,
// CPU).
//
// A rank program: start it with `tandem launch` (or any launcher that sets
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT). bench_ddp.py is its peer and
// measures PyTorch DDP the same way; compare_ddp.py runs both.
//
// Model: depth x (Linear(W, W) + ReLU), then Linear(W, 10); cross-entropy on a
// fixed random batch; Adam (lr 1e-3). Three phases, each `warmup` untimed then
// `steps` timed iterations with a barrier before each; an iteration's time is
// the slowest rank's and the figure reported is the median:
//   compute    the step (zero_grad, forward, backward, optimizer step) on a
//              plain model: no communication at all;
//   allreduce  one flat float32 tensor as large as all gradients, kAvg;
//   ddp        the same step on a separate, DDP-wrapped copy of the model.
// step_ms - compute_ms is the communication DDP fails to hide.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tandem/parallel/ddp.h"
#include "tandem/tandem.h"

namespace {

constexpr std::int64_t kClasses = 10;

struct Options {
  std::int64_t width = 1024;
  std::int64_t depth = 4;
  std::int64_t batch = 32;
  int steps = 30;
  int warmup = 5;
  double bucket_mb = 25.0;
  bool system_allocator = false;
};

// Columns of a step's timings, in the order they are stored.
enum Column { kStep, kForward, kBackward, kOptimizer, kColumns };

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
  std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// seconds: [iters, k] on this rank. Per column, the median over iterations of
// the slowest rank's time, in ms.
std::vector<double> slowest_medians(tandem::ProcessGroup& pg, at::Tensor seconds) {
  pg.all_reduce(seconds, tandem::ReduceOp::kMax);
  std::vector<double> medians;
  for (std::int64_t c = 0; c < seconds.size(1); ++c) {
    at::Tensor column = seconds.select(1, c).contiguous();
    const double* data = column.data_ptr<double>();
    medians.push_back(median(std::vector<double>(data, data + column.numel())) * 1e3);
  }
  return medians;
}

double since(std::chrono::steady_clock::time_point start,
             std::chrono::steady_clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

// Times training steps of `model` (wrapped or not: the loop is the same);
// returns the medians (ms) of the columns. zero_grad counts in the step only.
std::vector<double> time_steps(tandem::ProcessGroup& pg, torch::nn::Sequential& model,
                               const at::Tensor& inputs, const at::Tensor& labels,
                               const Options& options) {
  using Clock = std::chrono::steady_clock;
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  at::Tensor seconds = at::zeros({options.steps, kColumns}, at::kDouble);
  auto* out = seconds.data_ptr<double>();
  at::Tensor loss;
  for (int i = 0; i < options.warmup + options.steps; ++i) {
    pg.barrier();
    auto t0 = Clock::now();
    optimizer.zero_grad();
    auto t1 = Clock::now();
    loss = torch::nn::functional::cross_entropy(model->forward(inputs), labels);
    auto t2 = Clock::now();
    loss.backward();
    auto t3 = Clock::now();
    optimizer.step();
    auto t4 = Clock::now();
    if (i >= options.warmup) {
      double* row = out + (i - options.warmup) * kColumns;
      row[kStep] = since(t0, t4);
      row[kForward] = since(t1, t2);
      row[kBackward] = since(t2, t3);
      row[kOptimizer] = since(t3, t4);
    }
  }
  const double last = loss.item<double>();
  TANDEM_CHECK(std::isfinite(last), "bench_ddp: the loss is {}", last);
  return slowest_medians(pg, seconds);
}

// Median (ms) of averaging one flat float32 tensor of `numel` elements.
double time_all_reduce(tandem::ProcessGroup& pg, std::int64_t numel, const Options& options) {
  at::Tensor flat = at::zeros({numel}, at::kFloat);  // zeros stay finite
  at::Tensor seconds = at::zeros({options.steps, 1}, at::kDouble);
  auto* out = seconds.data_ptr<double>();
  for (int i = 0; i < options.warmup + options.steps; ++i) {
    pg.barrier();
    auto start = std::chrono::steady_clock::now();
    pg.all_reduce(flat, tandem::ReduceOp::kAvg);
    if (i >= options.warmup) out[i - options.warmup] = since(start, std::chrono::steady_clock::now());
  }
  return slowest_medians(pg, seconds)[0];
}

nlohmann::json phase_json(const std::vector<double>& medians) {
  return {{"step_ms", medians[kStep]},
          {"forward_ms", medians[kForward]},
          {"backward_ms", medians[kBackward]},
          {"optimizer_ms", medians[kOptimizer]}};
}

void run(const Options& options) {
  // One intra-op thread per rank, as on the torch side.
  at::set_num_threads(1);
  // DDP installs tandem's caching CPU allocator; install it up front so the
  // no-communication baseline runs on the same allocator as the DDP step.
  if (!options.system_allocator) tandem::enable_cpu_caching_allocator();
  auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment());
  const int rank = pg->rank();

  // Each rank its own fixed batch (as data-parallel shards would be).
  torch::manual_seed(1000 + rank);
  at::Tensor inputs = torch::randn({options.batch, options.width});
  at::Tensor labels = torch::randint(0, kClasses, {options.batch}, at::kLong);

  std::int64_t params = 0;
  std::vector<double> compute;
  {
    auto plain = make_model(options);
    for (const auto& p : plain->parameters()) params += p.numel();
    compute = time_steps(*pg, plain, inputs, labels, options);
  }

  const double allreduce_ms = time_all_reduce(*pg, params, options);

  std::vector<double> step;
  {
    auto model = make_model(options);
    tandem::DDPOptions ddp_options;
    ddp_options.bucket_cap_mb = options.bucket_mb;
    ddp_options.cache_cpu_allocations = !options.system_allocator;
    tandem::DistributedDataParallel ddp(model, pg, ddp_options);
    step = time_steps(*pg, model, inputs, labels, options);
  }
  pg->barrier();

  if (rank == 0) {
    nlohmann::json line = {{"impl", "tandem"},
                           {"world", pg->world_size()},
                           {"params", params},
                           {"width", options.width},
                           {"depth", options.depth},
                           {"batch", options.batch},
                           {"steps", options.steps},
                           {"warmup", options.warmup},
                           {"bucket_mb", options.bucket_mb},
                           {"step_ms", step[kStep]},
                           {"compute_ms", compute[kStep]},
                           {"allreduce_ms", allreduce_ms},
                           {"allreduce", "flat"},
                           {"shared_memory", pg->uses_shared_memory()},
                           {"ddp", phase_json(step)},
                           {"compute", phase_json(compute)}};
    std::cout << line.dump() << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"tandem DDP training-step benchmark (one rank)"};
  app.add_option("--width", options.width, "hidden width W")->check(CLI::PositiveNumber);
  app.add_option("--depth", options.depth, "hidden Linear(W, W) + ReLU layers")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", options.batch, "rows per rank")->check(CLI::PositiveNumber);
  app.add_option("--steps", options.steps, "timed steps per phase")->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "untimed steps per phase")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--bucket-mb", options.bucket_mb, "DDPOptions::bucket_cap_mb")
      ->check(CLI::PositiveNumber);
  app.add_flag("--system-allocator", options.system_allocator,
               "keep glibc's allocator instead of tandem's caching CPU allocator");
  CLI11_PARSE(app, argc, argv);
  try {
    run(options);
  } catch (const std::exception& e) {
    std::cerr << "bench_ddp: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
