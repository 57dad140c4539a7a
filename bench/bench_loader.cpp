// Parallel data loading: tandem::DistributedLoader with W worker threads
// against LibTorch's own loader (torch::data::make_data_loader with
// DataLoaderOptions().workers(W)) over the same dataset, in the same run.
//
// Sample i of the dataset busy-waits --transform-us microseconds (a decode
// or augmentation stand-in that holds a core, as real transforms do), then
// builds data = full({features}, i) and target = i; both loaders stack
// them into batches of --batch-size, keep at most 2 * W batches in flight
// (LibTorch's default max_jobs, tandem's default prefetch_factor) and yield
// them in order. One pass is --batches batches, world size 1. The two
// loaders alternate (and who goes first) over --reps passes each; the
// median pass counts. The last line is one JSON object.
//
//   build/bin/bench_loader --workers 2 --transform-us 1000 --batches 64

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/data.h>

#include "tandem/data/distributed_loader.h"

namespace {

using Clock = std::chrono::steady_clock;

class BusyDataset : public torch::data::datasets::Dataset<BusyDataset> {
 public:
  BusyDataset(int64_t size, int64_t transform_us, int64_t features)
      : size_(size), transform_us_(transform_us), features_(features) {}

  torch::data::Example<> get(size_t index) override {
    const auto until = Clock::now() + std::chrono::microseconds(transform_us_);
    while (Clock::now() < until) {
    }
    const auto i = static_cast<int64_t>(index);
    return {at::full({features_}, static_cast<double>(i)), at::scalar_tensor(i, at::kLong)};
  }
  c10::optional<size_t> size() const override { return static_cast<size_t>(size_); }

 private:
  int64_t size_;
  int64_t transform_us_;
  int64_t features_;
};

// Seconds for one pass; checks that every sample arrived once.
template <typename Loader, typename Target>
double time_pass(Loader& loader, int64_t expected_samples, Target target_of) {
  const auto start = Clock::now();
  int64_t samples = 0;
  int64_t checksum = 0;
  for (auto& batch : loader) {
    const at::Tensor t = target_of(batch);
    samples += t.size(0);
    checksum += t.sum().template item<int64_t>();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t n = expected_samples;
  if (samples != n || checksum != n * (n - 1) / 2) {
    std::fprintf(stderr,
                 "bench_loader: a pass yielded %lld samples (checksum %lld), expected %lld\n",
                 static_cast<long long>(samples), static_cast<long long>(checksum),
                 static_cast<long long>(n));
    std::exit(1);
  }
  return seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tandem::DistributedLoader workers vs torch::data::make_data_loader workers"};
  int64_t workers = 2;
  int64_t transform_us = 1000;
  int64_t batches = 64;
  int64_t batch_size = 16;
  int64_t features = 64;
  int reps = 3;
  app.add_option("--workers", workers, "worker threads in both loaders (0: in the main thread)");
  app.add_option("--transform-us", transform_us, "busy-wait per sample, microseconds");
  app.add_option("--batches", batches, "batches per pass");
  app.add_option("--batch-size", batch_size, "samples per batch");
  app.add_option("--features", features, "floats per sample");
  app.add_option("--reps", reps, "passes per loader (the median counts)");
  CLI11_PARSE(app, argc, argv);

  try {
    const int64_t n = batches * batch_size;
    tandem::DistributedLoaderOptions options;
    options.batch_size = batch_size;
    options.num_workers = workers;
    options.prefetch_factor = 2;
    auto ours = tandem::make_distributed_loader(BusyDataset(n, transform_us, features), 1, 0,
                                                options);
    auto theirs = torch::data::make_data_loader(
        BusyDataset(n, transform_us, features).map(torch::data::transforms::Stack<>()),
        torch::data::DataLoaderOptions().batch_size(static_cast<size_t>(batch_size))
            .workers(static_cast<size_t>(workers)));

    std::vector<double> ours_s;
    std::vector<double> theirs_s;
    auto run_ours = [&] {
      ours_s.push_back(time_pass(ours, n, [](auto& b) { return b.at(1); }));
    };
    auto run_theirs = [&] {
      theirs_s.push_back(time_pass(*theirs, n, [](auto& b) { return b.target; }));
    };
    for (int r = 0; r < reps; ++r) {
      if (r % 2 == 0) {
        run_ours();
        run_theirs();
      } else {
        run_theirs();
        run_ours();
      }
      std::printf("rep %d: tandem %.4f s, torch %.4f s\n", r, ours_s.back(), theirs_s.back());
    }
    const double ours_rate = static_cast<double>(n) / median(ours_s);
    const double theirs_rate = static_cast<double>(n) / median(theirs_s);
    nlohmann::json out = {{"samples_per_s", ours_rate},
                          {"torch_samples_per_s", theirs_rate},
                          {"ratio", ours_rate / theirs_rate},
                          {"workers", workers},
                          {"transform_us", transform_us},
                          {"batches", batches},
                          {"batch_size", batch_size},
                          {"features", features},
                          {"reps", reps}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_loader: %s\n", e.what());
    return 1;
  }
}
