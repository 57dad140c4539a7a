// Training step and per-rank memory under tandem's ZeRO (stages 1, 2, 3), with
// tandem's DistributedDataParallel + torch::optim::Adam as stage 0.
//
// A rank program: start it with `tandem launch` (or any launcher that sets
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT). bench_zero.py is its peer (PyTorch
// DDP, and ZeroRedundancyOptimizer as stage 1); compare_zero.py runs both.
//
// Model: depth x Sharded<Block>, Block(x) = x + relu(fc(norm(x))) with
// fc = Linear(W, W) and norm = LayerNorm(W), then Linear(W, 10) outside every
// unit; cross-entropy on a fixed random batch per rank; Adam (lr 1e-3).
// `warmup` untimed then `steps` timed steps, a barrier before each; a step's
// time is the slowest rank's and the figure reported is the median.
//
// Memory, per rank:
//   model_state_bytes  parameters + gradients + optimizer state held after the
//                      last step (ZeroOptimizer::memory_stats(); for stage 0
//                      the parameters, their .grad and Adam's moments), against
//                      ZeRO's formula: DDP 16Ψ, stage 1 4Ψ + 4Ψ + 8Ψ/N,
//                      stage 2 4Ψ + 12Ψ/N, stage 3 16Ψ/N (fp32 Adam).
//   baseline_rss       VmRSS once the process group is up, before the model.
//   peak_rss           VmHWM of the whole run (model construction included:
//                      every rank builds the whole model before sharding it,
//                      unless --meta-init builds it under tandem::zero::Init,
//                      which cuts each unit to this rank's shard as it is
//                      built).
//   loop_peak_rss      VmHWM over the training loop only: after setup the
//                      caching allocator's free blocks and glibc's free heap
//                      go back to the kernel and the high-water mark is reset
//                      (/proc/self/clear_refs), so this is the footprint the
//                      steps themselves need. loop_peak_rss - baseline_rss is
//                      what the table sets against the formula.
//
// Stage 3 also reports where a step's time goes (ZeroOptimizer::comm_stats(),
// per step, largest rank): the communication thread's all-gathers and
// reduce-scatters, and the part of them the training thread waited for; the
// rest of the step is compute.

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tandem/core/cpu_allocator.h"
#include "tandem/parallel/ddp.h"
#include "tandem/tandem.h"
#include "tandem/zero/init.h"
#include "tandem/zero/sharded.h"
#include "tandem/zero/zero_optimizer.h"

namespace {

constexpr std::int64_t kClasses = 10;
constexpr double kMiB = 1024.0 * 1024.0;

struct Options {
  int stage = 2;
  std::int64_t width = 2048;
  std::int64_t depth = 8;
  std::int64_t batch = 32;
  int steps = 15;
  int warmup = 3;
  double bucket_mb = 25.0;
  bool offload = false;
  bool system_allocator = false;
  bool meta_init = false;
  // Stage 3 limits (ZeroOptions), elements; -1: ZeroOptions' default.
  std::int64_t prefetch_bucket_size = -1;
  std::int64_t max_live_parameters = -1;
  std::int64_t persistence_threshold = -1;
  // HSDP: shard inside groups of this many consecutive ranks, replicate
  // across them (zero_hpz_partition_size); 1: plain ZeRO over the world.
  int hpz_partition_size = 1;
};

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(std::int64_t width) {
    fc = register_module("fc", torch::nn::Linear(width, width));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  }
  torch::Tensor forward(torch::Tensor x) { return x + torch::relu(fc(norm(x))); }
  torch::nn::Linear fc{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

struct StackImpl : torch::nn::Module {
  StackImpl(std::int64_t width, std::int64_t depth) {
    for (std::int64_t i = 0; i < depth; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i),
                                       tandem::Sharded<BlockImpl>(width)));
    }
    head = register_module("head", torch::nn::Linear(width, kClasses));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block->forward(x);
    return head(x);
  }
  std::vector<tandem::Sharded<BlockImpl>> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Stack);

// Columns of a step's timings, in the order they are stored.
enum Column { kStep, kForward, kBackward, kOptimizer, kColumns };

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

