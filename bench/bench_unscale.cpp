// Fused unscale + inf/NaN check (tandem::unscale_and_find_inf) on float32
// CPU buffers of 1..256 MiB, against two peers in the same run:
//   * memcpy:  std::memcpy split over the same at::parallel_for threads, the
//              memory-bandwidth ceiling for a pass that reads and writes once;
//   * mul:     ATen's t.mul_(inv_scale), the multiply alone, with no check.
// torch's own unscale (_amp_foreach_non_finite_check_and_unscale_) had no CPU
// kernel in LibTorch 1.13, when this benchmark was written, so ATen's mul_ is
// the peer. PyTorch 2.13 has a CPU kernel for it, which this benchmark does not
// run yet.
//
// Every figure counts the bytes a pass reads plus the bytes it writes
// (2 x buffer size) over the median time of --reps passes. The last line is
// one JSON object: the figures at the largest size, then per-size lists.
//
//   build/bin/bench_unscale --min-mib 1 --max-mib 256 --reps 9

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tandem/amp/unscale.h"

namespace {

template <typename Pass>
double median_seconds(int reps, Pass pass) {
  pass(0);  // warm-up: faults the pages in
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    auto start = std::chrono::steady_clock::now();
    pass(r + 1);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fused unscale + inf check vs memcpy and at::mul_"};
  int64_t min_mib = 1;
  int64_t max_mib = 256;
  int reps = 9;
  int threads = 0;
  app.add_option("--min-mib", min_mib, "smallest buffer, MiB");
  app.add_option("--max-mib", max_mib, "largest buffer, MiB (sizes go up by 4x)");
  app.add_option("--reps", reps, "timed passes per size (the median counts)");
  app.add_option("--threads", threads, "at::set_num_threads (0: ATen's default)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (threads > 0) at::set_num_threads(threads);
    constexpr int64_t kGrain = 1 << 16;  // UnscaleOptions' default, for memcpy too
    nlohmann::json sizes = nlohmann::json::array();
    nlohmann::json unscale_by_size = nlohmann::json::array();
    nlohmann::json memcpy_by_size = nlohmann::json::array();
    nlohmann::json mul_by_size = nlohmann::json::array();
    double unscale_gbps = 0, memcpy_gbps = 0, mul_gbps = 0;
    bool any_inf = false;

    for (int64_t mib = min_mib; mib <= max_mib; mib *= 4) {
      const int64_t n = mib * (int64_t{1} << 20) / static_cast<int64_t>(sizeof(float));
      at::Tensor grads = at::randn({n}, at::kFloat);
      at::Tensor dst = at::empty_like(grads);
      const double bytes = 2.0 * static_cast<double>(n) * sizeof(float);
      // Alternating 0.5 and 2 keeps the values exact and away from denormals.
      auto inv = [](int pass) { return pass % 2 == 0 ? 0.5 : 2.0; };

      const float* src = grads.data_ptr<float>();
      float* out = dst.data_ptr<float>();
      const double t_memcpy = median_seconds(reps, [&](int) {
        at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
          std::memcpy(out + b, src + b, static_cast<size_t>(e - b) * sizeof(float));
        });
      });
      const double t_mul = median_seconds(reps, [&](int pass) { grads.mul_(inv(pass)); });
      const double t_unscale = median_seconds(reps, [&](int pass) {
        any_inf = tandem::unscale_and_find_inf({grads}, inv(pass)) || any_inf;
      });

      unscale_gbps = bytes / t_unscale / 1e9;
      memcpy_gbps = bytes / t_memcpy / 1e9;
      mul_gbps = bytes / t_mul / 1e9;
      std::printf("%6lld MiB  unscale %7.2f GB/s  memcpy %7.2f GB/s  mul_ %7.2f GB/s\n",
                  static_cast<long long>(mib), unscale_gbps, memcpy_gbps, mul_gbps);
      std::fflush(stdout);
      sizes.push_back(mib);
      unscale_by_size.push_back(unscale_gbps);
      memcpy_by_size.push_back(memcpy_gbps);
      mul_by_size.push_back(mul_gbps);
    }
    if (any_inf) {
      std::fprintf(stderr, "bench_unscale: unexpected inf/NaN in random data\n");
      return 1;
    }

    nlohmann::ordered_json result;
    result["unscale_gbps"] = unscale_gbps;
    result["memcpy_gbps"] = memcpy_gbps;
    result["mul_gbps"] = mul_gbps;
    result["mib"] = sizes.empty() ? 0 : sizes.back().get<int64_t>();
    result["threads"] = at::get_num_threads();
    result["sizes_mib"] = sizes;
    result["unscale_gbps_by_size"] = unscale_by_size;
    result["memcpy_gbps_by_size"] = memcpy_by_size;
    result["mul_gbps_by_size"] = mul_by_size;
    std::printf("%s\n", result.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_unscale: %s\n", e.what());
    return 1;
  }
  return 0;
}
