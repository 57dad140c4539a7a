// Bandwidth of tandem's CPU collectives: all-reduce, all-gather,
// reduce-scatter and all-to-all (shared memory on one host, or Gloo with
// --no-shm). Across hosts, --hierarchical off|auto|leader|split picks the
// flat Gloo path or a hierarchical form (docs/comm.md), so that one job can
// time both by running this twice; the JSON line says which path ran
// ("path": "shm", "flat", "split" or "leader").
//
// A rank program: start it with `tandem launch` (or any launcher that sets
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT). bench_allreduce.py is its peer and
// measures torch.distributed the same way; compare_allreduce.py runs both.
//
// Per size: `warmup` untimed iterations, then `iters` timed float32 calls
// (kSum where the op reduces), each preceded by a barrier. An iteration's
// time is the slowest rank's; the figure reported is the median over
// iterations. The size is the whole buffer: the all-reduced tensor, the
// gathered output, the reduce-scattered input, the all-to-all's input.
// Bandwidths follow nccl-tests: algbw = bytes / time, busbw = algbw *
// 2(n-1)/n for all-reduce and algbw * (n-1)/n for the others.

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
  std::string op = "all_reduce";  // or all_gather, reduce_scatter, all_to_all, send_recv
  bool shared_memory = true;
  std::string hierarchical = "auto";  // or off, leader, split
  std::vector<double> sizes_mb = {1, 4, 16, 64, 256};
  int iters = 20;
  int warmup = 5;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// One collective of the benchmark on buffers made for it.
class Collective {
 public:
  Collective(tandem::ProcessGroup& pg, const std::string& op, std::int64_t numel)
      : pg_(pg), op_(op), world_(pg.world_size()) {
    // The whole buffer holds numel elements, a multiple of the world size.
    numel -= numel % world_;
    whole_ = at::ones({numel}, at::kFloat);
    part_ = at::ones({numel / world_}, at::kFloat);
    if (op_ == "all_to_all" || op_ == "send_recv") received_ = at::ones({numel}, at::kFloat);
  }

  void run() {
    if (op_ == "all_reduce") {
      pg_.all_reduce(whole_, tandem::ReduceOp::kSum);
    } else if (op_ == "all_gather") {
      pg_.all_gather_into(whole_, part_);
    } else if (op_ == "all_to_all") {
      pg_.all_to_all(received_, whole_);
    } else if (op_ == "send_recv") {
      // A ring: every rank sends its buffer to the next and receives the
      // previous one's, both in flight at once.
      const int next = (pg_.rank() + 1) % world_;
      const int prev = (pg_.rank() + world_ - 1) % world_;
      tandem::Work receiving = pg_.recv_async(received_, prev);
      tandem::Work sending = pg_.send_async(whole_, next);
      sending.wait();
      receiving.wait();
    } else {
      pg_.reduce_scatter(part_, whole_, tandem::ReduceOp::kSum);
    }
  }

  // One checked call, so a broken collective cannot post a fast time; then
  // zeros, which stay finite however many times they are summed.
  void check_then_zero() {
    part_.fill_(static_cast<float>(pg_.rank() + 1));
    const bool exchanges = op_ == "all_to_all" || op_ == "send_recv";
    if (exchanges) whole_.fill_(static_cast<float>(pg_.rank() + 1));
    run();
    const at::Tensor& out = op_ == "reduce_scatter" ? part_ : (exchanges ? received_ : whole_);
    // A sum of world ones, rank 0's part (first in the gathered or exchanged
    // buffer), or the previous rank's buffer.
    const float want = op_ == "send_recv"
                           ? static_cast<float>((pg_.rank() + world_ - 1) % world_ + 1)
                           : (op_ == "all_gather" || op_ == "all_to_all" ? 1.0f
                                                                         : static_cast<float>(world_));
    TANDEM_CHECK(out.numel() == 0 || out[0].item<float>() == want,
                 "bench_allreduce: {} returned {}, expected {}", op_, out[0].item<float>(), want);
    whole_.zero_();
    part_.zero_();
    if (received_.defined()) received_.zero_();
  }

  std::int64_t bytes() const { return whole_.numel() * static_cast<std::int64_t>(sizeof(float)); }

 private:
  tandem::ProcessGroup& pg_;
  std::string op_;
  int world_;
  at::Tensor whole_;
  at::Tensor part_;
  at::Tensor received_;  // all_to_all's output
};

// Returns the median over iterations of the slowest rank's time, in seconds.
double time_collective(tandem::ProcessGroup& pg, Collective& collective, const Options& options) {
  collective.check_then_zero();
  for (int i = 0; i < options.warmup; ++i) collective.run();

  at::Tensor seconds = at::zeros({options.iters}, at::kDouble);
  auto* out = seconds.data_ptr<double>();
  for (int i = 0; i < options.iters; ++i) {
    pg.barrier();
    auto start = std::chrono::steady_clock::now();
    collective.run();
    out[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  pg.all_reduce(seconds, tandem::ReduceOp::kMax);
  return median(std::vector<double>(out, out + options.iters));
}

// Runs every size and prints the results on rank 0.
void run(const Options& options) {
  // Gloo's reduction runs on the calling thread; keep ATen from competing.
  at::set_num_threads(1);
  tandem::ProcessGroupOptions pg_options;
  pg_options.shared_memory = options.shared_memory;
  pg_options.hierarchical = tandem::parse_hierarchical(options.hierarchical);
  auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment(), pg_options);
  const int world = pg->world_size();
  const double ring_factor = world > 1 ? (world - 1.0) / world : 0.0;
  // Bus bandwidth as nccl-tests define it; a ring of sends moves each
  // rank's whole buffer once (factor 1).
  const double bus_factor = options.op == "all_reduce"
                                ? 2.0 * ring_factor
                                : (options.op == "send_recv" ? (world > 1 ? 1.0 : 0.0) : ring_factor);

  nlohmann::json results = nlohmann::json::array();
  for (double mb : options.sizes_mb) {
    Collective collective(*pg, options.op,
                          static_cast<std::int64_t>(mb * kBytesPerMb / sizeof(float)));
    double seconds = time_collective(*pg, collective, options);
    double algbw = static_cast<double>(collective.bytes()) / seconds / 1e9;
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
    nlohmann::json line = {{"impl", "tandem"},
                           {"op", options.op},
                           {"transport", pg->uses_shared_memory() ? "shm" : pg->backend_name()},
                           {"path", pg->uses_shared_memory()  ? "shm"
                                    : pg->uses_hierarchical() ? pg->hierarchical_form()
                                                              : "flat"},
                           {"hierarchical", options.hierarchical},
                           {"world", world},
                           {"results", results}};
    std::cout << line.dump() << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"tandem collective bandwidth benchmark (one rank)"};
  app.add_option("--op", options.op, "collective to time")
      ->check(CLI::IsMember({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}));
  app.add_flag("!--no-shm", options.shared_memory,
               "use Gloo even when every rank is on one host");
  app.add_option("--hierarchical", options.hierarchical,
                 "across hosts: off (one flat Gloo group), auto, leader or split")
      ->check(CLI::IsMember({"auto", "off", "leader", "split"}));
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
