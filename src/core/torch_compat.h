#pragma once
// The one place where LibTorch version differences live (STYLE.md).
//
// Supported: Debian's LibTorch 1.13 (CPU) and PyTorch 2.x LibTorch (CUDA).
// Private to the library: include only from src/.

#include <torch/version.h>

#include <ATen/autocast_mode.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if defined(TANDEM_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#define TANDEM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace tandem::compat {

// In 1.13 ProcessGroupGloo/NCCL derive from c10d::ProcessGroup; from 2.0 on
// they derive from c10d::Backend and ProcessGroup became a dispatcher. tandem
// talks to the concrete backend directly, through this common base.
#if TANDEM_TORCH_AT_LEAST(2, 0)
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

// A client of a c10d TCPStore hosted by another launcher (torchrun's agent
// store). In 2.x the libuv server became the default; the client does not
// care, but the option must stay off for the classic protocol.
inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store_client(const std::string& host, int port,
                                                                int world_size,
                                                                std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = false;
  opts.numWorkers = world_size;
  opts.waitWorkers = false;
  opts.timeout = timeout;
#if TANDEM_TORCH_AT_LEAST(2, 3)
  opts.useLibUV = false;
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

// Base of tandem's own c10d stores. 2.5 made Store::clone() (a second,
// independent connection to the same store) pure virtual; 1.13 has no
// clone. Stores implement clone_store() and this forwards to it.
class StoreBase : public c10d::Store {
 public:
  using c10d::Store::Store;
  virtual c10::intrusive_ptr<c10d::Store> clone_store() = 0;
#if TANDEM_TORCH_AT_LEAST(2, 5)
  c10::intrusive_ptr<c10d::Store> clone() override { return clone_store(); }
#endif
};

// Autocast state for one device type, kCPU or kCUDA (the caller checks; any
// other type is treated as kCUDA before 2.4). The state is thread-local.
// 1.13 to 2.3 have one function per device (is_cpu_enabled, is_enabled for
// CUDA, ...); 2.4 made them device-generic and deprecated the old ones.
inline bool autocast_enabled(c10::DeviceType device) {
#if TANDEM_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                        : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if TANDEM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType device) {
#if TANDEM_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device, at::ScalarType dtype) {
#if TANDEM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

}  // namespace tandem::compat
