#pragma once
// A small model with tandem::Sharded blocks, and the two training loops the
// ZeRO tests compare: DDP with a torch::optim optimizer, and ZeroOptimizer.
// The Accelerator, checkpoint and GPU tests train the same models.

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "support/parity.h"
#include "support/thread_ranks.h"
#include "tandem/comm/process_group.h"
#include "tandem/optim/lamb.h"
#include "tandem/optim/lion.h"
#include "tandem/parallel/ddp.h"
#include "tandem/zero/init.h"
#include "tandem/zero/sharded.h"
#include "tandem/zero/zero_optimizer.h"

namespace tandem::testing {

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int width) {
    fc = register_module("fc", torch::nn::Linear(width, width));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  }
  torch::Tensor forward(torch::Tensor x) { return x + torch::relu(fc(norm(x))); }
  torch::nn::Linear fc{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

// in -> [Sharded block] x depth -> out. `loose` adds unsharded input and
// output layers (parameters outside every unit).
struct StackImpl : torch::nn::Module {
  StackImpl(int in, int width, int out, int depth, bool loose = true) {
    if (loose) {
      input = register_module("input", torch::nn::Linear(in, width));
      output = register_module("output", torch::nn::Linear(width, out));
    }
    for (int i = 0; i < depth; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), Sharded<BlockImpl>(width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    if (input) x = input(x);
    for (auto& block : blocks) x = block->forward(x);
    return output ? output(x) : x;
  }
  torch::nn::Linear input{nullptr}, output{nullptr};
  std::vector<Sharded<BlockImpl>> blocks;
};
TORCH_MODULE(Stack);

// kAmsgrad is Adam with amsgrad, which ZeRO does not shard itself: it runs
// through ZeroOptions::shard_optimizer_factory (train_zero sets it).
// kAdagradGroups: Adagrad over two param groups whose
// initial_accumulator_value differs from the defaults' (LibTorch's Adagrad
// fills every sum from the defaults' value).
enum class Opt {
  kAdam, kAdamW, kSgd, kAdagrad, kRmsprop, kLion, kLamb, kAmsgrad, kAdagradGroups,
  kSgdNesterov, kSgdDampening
};

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt opt,
                                                               std::vector<torch::Tensor> params) {
  switch (opt) {
    case Opt::kAdam:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(1e-2).weight_decay(0.01));
    case Opt::kAdamW:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    case Opt::kSgd:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(5e-2).momentum(0.9).weight_decay(0.01));
    case Opt::kSgdNesterov:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(5e-2).momentum(0.9).nesterov(true).weight_decay(0.01));
    case Opt::kSgdDampening:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(5e-2).momentum(0.9).dampening(0.3));
    case Opt::kAdagrad:
      return std::make_unique<torch::optim::Adagrad>(
          params, torch::optim::AdagradOptions(5e-2).lr_decay(0.01).weight_decay(0.01)
                      .initial_accumulator_value(0.1));
    case Opt::kRmsprop:
      return std::make_unique<torch::optim::RMSprop>(
          params,
          torch::optim::RMSpropOptions(1e-3).momentum(0.5).centered(true).weight_decay(0.01));
    case Opt::kLion:
      return std::make_unique<Lion>(params, LionOptions(1e-3).weight_decay(0.1));
    case Opt::kLamb:
      return std::make_unique<Lamb>(params, LambOptions(1e-2).weight_decay(0.01));
    case Opt::kAmsgrad:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(1e-2).amsgrad(true).weight_decay(0.01));
    case Opt::kAdagradGroups: {
      const auto half = static_cast<std::ptrdiff_t>(params.size() / 2);
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(std::vector<torch::Tensor>(params.begin(), params.begin() + half),
                          std::make_unique<torch::optim::AdagradOptions>(
                              torch::optim::AdagradOptions(5e-2).initial_accumulator_value(2.0)));
      groups.emplace_back(std::vector<torch::Tensor>(params.begin() + half, params.end()),
                          std::make_unique<torch::optim::AdagradOptions>(
                              torch::optim::AdagradOptions(3e-2).initial_accumulator_value(0.0)));
      return std::make_unique<torch::optim::Adagrad>(
          std::move(groups), torch::optim::AdagradOptions(5e-2).initial_accumulator_value(0.1));
    }
  }
  return nullptr;
}

// What ZeroOptions needs for `opt`: a shard_optimizer_factory for kAmsgrad.
inline void set_shard_optimizer(Opt opt, ZeroOptions& options) {
  if (opt != Opt::kAmsgrad) return;
  options.shard_optimizer_factory = [](std::vector<torch::optim::OptimizerParamGroup> groups) {
    return std::make_unique<torch::optim::Adam>(std::move(groups));
  };
}

struct Recipe {
  int in = 6, width = 16, out = 4, depth = 3;
  bool loose = true;
  int steps = 4;
  int accumulation = 2;
  int global_batch = 8;  // per micro-step, across all ranks
  double clip = 0.5;     // <= 0: no clipping
  Opt opt = Opt::kAdam;
  bool zero_init = false;  // train_zero builds the model under zero::Init
  int64_t zero_init_persistence = 0;  // ... with this param_persistence_threshold
  c10::Device device = c10::kCPU;     // where the model and the batches live
};

