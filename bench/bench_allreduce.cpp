// All-reduce bandwidth of tandem's ProcessGroup (Gloo on CPU).
//
// A rank program: start it with `tandem launch` (or any launcher that sets
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT). bench_allreduce.py is its peer and
// measures torch.distributed the same way; compare_allreduce.py runs both.
//
// Per size: `warmup` untimed iterations, then `iters` timed all_reduce(kSum)
// calls, each preceded by a barrier. An iteration's time is the slowest
// rank's; the figure reported is the median over iterations. Bandwidths follow
// nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tandem/tandem.h"

namespace {

constexpr double kBytesPerMb = 1024.0 * 1024.0;

struct Options {
  std::vector<double> sizes_mb = {1, 4, 16, 64, 256};
  int iters = 20;
  int warmup = 5;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// Returns the median over iterations of the slowest rank's time, in seconds.
double time_all_reduce(tandem::ProcessGroup& pg, double mb, const Options& options) {
  auto numel = static_cast<std::int64_t>(mb * kBytesPerMb / sizeof(float));
  at::Tensor tensor = at::ones({numel}, at::kFloat);

  // One checked reduction, so a broken collective cannot post a fast time.
  pg.all_reduce(tensor, tandem::ReduceOp::kSum);
  TANDEM_CHECK(numel == 0 || tensor[0].item<float>() == pg.world_size(),
               "all_reduce returned ", tensor[0].item<float>(), ", expected ", pg.world_size());
  // Zeros stay finite however many times they are summed.
  tensor.zero_();

  for (int i = 0; i < options.warmup; ++i) pg.all_reduce(tensor, tandem::ReduceOp::kSum);

  at::Tensor seconds = at::zeros({options.iters}, at::kDouble);
  auto* out = seconds.data_ptr<double>();
  for (int i = 0; i < options.iters; ++i) {
    pg.barrier();
    auto start = std::chrono::steady_clock::now();
    pg.all_reduce(tensor, tandem::ReduceOp::kSum);
    out[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  pg.all_reduce(seconds, tandem::ReduceOp::kMax);
  return median(std::vector<double>(out, out + options.iters));
}

// Runs every size and prints the results on rank 0.
void run(const Options& options) {
  // Gloo's reduction runs on the calling thread; keep ATen from competing.
  at::set_num_threads(1);
  auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment());
  const int world = pg->world_size();
  const double bus_factor = world > 1 ? 2.0 * (world - 1) / world : 0.0;

  nlohmann::json results = nlohmann::json::array();
  for (double mb : options.sizes_mb) {
    double seconds = time_all_reduce(*pg, mb, options);
    double algbw = mb * kBytesPerMb / seconds / 1e9;
    if (pg->rank() == 0) {
      std::printf("%10.2f MiB %10.3f ms  algbw %7.3f GB/s  busbw %7.3f GB/s\n", mb,
                  seconds * 1e3, algbw, algbw * bus_factor);
      std::fflush(stdout);
    }
    results.push_back({{"mb", mb},
                       {"time_ms", seconds * 1e3},
                       {"algbw_gbps", algbw},
                       {"busbw_gbps", algbw * bus_factor}});
  }
  if (pg->rank() == 0) {
    nlohmann::json line = {{"impl", "tandem"}, {"world", world}, {"results", results}};
    std::cout << line.dump() << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"tandem all-reduce bandwidth benchmark (one rank)"};
  app.add_option("--sizes-mb", options.sizes_mb, "message sizes in MiB, comma separated")
      ->delimiter(',');
  app.add_option("--iters", options.iters, "timed iterations per size")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "untimed iterations per size")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    run(options);
  } catch (const std::exception& e) {
    std::cerr << "bench_allreduce: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
