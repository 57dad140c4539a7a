#include "tandem/parallel/comm_hook.h"

#include <ATen/ATen.h>

#include "tandem/core/error.h"

namespace tandem {

GradBucket::GradBucket(std::size_t index, std::size_t bucket_count, at::Tensor buffer,
                       std::vector<at::Tensor> parameters,
                       std::vector<std::string> parameter_names, ProcessGroup& process_group)
    : index_(index),
      bucket_count_(bucket_count),
      buffer_(std::move(buffer)),
      parameters_(std::move(parameters)),
      names_(std::move(parameter_names)),
      process_group_(&process_group) {
  TANDEM_CHECK_ARG(index_ < bucket_count_, "GradBucket: index {} is not below bucket_count {}",
                   index_, bucket_count_);
  TANDEM_CHECK_ARG(buffer_.defined() && buffer_.dim() == 1 && buffer_.is_contiguous(),
                   "GradBucket {}: the buffer must be a contiguous 1-D tensor", index_);
  TANDEM_CHECK_ARG(names_.empty() || names_.size() == parameters_.size(),
                   "GradBucket {}: {} parameter names for {} parameters; pass one per parameter, "
                   "or none",
                   index_, names_.size(), parameters_.size());
  if (names_.empty()) {
    for (std::size_t k = 0; k < parameters_.size(); ++k) names_.push_back(fmt::format("#{}", k));
  }
  std::int64_t offset = 0;
  for (const at::Tensor& param : parameters_) {
    const std::int64_t numel = param.numel();
    TANDEM_CHECK_ARG(offset + numel <= buffer_.numel(),
                     "GradBucket {}: its parameters hold more elements than its buffer ({})",
                     index_, buffer_.numel());
    offsets_.push_back(offset);
    gradients_.push_back(buffer_.narrow(0, offset, numel).view(param.sizes()));
    offset += numel;
  }
  TANDEM_CHECK_ARG(offset == buffer_.numel(),
                   "GradBucket {}: its parameters hold {} elements and its buffer {}; they must "
                   "match",
                   index_, offset, buffer_.numel());
}

HookWork::HookWork(Work work, std::function<HookWork()> then)
    : work_(std::move(work)), then_(std::move(then)), done_(false) {}

HookWork::HookWork(HookWork&& other) noexcept { *this = std::move(other); }

HookWork& HookWork::operator=(HookWork&& other) noexcept {
  if (this != &other) {
    work_ = std::move(other.work_);
    then_ = std::move(other.then_);
    done_ = other.done_;
    other.then_ = nullptr;
    other.done_ = true;
  }
  return *this;
}

void HookWork::advance() {
  if (done_) return;
  work_.wait();
  std::function<HookWork()> then = std::move(then_);
  then_ = nullptr;
  done_ = true;  // also when the step throws: nothing left to wait for
  if (then) *this = then();
}

void HookWork::wait() {
  while (!done_) advance();
}

HookWork AllReduceHook::start(GradBucket& bucket) {
  return HookWork(bucket.process_group().all_reduce_async(bucket.buffer(), ReduceOp::kAvg));
}

CompressHook::CompressHook(at::ScalarType wire_dtype) : wire_dtype_(wire_dtype) {
  TANDEM_CHECK_ARG(at::isFloatingType(wire_dtype_),
                   "CompressHook: the wire dtype must be a floating type (Half or BFloat16), got "
                   "{}",
                   c10::toString(wire_dtype_));
}

HookWork CompressHook::start(GradBucket& bucket) {
  at::Tensor wire = bucket.buffer().to(wire_dtype_);
  Work work = bucket.process_group().all_reduce_async(wire, ReduceOp::kAvg);
  return HookWork(std::move(work), [wire, buffer = bucket.buffer()] {
    buffer.copy_(wire);
    return HookWork();
  });
}

std::string CompressHook::name() const {
  switch (wire_dtype_) {
    case at::kHalf: return "fp16_compress";
    case at::kBFloat16: return "bf16_compress";
    default: return std::string(c10::toString(wire_dtype_)) + "_compress";
  }
}

FunctionHook::FunctionHook(std::function<HookWork(GradBucket&)> hook, std::string name)
    : hook_(std::move(hook)), name_(std::move(name)) {
  TANDEM_CHECK_ARG(hook_ != nullptr, "FunctionHook: the hook function is empty");
}

}  // namespace tandem
