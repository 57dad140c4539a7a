#pragma once
// Private state of tandem::ProcessGroup.

#include <cstdint>
#include <string>

#include "comm/shm_transport.h"
#include "core/torch_compat.h"
#include "tandem/comm/process_group.h"

namespace tandem {

struct ProcessGroup::Impl {
  int rank = 0;
  int world_size = 1;
  ProcessGroupOptions options;
  compat::StorePtr store;
  c10::intrusive_ptr<compat::BackendBase> gloo;
  c10::intrusive_ptr<compat::BackendBase> nccl;  // created on first CUDA collective
  std::unique_ptr<detail::ShmTransport> shm;  // all ranks on one host
  std::uint64_t sequence = 0;

  bool is_local() const { return !gloo; }

  // Backend for collectives on `tensor`'s device.
  compat::BackendBase& backend_for(const at::Tensor& tensor);
  bool uses_nccl(const at::Tensor& tensor) const;

  // "all_reduce #12 Float[4, 8] on gloo": used in every error message.
  std::string describe(const char* op, const at::Tensor& tensor, const std::string& backend);

  // Wraps a c10d call that returns Work, translating synchronous errors.
  template <typename Fn>
  Work launch(const std::string& what, Fn&& fn, std::function<void()> on_complete = nullptr) {
    compat::WorkPtr work;
    try {
      work = fn();
    } catch (...) {
      rethrow_usage(what);
    }
    return Work(std::move(work), options.timeout, what, std::move(on_complete));
  }

  [[noreturn]] static void rethrow_usage(const std::string& what);
};

}  // namespace tandem
