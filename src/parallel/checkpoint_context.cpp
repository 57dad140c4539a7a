// The state activation checkpointing carries from a forward to its recompute
// (random generators, autocast), and the per-thread state of nested
// backward passes.

#include "parallel/checkpoint_context.h"

#include <atomic>
#include <exception>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/engine.h>

#include "core/torch_compat.h"
#include "parallel/backward_callbacks.h"
#include "tandem/core/logging.h"

namespace tandem::detail {
namespace {

struct CheckpointThreadState {
  // One list per checkpoint backward running on this thread, innermost last.
  std::vector<std::vector<std::function<void()>>*> nested;
  bool recomputing = false;
};

CheckpointThreadState& checkpoint_thread_state() {
  thread_local CheckpointThreadState state;
  return state;
}

std::atomic<std::uint64_t>& checkpointed_forward_count() {
  static std::atomic<std::uint64_t> count{0};
  return count;
}

// Generator states are read and written under the generator's own mutex, as
// torch's Python bindings do.
at::Tensor generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace

void queue_end_of_backward(std::function<void()> callback) {
  auto& nested = checkpoint_thread_state().nested;
  if (!nested.empty()) {
    nested.back()->push_back(std::move(callback));
    return;
  }
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
}

bool recomputing_checkpoint() { return checkpoint_thread_state().recomputing; }

RngSnapshot RngSnapshot::take(const std::vector<c10::Device>& devices) {
  RngSnapshot out;
  out.cpu = generator_state(at::detail::getDefaultCPUGenerator());
  for (const c10::Device& device : devices) {
    out.cuda.emplace_back(device, generator_state(at::globalContext().defaultGenerator(device)));
  }
  return out;
}

void RngSnapshot::restore() const {
  if (cpu.defined()) set_generator_state(at::detail::getDefaultCPUGenerator(), cpu);
  for (const auto& [device, state] : cuda) {
    set_generator_state(at::globalContext().defaultGenerator(device), state);
  }
}

RngScope::RngScope(const RngSnapshot& forward) {
  std::vector<c10::Device> devices;
  for (const auto& entry : forward.cuda) devices.push_back(entry.first);
  previous_ = RngSnapshot::take(devices);
  forward.restore();
}

RngScope::~RngScope() {
  try {
    previous_.restore();
  } catch (const std::exception& e) {
    log_error("activation checkpointing could not restore the random generators: {}", e.what());
  }
}

AutocastSnapshot AutocastSnapshot::take() {
  AutocastSnapshot s;
  s.cpu_enabled = compat::autocast_enabled(c10::DeviceType::CPU);
  s.cpu_dtype = compat::autocast_dtype(c10::DeviceType::CPU);
  s.cuda_enabled = compat::autocast_enabled(c10::DeviceType::CUDA);
  s.cuda_dtype = compat::autocast_dtype(c10::DeviceType::CUDA);
  s.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

void AutocastSnapshot::apply() const {
  compat::set_autocast_enabled(c10::DeviceType::CPU, cpu_enabled);
  compat::set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
  compat::set_autocast_enabled(c10::DeviceType::CUDA, cuda_enabled);
  compat::set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
  at::autocast::set_autocast_cache_enabled(cache_enabled);
}

AutocastScope::AutocastScope(const AutocastSnapshot& state) : previous_(AutocastSnapshot::take()) {
  state.apply();
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  previous_.apply();
}

AutocastCacheOff::AutocastCacheOff() : previous_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_cache_enabled(false);
}

AutocastCacheOff::~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(previous_); }

RecomputeFlag::RecomputeFlag(bool recomputing) : previous_(checkpoint_thread_state().recomputing) {
  checkpoint_thread_state().recomputing = recomputing;
}

RecomputeFlag::~RecomputeFlag() { checkpoint_thread_state().recomputing = previous_; }

NestedBackwardScope::NestedBackwardScope() {
  checkpoint_thread_state().nested.push_back(&deferred_);
}

NestedBackwardScope::~NestedBackwardScope() {
  checkpoint_thread_state().nested.pop_back();
  // The nested pass has returned: this thread runs the enclosing pass again,
  // so these go to it (or to the next checkpoint out).
  for (auto& callback : deferred_) {
    try {
      queue_end_of_backward(std::move(callback));
    } catch (const std::exception& e) {
      log_error("activation checkpointing could not hand on an end-of-backward callback: {}",
                e.what());
    }
  }
}

std::uint64_t checkpointed_forwards() {
  return checkpointed_forward_count().load(std::memory_order_relaxed);
}

void count_checkpointed_forward() {
  checkpointed_forward_count().fetch_add(1, std::memory_order_relaxed);
}

}  // namespace tandem::detail