// Rank `rank`'s micro-batch `micro` of step `step`: a slice of one global
// batch that is the same on every rank.
inline std::pair<torch::Tensor, torch::Tensor> micro_batch(const Recipe& r, int step, int micro,
                                                           int rank, int world) {
  // A generator of its own: ranks run as threads, and the global one is shared.
  auto gen = at::detail::createCPUGenerator(1000 + step * 10 + micro);
  auto x = torch::randn({r.global_batch, r.in}, gen);
  auto y = torch::randint(0, r.out, {r.global_batch}, gen);
  const int per = r.global_batch / world;
  return {x.narrow(0, rank * per, per).to(r.device), y.narrow(0, rank * per, per).to(r.device)};
}

// Initialisation draws from the global generator: one rank thread at a time.
inline std::mutex& init_mutex() {
  static std::mutex mutex;
  return mutex;
}

// The recipe's model from seed 42, on the recipe's device; with
// `zero_init`, built under a zero::Init for `zero_init`'s rank (and the
// recipe's device), each unit cut to its shard.
inline Stack make_model(const Recipe& r, const ProcessGroup* zero_init = nullptr) {
  std::lock_guard<std::mutex> lock(init_mutex());
  torch::manual_seed(42);
  if (zero_init == nullptr) {
    Stack model(r.in, r.width, r.out, r.depth, r.loose);
    model->to(r.device);
    return model;
  }
  zero::Init init(*zero_init, r.zero_init_persistence, r.device);
  Stack model(r.in, r.width, r.out, r.depth, r.loose);
  if (!r.device.is_cpu()) {
    // The loose layers were not cut; move them as prepare_model would.
    for (auto* layer : {&model->input, &model->output}) {
      if (!layer->is_empty()) (*layer)->to(r.device);
    }
  }
  return model;
}

// Stage 3 with the given limits (elements; ZeroOptions' defaults otherwise).
inline ZeroOptions stage3(int64_t prefetch = ZeroOptions{}.prefetch_bucket_size,
                          int64_t max_live = ZeroOptions{}.max_live_parameters,
                          int64_t persistence = 0) {
  ZeroOptions options;
  options.stage = 3;
  options.prefetch_bucket_size = prefetch;
  options.max_live_parameters = max_live;
  options.param_persistence_threshold = persistence;
  return options;
}

// DDP + torch::optim: the reference.
inline Params train_ddp(ProcessGroup& pg, const Recipe& r) {
  Stack model = make_model(r);
  DDPOptions ddp_options;
  ddp_options.cache_cpu_allocations = false;
  DistributedDataParallel ddp(model, pg.shared_from_this(), ddp_options);
  auto optimizer = make_optimizer(r.opt, model->parameters());
  for (int step = 0; step < r.steps; ++step) {
    optimizer->zero_grad();
    for (int micro = 0; micro < r.accumulation; ++micro) {
      ddp.set_gradient_sync(micro == r.accumulation - 1);
      auto [x, y] = micro_batch(r, step, micro, pg.rank(), pg.world_size());
      (torch::nn::functional::cross_entropy(model->forward(x), y) / r.accumulation).backward();
    }
    if (r.clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), r.clip);
    optimizer->step();
  }
  return snapshot(*model);
}

// train_ddp's parameters (rank 0's) at `world` ranks.
inline Params ddp_reference(int world, const Recipe& r) {
  Params out;
  std::mutex mutex;
  run_ranks(world, [&](ProcessGroup& pg) {
    Params p = train_ddp(pg, r);
    std::lock_guard<std::mutex> lock(mutex);
    if (pg.rank() == 0) out = p;
  });
  return out;
}

// ZeroOptimizer over the same recipe; `inspect` sees the optimizer after
// every step.
inline Params train_zero(ProcessGroup& pg, const Recipe& r, ZeroOptions options,
                         const std::function<void(ZeroOptimizer&, Stack&)>& inspect = {}) {
  Stack model = make_model(r, r.zero_init ? &pg : nullptr);
  auto optimizer = make_optimizer(r.opt, model->parameters());
  set_shard_optimizer(r.opt, options);
  ZeroOptimizer zero(model, *optimizer, pg.shared_from_this(), options);
  for (int step = 0; step < r.steps; ++step) {
    zero.zero_grad();
    for (int micro = 0; micro < r.accumulation; ++micro) {
      zero.set_gradient_sync(micro == r.accumulation - 1);
      auto [x, y] = micro_batch(r, step, micro, pg.rank(), pg.world_size());
      (torch::nn::functional::cross_entropy(model->forward(x), y) / r.accumulation).backward();
    }
    if (r.clip > 0) zero.clip_grad_norm(r.clip);
    zero.step();
    if (inspect) inspect(zero, model);
  }
  ZeroOptimizer::GatheredParameters whole(zero);
  return snapshot(*model);
}

// Every rank's parameters after train_zero at `world` ranks.
inline std::vector<Params> zero_runs(int world, const Recipe& r, const ZeroOptions& options) {
  std::vector<Params> out(world);
  run_ranks(world, [&](ProcessGroup& pg) { out[pg.rank()] = train_zero(pg, r, options); });
  return out;
}

}  // namespace tandem::testing