double since(std::chrono::steady_clock::time_point start,
             std::chrono::steady_clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

// A field of /proc/self/status ("VmRSS", "VmHWM") in bytes; -1 if absent.
std::int64_t proc_status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false if refused.
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

// Hands free memory back to the kernel: the caching allocator's blocks and
// glibc's free heap.
void return_free_memory() {
  if (tandem::cpu_caching_allocator_enabled()) tandem::release_cached_cpu_memory();
  malloc_trim(0);
}

double formula_bytes(int stage, double psi, double n) {
  switch (stage) {
    case 1: return 4 * psi + 4 * psi + 8 * psi / n;
    case 2: return 4 * psi + 12 * psi / n;
    case 3: return 16 * psi / n;
    default: return 16 * psi;
  }
}

// The step loop; zero_grad and step are the optimizer's (torch::optim or
// ZeroOptimizer). Returns per-column medians (ms) of the slowest rank.
std::vector<double> time_steps(tandem::ProcessGroup& pg, Stack& model, const at::Tensor& inputs,
                               const at::Tensor& labels, const Options& options,
                               const std::function<void()>& zero_grad,
                               const std::function<void()>& step) {
  using Clock = std::chrono::steady_clock;
  at::Tensor seconds = at::zeros({options.steps, kColumns}, at::kDouble);
  auto* out = seconds.data_ptr<double>();
  at::Tensor loss;
  for (int i = 0; i < options.warmup + options.steps; ++i) {
    pg.barrier();
    auto t0 = Clock::now();
    zero_grad();
    auto t1 = Clock::now();
    loss = torch::nn::functional::cross_entropy(model->forward(inputs), labels);
    auto t2 = Clock::now();
    loss.backward();
    auto t3 = Clock::now();
    step();
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
  TANDEM_CHECK(std::isfinite(last), "bench_zero: the loss is {}", last);
  pg.all_reduce(seconds, tandem::ReduceOp::kMax);
  std::vector<double> medians;
  for (std::int64_t c = 0; c < kColumns; ++c) {
    at::Tensor column = seconds.select(1, c).contiguous();
    const double* data = column.data_ptr<double>();
    medians.push_back(median(std::vector<double>(data, data + column.numel())) * 1e3);
  }
  return medians;
}

// Bytes of a DDP + torch::optim::Adam rank: parameters, their gradients (views
// of DDP's buckets) and the Adam moments.
tandem::ZeroMemoryStats ddp_memory(Stack& model, torch::optim::Adam& adam) {
  tandem::ZeroMemoryStats stats;
  for (const auto& p : model->parameters()) {
    stats.parameter_bytes += static_cast<std::int64_t>(p.nbytes());
    if (p.grad().defined()) stats.gradient_bytes += static_cast<std::int64_t>(p.grad().nbytes());
  }
  for (const auto& entry : adam.state()) {
    const auto& state = static_cast<const torch::optim::AdamParamState&>(*entry.second);
    for (const at::Tensor& t : {state.exp_avg(), state.exp_avg_sq(), state.max_exp_avg_sq()}) {
      if (t.defined()) stats.optimizer_state_bytes += static_cast<std::int64_t>(t.nbytes());
    }
  }
  return stats;
}

// Per-rank figures, gathered on every rank: row r is rank r's.
enum MemoryColumn {
  kModelState,
  kParameters,
  kGradients,
  kOptimizerState,
  kHost,
  kBaselineRss,
  kPeakRss,
  kSetupPeakRss,
  kLoopPeakRss,
  kEndRss,
  kEndShmemRss,
  kCachedBytes,
  kPeakGatheredBytes,
  kGatherMs,
  kReduceScatterMs,
  kGatherWaitMs,
  kDrainWaitMs,
  kMemoryColumns
};

std::vector<std::vector<double>> gather_rows(tandem::ProcessGroup& pg,
                                             const std::vector<double>& mine) {
  at::Tensor rows = at::zeros({pg.world_size(), kMemoryColumns}, at::kDouble);
  for (std::int64_t c = 0; c < kMemoryColumns; ++c) {
    rows[pg.rank()][c] = mine[static_cast<std::size_t>(c)];
  }
  pg.all_reduce(rows, tandem::ReduceOp::kSum);
  std::vector<std::vector<double>> out;
  for (std::int64_t r = 0; r < rows.size(0); ++r) {
    out.emplace_back();
    for (std::int64_t c = 0; c < kMemoryColumns; ++c) out.back().push_back(rows[r][c].item<double>());
  }
  return out;
}

void run(const Options& options) {
  // One intra-op thread per rank, as on the torch side (also the thread count
  // of ZeRO's CPU Adam: cpu_adam_threads 0 = the intra-op count).
  at::set_num_threads(1);
  // DDP installs tandem's caching CPU allocator; install it up front for every
  // stage so all of them run on the same allocator.
  if (!options.system_allocator) tandem::enable_cpu_caching_allocator();
  auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment());
  const int rank = pg->rank();
  const int world = pg->world_size();

  return_free_memory();
  const std::int64_t baseline_rss = proc_status_bytes("VmRSS");

  // Each rank its own fixed batch (as data-parallel shards would be).
  torch::manual_seed(1000 + rank);
  at::Tensor inputs = torch::randn({options.batch, options.width});
  at::Tensor labels = torch::randint(0, kClasses, {options.batch}, at::kLong);

  tandem::ZeroOptions zero_options;
  zero_options.stage = options.stage;
  zero_options.reduce_bucket_size = static_cast<std::int64_t>(options.bucket_mb * kMiB / 4);
  zero_options.offload_optimizer = options.offload;
  // Stage 3 prefetches one block ahead unless told otherwise: the depth
  // FSDP2, the peer compare_zero.py runs, prefetches by default. (ZeroOptions'
  // own default is DeepSpeed's 5e7 elements, three blocks at W = 4096.)
  const std::int64_t block_elements =
      (options.width * options.width + 3 * options.width + world - 1) / world * world;
  zero_options.prefetch_bucket_size =
      options.prefetch_bucket_size >= 0 ? options.prefetch_bucket_size : block_elements;
  if (options.max_live_parameters >= 0) {
    zero_options.max_live_parameters = options.max_live_parameters;
  }
  if (options.persistence_threshold >= 0) {
    zero_options.param_persistence_threshold = options.persistence_threshold;
  }

  torch::manual_seed(0);
  std::optional<tandem::zero::Init> init;
  if (options.meta_init) init.emplace(*pg, zero_options.param_persistence_threshold);
  Stack model(options.width, options.depth);
  init.reset();
  std::int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();

  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  std::unique_ptr<tandem::DistributedDataParallel> ddp;
  std::unique_ptr<tandem::ZeroOptimizer> zero;
  if (options.stage == 0) {
    tandem::DDPOptions ddp_options;
    ddp_options.bucket_cap_mb = options.bucket_mb;
    ddp_options.cache_cpu_allocations = !options.system_allocator;
    ddp = std::make_unique<tandem::DistributedDataParallel>(model, pg, ddp_options);
  } else if (options.hpz_partition_size > 1) {
    // Rows of the mesh are shard groups (P consecutive ranks); its columns
    // replicate, as the Accelerator's HSDP strategy lays them out.
    tandem::ProcessMesh mesh(pg, {world / options.hpz_partition_size, options.hpz_partition_size});
    zero = std::make_unique<tandem::ZeroOptimizer>(model, adam, mesh.group("local"),
                                                   mesh.group("host"), zero_options);
  } else {
    zero = std::make_unique<tandem::ZeroOptimizer>(model, adam, pg, zero_options);
  }

  // Setup is over: give back what it freed and start a fresh high-water mark.
  pg->barrier();
  const std::int64_t setup_peak_rss = proc_status_bytes("VmHWM");
  return_free_memory();
  const bool peak_reset = reset_peak_rss();

  std::vector<double> step;
  if (zero) zero->reset_stats();
  if (zero) {
    step = time_steps(*pg, model, inputs, labels, options, [&] { zero->zero_grad(); },
                      [&] { zero->step(); });
  } else {
    step = time_steps(*pg, model, inputs, labels, options, [&] { adam.zero_grad(); },
                      [&] { adam.step(); });
  }
  const std::int64_t loop_peak_rss = proc_status_bytes("VmHWM");
  const std::int64_t end_rss = proc_status_bytes("VmRSS");
  // Of which: shared memory (the transport's segment) and free blocks held by
  // the caching allocator.
  const std::int64_t end_shmem_rss = proc_status_bytes("RssShmem");
  const auto cached_bytes = static_cast<std::int64_t>(tandem::cpu_allocator_stats().cached_bytes);
  const tandem::ZeroMemoryStats stats = zero ? zero->memory_stats() : ddp_memory(model, adam);
  const std::int64_t peak_rss = std::max(setup_peak_rss, loop_peak_rss);
  // Per timed step, ms; the warm-up steps are in the sums too, so divide by
  // every step run.
  const tandem::ZeroOptimizer::CommStats comm =
      zero ? zero->comm_stats() : tandem::ZeroOptimizer::CommStats{};
  const double per_step_ms = 1e3 / (options.warmup + options.steps);

  std::vector<double> mine(kMemoryColumns);
  mine[kModelState] = static_cast<double>(stats.model_state_bytes());
  mine[kParameters] = static_cast<double>(stats.parameter_bytes);
  mine[kGradients] = static_cast<double>(stats.gradient_bytes);
  mine[kOptimizerState] = static_cast<double>(stats.optimizer_state_bytes);
  mine[kHost] = static_cast<double>(stats.host_bytes);
  mine[kBaselineRss] = static_cast<double>(baseline_rss);
  mine[kPeakRss] = static_cast<double>(peak_rss);
  mine[kSetupPeakRss] = static_cast<double>(setup_peak_rss);
  mine[kLoopPeakRss] = static_cast<double>(loop_peak_rss);
  mine[kEndRss] = static_cast<double>(end_rss);
  mine[kEndShmemRss] = static_cast<double>(end_shmem_rss);
  mine[kCachedBytes] = static_cast<double>(cached_bytes);
  mine[kPeakGatheredBytes] = static_cast<double>(stats.peak_gathered_parameter_bytes);
  mine[kGatherMs] = comm.gather_seconds * per_step_ms;
  mine[kReduceScatterMs] = comm.reduce_scatter_seconds * per_step_ms;
  mine[kGatherWaitMs] = comm.gather_wait_seconds * per_step_ms;
  mine[kDrainWaitMs] = comm.drain_wait_seconds * per_step_ms;
  const auto rows = gather_rows(*pg, mine);
  zero.reset();
  ddp.reset();
  pg->barrier();

  if (rank == 0) {
    auto column = [&](MemoryColumn c) {
      std::vector<std::int64_t> out;
      for (const auto& row : rows) out.push_back(static_cast<std::int64_t>(row[c]));
      return out;
    };
    auto max_of_double = [&](MemoryColumn c) {
      double out = 0;
      for (const auto& row : rows) out = std::max(out, row[c]);
      return out;
    };
    auto max_of = [&](MemoryColumn c) {
      auto values = column(c);
      return *std::max_element(values.begin(), values.end());
    };
    nlohmann::json line = {
        {"impl", "tandem"},
        {"stage", options.stage},
        {"optimizer", options.stage == 0 ? "ddp+torch::optim::Adam" : "ZeroOptimizer(Adam)"},
        {"world", world},
        {"params", params},
        {"width", options.width},
        {"depth", options.depth},
        {"batch", options.batch},
        {"steps", options.steps},
        {"warmup", options.warmup},
        {"bucket_mb", options.bucket_mb},
        {"offload", options.offload},
        {"meta_init", options.meta_init},
        {"prefetch_bucket_size", zero_options.prefetch_bucket_size},
        {"max_live_parameters", zero_options.max_live_parameters},
        {"param_persistence_threshold", zero_options.param_persistence_threshold},
        {"caching_allocator", !options.system_allocator},
        {"hpz_partition_size", options.hpz_partition_size},
        {"replicate_bytes_per_step", comm.last_step_replicate_bytes},
        {"step_ms", step[kStep]},
        {"forward_ms", step[kForward]},
        {"backward_ms", step[kBackward]},
        {"optimizer_ms", step[kOptimizer]},
        {"model_state_bytes", max_of(kModelState)},
        {"formula_bytes",
         static_cast<std::int64_t>(formula_bytes(options.stage, static_cast<double>(params), world))},
        {"peak_rss_bytes", max_of(kPeakRss)},
        {"loop_peak_rss_bytes", max_of(kLoopPeakRss)},
        {"peak_reset", peak_reset},
        {"peak_gathered_parameter_bytes", max_of(kPeakGatheredBytes)},
        {"gather_ms", max_of_double(kGatherMs)},
        {"reduce_scatter_ms", max_of_double(kReduceScatterMs)},
        {"gather_wait_ms", max_of_double(kGatherWaitMs)},
        {"drain_wait_ms", max_of_double(kDrainWaitMs)},
        {"compute_ms",
         step[kStep] - max_of_double(kGatherWaitMs) - max_of_double(kDrainWaitMs)},
        {"per_rank",
         {{"model_state_bytes", column(kModelState)},
          {"parameter_bytes", column(kParameters)},
          {"gradient_bytes", column(kGradients)},
          {"optimizer_state_bytes", column(kOptimizerState)},
          {"host_bytes", column(kHost)},
          {"baseline_rss_bytes", column(kBaselineRss)},
          {"peak_rss_bytes", column(kPeakRss)},
          {"setup_peak_rss_bytes", column(kSetupPeakRss)},
          {"loop_peak_rss_bytes", column(kLoopPeakRss)},
          {"end_rss_bytes", column(kEndRss)},
          {"end_shmem_rss_bytes", column(kEndShmemRss)},
          {"allocator_cached_bytes", column(kCachedBytes)}}}};
    std::cout << line.dump() << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"tandem ZeRO training-step and memory benchmark (one rank)"};
  app.add_option("--stage", options.stage, "0: DDP + torch::optim::Adam; 1, 2, 3: ZeroOptimizer")
      ->check(CLI::Range(0, 3));
  app.add_option("--width", options.width, "hidden width W")->check(CLI::PositiveNumber);
  app.add_option("--depth", options.depth, "Sharded blocks (Linear(W, W) + LayerNorm)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", options.batch, "rows per rank")->check(CLI::PositiveNumber);
  app.add_option("--steps", options.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "untimed steps")->check(CLI::NonNegativeNumber);
  app.add_option("--bucket-mb", options.bucket_mb,
                 "DDP bucket_cap_mb; ZeRO reduce_bucket_size = this many MiB of fp32")
      ->check(CLI::PositiveNumber);
  app.add_flag("--offload", options.offload, "ZeroOptions::offload_optimizer (stages 1-3)");
  app.add_flag("--meta-init", options.meta_init,
               "build the model under tandem::zero::Init (stage 3): each unit cut to this "
               "rank's shard as it is built");
  app.add_option("--prefetch-bucket-size", options.prefetch_bucket_size,
                 "stage 3: ZeroOptions::prefetch_bucket_size, elements (0: no prefetch; "
                 "default: one block, as FSDP2 prefetches)");
  app.add_option("--max-live-parameters", options.max_live_parameters,
                 "stage 3: ZeroOptions::max_live_parameters, elements");
  app.add_option("--persistence-threshold", options.persistence_threshold,
                 "stage 3: ZeroOptions::param_persistence_threshold, elements");
  app.add_flag("--system-allocator", options.system_allocator,
               "keep glibc's allocator instead of tandem's caching CPU allocator");
  app.add_option("--hpz-partition-size", options.hpz_partition_size,
                 "HSDP (stages 2, 3): shard inside groups of P consecutive ranks, replicate "
                 "across them; the world size must divide by P")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (options.hpz_partition_size > 1 && (options.stage < 2 || options.meta_init)) {
    std::cerr << "bench_zero: --hpz-partition-size needs --stage 2 or 3 and no --meta-init"
              << std::endl;
    return 2;
  }
  if (options.meta_init && options.stage != 3) {
    std::cerr << "bench_zero: --meta-init needs --stage 3 (only stage 3 adopts a model built "
                 "under zero::Init)"
              << std::endl;
    return 2;
  }
  try {
    run(options);
  } catch (const std::exception& e) {
    std::cerr << "bench_zero: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
