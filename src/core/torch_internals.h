#pragma once
// The one place that touches LibTorch's internals: storages freed and
// re-allocated in place, a parameter's data rebound, tensors aliased without
// autograd's knowledge, version counters bumped by hand, hooks on a
// parameter's gradient accumulator, and the process-wide CPU allocator.
// Everything else in tandem calls these functions; a ctest
// (Build.TorchInternalsConfined) fails on any use outside this file, its .cpp
// and torch_compat.h. Each function states the invariant its caller keeps,
// which is what makes the use safe.
//
// Private to the library: include only from src/. Thread-safety: none of
// these functions may race with a backward pass, or with another call, on the
// same tensor; the hook callbacks run on whatever thread runs backward.

#include <cstddef>
#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include "core/torch_compat_autograd.h"

namespace c10 {
struct Allocator;
}

namespace tandem::internals {

// --- Storages ---------------------------------------------------------------

// Frees the memory of `tensor`'s storage and leaves the storage itself, with
// every tensor over it (views, flat_alias()es, parameters rebound to it)
// keeping its sizes, strides and offset. Until reallocate_storage(), nothing
// may read or write any of those tensors.
void release_storage(const at::Tensor& tensor);

// Moves the memory of `tensor`'s storage into a new 1-D tensor of
// `tensor`'s dtype that owns it, and leaves the storage as release_storage()
// does. For reusing a buffer about to be freed (a stage-3 unit's gathered
// parameters become its packed gradients) without a second allocation.
at::Tensor take_storage(const at::Tensor& tensor);

// Gives `tensor`'s storage `nbytes` bytes of fresh memory from the allocator
// that made it (same device); the contents are undefined. No-op when the
// storage already holds `nbytes`.
void reallocate_storage(const at::Tensor& tensor, std::int64_t nbytes);

// --- Parameters and aliases -------------------------------------------------

// Makes `param` (a leaf) use `data`'s storage, sizes and strides, keeping its
// autograd identity: requires_grad, .grad, its gradient accumulator and any
// hooks on it. `data` must have `param`'s dtype, device and shape, and no
// graph may have saved `param` yet (call it before the first forward).
void rebind_parameter_data(const at::Tensor& param, const at::Tensor& data);

// Moves `param` (a leaf) to `device`, keeping its TensorImpl, as
// Module::to does: the autograd meta stays, and LibTorch drops the gradient
// accumulator when the device changes. Call it only before any hook is on
// the parameter and before a graph saved it (zero::Init moves each unit to
// the training device as it is built).
void move_parameter_to(const at::Tensor& param, c10::Device device);

// A contiguous tensor of `sizes` over `flat`'s storage, starting `offset`
// elements into `flat`, that autograd does not see as a view of `flat`: it
// has its own version counter, so Optimizer::zero_grad(false) may detach_()
// it as a .grad. Writes through it do not bump `flat`'s version: use it only
// for buffers no autograd graph saves (flat gradient and parameter buffers).
at::Tensor flat_alias(const at::Tensor& flat, std::int64_t offset, at::IntArrayRef sizes);

// Bumps `tensor`'s version counter, as torch's in-place ops do, after tandem
// wrote its memory through a raw pointer; a graph that saved the tensor then
// refuses to use the stale value.
void mark_modified_in_place(const at::Tensor& tensor);

// --- Gradient hooks ---------------------------------------------------------

// A hook on a parameter's gradient accumulator (the AccumulateGrad node that
// writes .grad). Move-only. Keeps the accumulator alive (the parameter holds
// it only weakly, so without an owner the next backward would make a new one
// without the hook) and removes the hook when destroyed. Destroy it only
// while no backward through the parameter runs.
class GradHook {
 public:
  GradHook() = default;
  GradHook(GradHook&& other) noexcept;
  GradHook& operator=(GradHook&& other) noexcept;
  GradHook(const GradHook&) = delete;
  GradHook& operator=(const GradHook&) = delete;
  ~GradHook();

 private:
  friend GradHook add_grad_ready_hook(const at::Tensor&, std::function<void()>);
  friend GradHook add_grad_pre_hook(const at::Tensor&,
                                    std::function<at::Tensor(const at::Tensor&)>);
  enum class Kind { kNone, kPost, kPre };
  GradHook(compat::AutogradNodePtr accumulator, Kind kind, std::uintptr_t key);
  void remove();

  compat::AutogradNodePtr accumulator_;
  Kind kind_ = Kind::kNone;
  std::uintptr_t key_ = 0;  // identifies the hook among the node's hooks
};

// Calls `on_ready` each time backward has accumulated `param`'s gradient into
// its .grad (after AccumulateGrad ran). `param` must be a leaf that requires
// grad. `on_ready` must be thread-safe against the caller's other code.
GradHook add_grad_ready_hook(const at::Tensor& param, std::function<void()> on_ready);

// Calls `rewrite` with the gradient about to be accumulated into `param`'s
// .grad, and accumulates what it returns instead (return the argument to
// leave it alone; it may be undefined). `param` must be a leaf that requires
// grad; the returned tensor must have the argument's shape, dtype and device.
GradHook add_grad_pre_hook(const at::Tensor& param,
                           std::function<at::Tensor(const at::Tensor&)> rewrite);

// --- The CPU allocator ------------------------------------------------------

// A CPU allocator made of two plain functions. `allocate` returns memory for
// `nbytes` bytes, aligned as c10's own allocator aligns it, or throws; `free`
// releases what `allocate` returned and must accept it on any thread, at any
// time until the process exits (a tensor may outlive the installation).
struct CpuAllocatorFunctions {
  void* (*allocate)(std::size_t nbytes) = nullptr;
  void (*free)(void* ptr) = nullptr;
};

// What install_cpu_allocator() replaced.
struct InstalledCpuAllocator {
  c10::Allocator* previous = nullptr;
};

// Makes `functions` LibTorch's CPU allocator for the whole process. Tensors
// allocated before keep their own deleters. Call it while no other thread
// allocates CPU tensors.
InstalledCpuAllocator install_cpu_allocator(CpuAllocatorFunctions functions);

// Puts back the allocator that `installed` replaced. Tensors allocated in
// between are still freed by the installed `free`.
void restore_cpu_allocator(const InstalledCpuAllocator& installed);

}  // namespace tandem::internals
