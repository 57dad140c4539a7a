// One Adam step over P float32 parameters on the CPU, three ways in one run:
//   * kernel:    tandem::cpu_adam_step on flat arrays (what ZeRO-Offload calls);
//   * CpuAdam:   tandem::CpuAdam, the drop-in optimizer, on one P-element tensor;
//   * torch:     torch::optim::Adam (LibTorch C++) on one P-element tensor,
//                with at::set_num_threads(T), the same thread count.
// Each side runs --warmup untimed steps (page faults, state allocation), then
// --steps timed ones; the figure is P / median step time. Only one side's
// arrays are alive at a time. The last line is one JSON object.
//
//   build/bin/bench_cpu_adam --params 100000000 --threads 2 --steps 20

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <vector>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tandem/optim/cpu_adam.h"

namespace {

// Median seconds of `steps` calls of step(k), k = warmup + 1, ..., after
// `warmup` untimed calls k = 1 ... warmup.
double median_step_seconds(int warmup, int steps, const std::function<void(int64_t)>& step) {
  for (int k = 1; k <= warmup; ++k) step(k);
  std::vector<double> times;
  for (int k = 1; k <= steps; ++k) {
    const auto start = std::chrono::steady_clock::now();
    step(warmup + k);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU Adam step: tandem's fused kernel vs torch::optim::Adam"};
  int64_t params = 50'000'000;
  int threads = 0;
  int steps = 20;
  int warmup = 3;
  double weight_decay = 0.0;
  bool skip_torch = false;
  app.add_option("--params", params, "float32 parameters per step");
  app.add_option("--threads", threads, "threads for both sides (0: ATen's default)");
  app.add_option("--steps", steps, "timed steps per side (the median counts)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps per side first");
  app.add_option("--weight-decay", weight_decay, "Adam's (L2) weight decay, both sides");
  app.add_flag("--no-torch", skip_torch, "measure tandem only");
  CLI11_PARSE(app, argc, argv);

  try {
    if (threads > 0) at::set_num_threads(threads);
    threads = at::get_num_threads();
    const double p = static_cast<double>(params);
    const torch::optim::AdamOptions options =
        torch::optim::AdamOptions(1e-3).weight_decay(weight_decay);

    double kernel_s = 0;
    {
      // randn/zeros write every page, so the timed steps fault none in.
      torch::Tensor param = torch::randn({params});
      torch::Tensor grad = torch::randn({params}) * 1e-2;
      torch::Tensor exp_avg = torch::zeros({params});
      torch::Tensor exp_avg_sq = torch::zeros({params});
      tandem::AdamHyperparams h;
      h.lr = options.lr();
      h.weight_decay = weight_decay;
      kernel_s = median_step_seconds(warmup, steps, [&](int64_t k) {
        tandem::cpu_adam_step(param.data_ptr<float>(), grad.data_ptr<float>(),
                              exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(), params, k,
                              h, threads);
      });
    }
    std::printf("tandem kernel   %8.3f Gparam/s  (%.2f ms/step, %.1f GB/s at 28 B/param)\n",
                p / kernel_s / 1e9, kernel_s * 1e3, 28 * p / kernel_s / 1e9);
    std::fflush(stdout);

    // The optimizers' steps count from their own state, so `k` goes unused.
    auto optimizer_seconds = [&](auto make_optimizer) {
      torch::Tensor param = torch::randn({params}).requires_grad_(true);
      param.mutable_grad() = torch::randn({params}) * 1e-2;
      auto optimizer = make_optimizer(param);
      return median_step_seconds(warmup, steps, [&](int64_t) { optimizer->step(); });
    };
    const double cpu_adam_s = optimizer_seconds([&](const torch::Tensor& param) {
      return std::make_unique<tandem::CpuAdam>(std::vector<torch::Tensor>{param}, options,
                                               threads);
    });
    std::printf("tandem CpuAdam  %8.3f Gparam/s  (%.2f ms/step)\n", p / cpu_adam_s / 1e9,
                cpu_adam_s * 1e3);
    std::fflush(stdout);

    double torch_s = 0;
    if (!skip_torch) {
      torch_s = optimizer_seconds([&](const torch::Tensor& param) {
        return std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{param}, options);
      });
      std::printf("torch Adam      %8.3f Gparam/s  (%.2f ms/step)\n", p / torch_s / 1e9,
                  torch_s * 1e3);
    }

    nlohmann::ordered_json result;
    result["gparams_per_s"] = p / kernel_s / 1e9;
    result["torch_gparams_per_s"] = skip_torch ? nlohmann::ordered_json() : nlohmann::ordered_json(p / torch_s / 1e9);
    result["threads"] = threads;
    result["params"] = params;
    result["isa"] = tandem::cpu_adam_isa();
    result["cpu_adam_optimizer_gparams_per_s"] = p / cpu_adam_s / 1e9;
    result["ratio_vs_torch"] = skip_torch ? nlohmann::ordered_json() : nlohmann::ordered_json(torch_s / kernel_s);
    result["kernel_gbytes_per_s"] = 28 * p / kernel_s / 1e9;
    result["steps"] = steps;
    result["warmup"] = warmup;
    result["weight_decay"] = weight_decay;
    std::printf("%s\n", result.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cpu_adam: %s\n", e.what());
    return 1;
  }
  return 0;
}
