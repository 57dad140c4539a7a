#include "core/torch_internals.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "tandem/core/error.h"

namespace tandem::internals {
namespace {

// Priority of tandem's CPU allocator in c10's registry: above the default's 0,
// so LibTorch's own registration cannot override it.
constexpr std::uint8_t kCpuAllocatorPriority = 1;

compat::AutogradNodePtr accumulator_of(const at::Tensor& param,
                                                         const char* what) {
  TANDEM_CHECK_ARG(param.defined() && param.is_leaf() && param.requires_grad(),
                   "{}: the tensor must be a leaf that requires grad (a trainable parameter)",
                   what);
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  TANDEM_CHECK(accumulator != nullptr, "{}: the parameter has no gradient accumulator", what);
  return accumulator;
}

class CallbackPostHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit CallbackPostHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

class RewritePreHook final : public torch::autograd::FunctionPreHook {
 public:
  explicit RewritePreHook(std::function<at::Tensor(const at::Tensor&)> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    // AccumulateGrad has one input, the parameter's gradient.
    torch::autograd::variable_list out;
    out.reserve(grads.size());
    for (const auto& g : grads) out.push_back(fn_(g));
    return out;
  }

 private:
  std::function<at::Tensor(const at::Tensor&)> fn_;
};

class FunctionCpuAllocator final : public c10::Allocator {
 public:
  explicit FunctionCpuAllocator(CpuAllocatorFunctions fns) : fns_(fns) {}

