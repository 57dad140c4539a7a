// Cost of the desync check: time per all-reduce with the check off and with
// it on for every collective (debug mode; by default only the first 256
// collectives pay it), on both CPU transports.
//
// Ranks run as threads over an in-memory c10d::HashStore, as in the tests:
// the figure of interest is the difference the check makes, and both sides
// run in the same process, alternated over --reps repetitions. Per case:
// `warmup` untimed all-reduces, then `iters` timed ones on every rank; the
// time is rank 0's mean per call, median over repetitions. Prints a table,
// then one JSON line.
//
//   build/bin/bench_desync [--worlds 2,4] [--sizes-kib 1,1024] [--iters 300] [--reps 3]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "tandem/tandem.h"

namespace {

struct Options {
  std::vector<int> worlds = {2, 4};
  std::vector<double> sizes_kib = {1, 1024};
  int iters = 300;
  int warmup = 20;
  int reps = 3;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// Mean microseconds per all_reduce on rank 0.
double time_case(int world, bool shared_memory, bool checked, std::int64_t numel,
                 const Options& options) {
  tandem::ProcessGroupOptions pg_options;
  pg_options.shared_memory = shared_memory;
  pg_options.desync_check_collectives = 0;
  pg_options.debug_detail = checked;
  pg_options.timeout = std::chrono::seconds(60);
  auto store = c10::make_intrusive<c10d::HashStore>();
  double micros = 0;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto pg = tandem::ProcessGroup::create(store, rank, world, pg_options);
      at::Tensor t = at::zeros({numel}, at::kFloat);
      for (int i = 0; i < options.warmup; ++i) pg->all_reduce(t);
      pg->barrier();
      auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < options.iters; ++i) pg->all_reduce(t);
      auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
      if (rank == 0) micros = seconds.count() * 1e6 / options.iters;
      pg->barrier();
    });
  }
  for (auto& t : threads) t.join();
  return micros;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Time per all-reduce with and without the desync check"};
  app.add_option("--worlds", options.worlds, "ranks (threads)")->delimiter(',');
  app.add_option("--sizes-kib", options.sizes_kib, "message sizes in KiB")->delimiter(',');
  app.add_option("--iters", options.iters, "timed all-reduces per case");
  app.add_option("--warmup", options.warmup, "untimed all-reduces per case");
  app.add_option("--reps", options.reps, "repetitions (median)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);

  nlohmann::json results = nlohmann::json::array();
  std::printf("%-10s %5s %10s %12s %12s %10s\n", "transport", "world", "KiB", "off us/call",
              "on us/call", "overhead");
  for (bool shm : {true, false}) {
    for (int world : options.worlds) {
      for (double kib : options.sizes_kib) {
        const auto numel = static_cast<std::int64_t>(kib * 1024 / sizeof(float));
        std::vector<double> off;
        std::vector<double> on;
        for (int rep = 0; rep < options.reps; ++rep) {
          // Alternate who goes first so that drift favours neither side.
          if (rep % 2 == 0) {
            off.push_back(time_case(world, shm, false, numel, options));
            on.push_back(time_case(world, shm, true, numel, options));
          } else {
            on.push_back(time_case(world, shm, true, numel, options));
            off.push_back(time_case(world, shm, false, numel, options));
          }
        }
        const double off_us = median(off);
        const double on_us = median(on);
        std::printf("%-10s %5d %10.0f %12.1f %12.1f %+9.1f us\n", shm ? "shm" : "gloo", world, kib,
                    off_us, on_us, on_us - off_us);
        results.push_back({{"transport", shm ? "shm" : "gloo"},
                           {"world", world},
                           {"kib", kib},
                           {"off_us", off_us},
                           {"on_us", on_us},
                           {"overhead_us", on_us - off_us}});
      }
    }
  }
  std::cout << nlohmann::json{{"bench", "desync"}, {"results", results}}.dump() << std::endl;
  return 0;
}
