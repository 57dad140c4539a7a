// 4.4 ZeRO-Offload on the GPU: parameters and activations on the GPU, fp32
// master shards, gradient shards and Adam's state in pinned host memory,
// updated by tandem's CPU Adam, with asynchronous copies both ways. Training
// matches the same run without offload (stages 2 and 3, offload_param too),
// at two ranks (processes) sharing the GPU; and one rank's step time with and
// without offload goes into the GPU kit's summary.

#include <chrono>
#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/core/rank_env.h"
#include "tandem/optim/cpu_adam.h"

namespace tandem {
namespace gpu_offload_test {


// The runs without and with offload, on one rank of two.
TEST(GpuOffload, Worker) {
  const std::string dir = testing::gpu_worker_dir();
  if (dir.empty()) GTEST_SKIP() << "a worker of GpuOffload (launch_gpu_workers runs it)";
  auto pg = ProcessGroup::init(RankEnv::from_environment());
  testing::Recipe r;
  r.width = 19;
  r.opt = testing::Opt::kAdamW;
  r.device = testing::gpu_worker_device();
  for (int stage : {2, 3}) {
    ZeroOptions plain = stage == 3 ? testing::stage3() : ZeroOptions{};
    plain.stage = stage;
    plain.reduce_bucket_size = 150;
    const std::string s = std::to_string(stage);
    testing::write_worker_result(dir, "plain" + s, pg->rank(), testing::train_zero(*pg, r, plain));
    for (bool offload_param : {false, true}) {
      if (offload_param && stage != 3) continue;
      ZeroOptions offload = plain;
      offload.offload_optimizer = true;
      offload.offload_param = offload_param;
      auto got = testing::train_zero(*pg, r, offload, [&](ZeroOptimizer& zero, auto&) {
        EXPECT_GT(zero.memory_stats().host_bytes, 0) << "nothing was offloaded";
      });
      testing::write_worker_result(dir, (offload_param ? "offload_param" : "offload") + s,
                                   pg->rank(), got);
    }
  }
}

TEST(GpuOffload, OptimizerAndParameterOffloadTrainLikeTheRunWithout) {
  TANDEM_REQUIRE_CUDA();
  testing::ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(testing::launch_gpu_workers("GpuOffload.Worker", 2, dir.path()));
  for (const auto& [run, plain] : std::vector<std::pair<std::string, std::string>>{
           {"offload2", "plain2"}, {"offload3", "plain3"}, {"offload_param3", "plain3"}}) {
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_LT(testing::max_relative_diff(testing::read_worker_result(dir.path(), run, rank),
                                           testing::read_worker_result(dir.path(), plain, rank)),
                1e-5)
          << run << " rank " << rank;
    }
  }
}

// One rank's ZeRO run of recipe `r` on a fixed micro-batch, for timing.
struct TimedRun {
  TimedRun(ProcessGroup& pg, const testing::Recipe& r, const ZeroOptions& options)
      : model(testing::make_model(r)),
        optimizer(testing::make_optimizer(r.opt, model->parameters())),
        zero(model, *optimizer, pg.shared_from_this(), options),
        batch(testing::micro_batch(r, 0, 0, 0, 1)) {}
  void forward_backward() {
    torch::nn::functional::cross_entropy(model->forward(batch.first), batch.second).backward();
  }
  testing::Stack model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ZeroOptimizer zero;
  std::pair<torch::Tensor, torch::Tensor> batch;
};

// Milliseconds of each part of a step, each part waited for on its own
// (which removes overlap: for finding where the time goes, not a step time).
struct StepParts {
  double zero_grad_ms = 0, forward_backward_ms = 0, step_ms = 0, reduce_scatter_ms = 0,
         drain_wait_ms = 0;
};

StepParts step_parts(ProcessGroup& pg, const testing::Recipe& r, const ZeroOptions& options,
                     int steps) {
  TimedRun run(pg, r, options);
  StepParts parts;
  auto timed = [](double& total, const std::function<void()>& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    torch::cuda::synchronize();
    total += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                 .count();
  };
  for (int i = 0; i < steps + 3; ++i) {
    if (i == 3) {
      parts = StepParts{};
      run.zero.reset_stats();
    }
    timed(parts.zero_grad_ms, [&] { run.zero.zero_grad(); });
    timed(parts.forward_backward_ms, [&] { run.forward_backward(); });
    timed(parts.step_ms, [&] { run.zero.step(); });
  }
  const auto stats = run.zero.comm_stats();
  parts.reduce_scatter_ms = 1e3 * stats.reduce_scatter_seconds;
  parts.drain_wait_ms = 1e3 * stats.drain_wait_seconds;
  for (double* v : {&parts.zero_grad_ms, &parts.forward_backward_ms, &parts.step_ms,
                    &parts.reduce_scatter_ms, &parts.drain_wait_ms}) {
    *v /= steps;
  }
  return parts;
}

// Milliseconds per optimizer step (forward, backward, step) over `steps`
// steps after three warm-up steps, at world 1 on the GPU.
double step_ms(ProcessGroup& pg, const testing::Recipe& r, const ZeroOptions& options,
               int steps) {
  TimedRun run(pg, r, options);
  return testing::gpu_ms_per_call(3, steps, [&] {
    run.zero.zero_grad();
    run.forward_backward();
    run.zero.step();
  });
}

// Where an offloaded step's time can go, for `n` fp32 parameters: CPU Adam
// over all of them, and one pinned copy of them each way.
struct OffloadParts {
  double cpu_adam_ms, d2h_ms, h2d_ms;
};

OffloadParts offload_parts(int64_t n) {
  auto host = [n] { return torch::rand({n}).pin_memory(); };
  at::Tensor p = host(), g = host(), m = torch::zeros({n}), v = torch::zeros({n});
  AdamHyperparams h;
  int64_t step = 0;
  OffloadParts parts{};
  parts.cpu_adam_ms = testing::gpu_ms_per_call(1, 5, [&] {
    cpu_adam_step(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                  v.data_ptr<float>(), n, ++step, h);
  });
  at::Tensor device = torch::rand({n}, torch::Device(torch::kCUDA, 0));
  parts.d2h_ms = testing::gpu_ms_per_call(1, 5, [&] { g.copy_(device, /*non_blocking=*/true); });
  parts.h2d_ms = testing::gpu_ms_per_call(1, 5, [&] { device.copy_(p, /*non_blocking=*/true); });
  return parts;
}

TEST(GpuOffload, StepTimeWithAndWithoutOffload) {
  TANDEM_REQUIRE_CUDA();
  testing::Recipe r;
  r.in = 1024;
  r.width = 2048;
  r.out = 1024;
  r.depth = 6;  // about 27M parameters
  r.global_batch = 64;
  r.opt = testing::Opt::kAdamW;
  r.device = torch::Device(torch::kCUDA, 0);
  ProcessGroupOptions options;
#if defined(TANDEM_WITH_NCCL)
  options.cuda_backend = CudaBackend::kNccl;  // one rank: NCCL is what a GPU job uses
#endif
  testing::run_ranks(
      1,
      [&](ProcessGroup& pg) {
        ZeroOptions plain;
        plain.stage = 2;
        ZeroOptions offload = plain;
        offload.offload_optimizer = true;
        const double without = step_ms(pg, r, plain, 10);
        const double with = step_ms(pg, r, offload, 10);
        int64_t params = 0;
        testing::Stack probe = testing::make_model(r);
        for (const auto& p : probe->parameters()) params += p.numel();
        const OffloadParts parts = offload_parts(params);
        const StepParts split = step_parts(pg, r, offload, 5);
        testing::record_gpu_figures("zero_offload_step",
                                    {{"parameters", params},
                                     {"stage", 2},
                                     {"no_offload_step_ms", without},
                                     {"offload_step_ms", with},
                                     {"offload_over_no_offload", with / without},
                                     {"cpu_adam_ms", parts.cpu_adam_ms},
                                     {"cpu_adam_isa", cpu_adam_isa()},
                                     {"pinned_d2h_ms", parts.d2h_ms},
                                     {"pinned_h2d_ms", parts.h2d_ms},
                                     {"offload_zero_grad_ms", split.zero_grad_ms},
                                     {"offload_forward_backward_ms", split.forward_backward_ms},
                                     {"offload_step_only_ms", split.step_ms},
                                     {"offload_reduce_scatter_ms", split.reduce_scatter_ms},
                                     {"offload_drain_wait_ms", split.drain_wait_ms}});
        EXPECT_GT(with, 0);
      },
      options);
}

}  // namespace gpu_offload_test
}  // namespace tandem