  c10::DataPtr allocate(std::size_t n) override {
    void* p = fns_.allocate(n);
    // The deleter is a plain function, not this object: tensors may be freed
    // after this allocator is replaced.
    return {p, p, fns_.free, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return fns_.free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  const CpuAllocatorFunctions fns_;
};

}  // namespace

void release_storage(const at::Tensor& tensor) {
  // Safe: reset() drops the DataPtr and the byte count but keeps the
  // StorageImpl, so the tensors over it stay valid objects; the caller touches
  // none of them until reallocate_storage().
  tensor.storage().unsafeGetStorageImpl()->reset();
}

at::Tensor take_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const std::size_t nbytes = storage->nbytes();
  // Safe: the DataPtr (and with it the deleter) moves to a new storage made
  // by the same allocator; the old storage is left empty exactly as reset()
  // leaves it, so its tensors keep their shapes and the caller touches none
  // of them until reallocate_storage().
  c10::DataPtr data = storage->set_data_ptr(c10::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
  c10::Storage moved(c10::Storage::use_byte_size_t(), nbytes, std::move(data),
                     storage->allocator(), /*resizable=*/false);
  const auto elements = static_cast<std::int64_t>(nbytes / tensor.element_size());
  return at::empty({0}, tensor.options()).set_(moved, 0, {elements}, {1});
}

void reallocate_storage(const at::Tensor& tensor, std::int64_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (static_cast<std::int64_t>(storage->nbytes()) == nbytes) return;
  // Safe: the storage's own allocator gives memory on the storage's device,
  // and the new DataPtr replaces the old one (empty after release_storage())
  // without touching the tensors' sizes or offsets, which the caller sized
  // `nbytes` for.
  storage->set_data_ptr_noswap(storage->allocator()->allocate(static_cast<std::size_t>(nbytes)));
  storage->set_nbytes(static_cast<std::size_t>(nbytes));
}

void rebind_parameter_data(const at::Tensor& param, const at::Tensor& data) {
  TANDEM_CHECK_ARG(param.scalar_type() == data.scalar_type() && param.device() == data.device() &&
                       param.sizes() == data.sizes(),
                   "rebind_parameter_data: the new data must match the parameter's dtype, "
                   "device and shape");
  // Safe: set_data keeps the parameter's TensorImpl, and with it the autograd
  // meta (accumulator, hooks, .grad) and version counter; same dtype and
  // device keep the accumulator valid, and no saved graph holds the old data.
  param.set_data(data);
}

void move_parameter_to(const at::Tensor& param, c10::Device device) {
  if (param.device() == device) return;
  // Safe: this is Module::to's own step (set_data with the moved tensor); the
  // caller guarantees no hook or saved graph refers to the old data.
  param.set_data(param.to(device));
}

at::Tensor flat_alias(const at::Tensor& flat, std::int64_t offset, at::IntArrayRef sizes) {
  at::Tensor t = at::empty({0}, flat.options());
  std::vector<std::int64_t> strides(sizes.size(), 1);
  for (std::int64_t d = static_cast<std::int64_t>(sizes.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * sizes[d + 1];
  }
  // Safe: set_ on a fresh tensor shares the storage (refcounted, so `flat`
  // may go away first) without recording a view relation; the caller's
  // buffers are never saved by a graph, so the separate version counters
  // cannot hide a modification from autograd.
  t.set_(flat.storage(), flat.storage_offset() + offset, sizes, strides);
  return t;
}

void mark_modified_in_place(const at::Tensor& tensor) {
  // Safe: the same bump torch's in-place kernels do; it only makes later
  // saved-tensor checks stricter.
  tensor.unsafeGetTensorImpl()->bump_version();
}

GradHook::GradHook(compat::AutogradNodePtr accumulator, Kind kind,
                   std::uintptr_t key)
    : accumulator_(std::move(accumulator)), kind_(kind), key_(key) {}

GradHook::GradHook(GradHook&& other) noexcept
    : accumulator_(std::move(other.accumulator_)),
      kind_(std::exchange(other.kind_, Kind::kNone)),
      key_(std::exchange(other.key_, 0)) {}

GradHook& GradHook::operator=(GradHook&& other) noexcept {
  if (this != &other) {
    remove();
    accumulator_ = std::move(other.accumulator_);
    kind_ = std::exchange(other.kind_, Kind::kNone);
    key_ = std::exchange(other.key_, 0);
  }
  return *this;
}

GradHook::~GradHook() { remove(); }

void GradHook::remove() {
  if (!accumulator_) return;
  // Safe: the caller guarantees no backward runs through this accumulator, so
  // nothing iterates its hook lists while we edit them.
  if (kind_ == Kind::kPost) {
    accumulator_->del_post_hook(key_);
  } else if (kind_ == Kind::kPre) {
    auto& hooks = accumulator_->pre_hooks();
    hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                               [this](const auto& h) {
                                 return reinterpret_cast<std::uintptr_t>(h.get()) == key_;
                               }),
                hooks.end());
  }
  accumulator_.reset();
  kind_ = Kind::kNone;
  key_ = 0;
}

GradHook add_grad_ready_hook(const at::Tensor& param, std::function<void()> on_ready) {
  auto accumulator = accumulator_of(param, "add_grad_ready_hook");
  // Safe: post hooks of AccumulateGrad run after .grad was written; the
  // returned handle owns the accumulator, so the hook lives as long as it.
  const std::uintptr_t key =
      accumulator->add_post_hook(std::make_unique<CallbackPostHook>(std::move(on_ready)));
  return GradHook(std::move(accumulator), GradHook::Kind::kPost, key);
}

GradHook add_grad_pre_hook(const at::Tensor& param,
                           std::function<at::Tensor(const at::Tensor&)> rewrite) {
  auto accumulator = accumulator_of(param, "add_grad_pre_hook");
  auto hook = std::make_unique<RewritePreHook>(std::move(rewrite));
  // The node's own hook pointer is the key: Node has no del_pre_hook.
  const auto key = reinterpret_cast<std::uintptr_t>(hook.get());
  // Safe: a pre hook sees AccumulateGrad's input before it touches .grad, and
  // the caller returns a gradient of the same metadata.
  accumulator->add_pre_hook(std::move(hook));
  return GradHook(std::move(accumulator), GradHook::Kind::kPre, key);
}

InstalledCpuAllocator install_cpu_allocator(CpuAllocatorFunctions functions) {
  TANDEM_CHECK_ARG(functions.allocate != nullptr && functions.free != nullptr,
                   "install_cpu_allocator: both allocate and free are needed");
  InstalledCpuAllocator installed{c10::GetCPUAllocator()};
  // Never destroyed: storages made by it keep a pointer to it (they allocate
  // through it again when resized), however long they live.
  c10::SetCPUAllocator(new FunctionCpuAllocator(functions), kCpuAllocatorPriority);
  return installed;
}

void restore_cpu_allocator(const InstalledCpuAllocator& installed) {
  TANDEM_CHECK_ARG(installed.previous != nullptr,
                   "restore_cpu_allocator: nothing was installed");
  // Safe: c10 never frees a registered allocator, so `previous` is still alive.
  c10::SetCPUAllocator(installed.previous, kCpuAllocatorPriority);
}

}  // namespace tandem::internals
