#pragma once
// The one place where LibTorch version differences live (CONTRIBUTING.md, "Layers").
//
// Supported: PyTorch's LibTorch 2.11 and newer (CI builds 2.13 CPU and runs
// the suite on it, and compiles and links 2.14 CUDA; the GPU kit builds 2.11
// CUDA, the GPU machines' version). docs/architecture.md,
// "LibTorch versions", lists every other place that knows about versions.
// Private to the library: include only from src/.

#include <torch/version.h>

#include <ATen/autocast_mode.h>

#include "tandem/core/torch_types.h"

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

// CMake refuses older LibTorch (cmake/TandemDependencies.cmake); this catches
// a build that bypassed it.
static_assert(TANDEM_TORCH_AT_LEAST(2, 11), "tandem needs LibTorch 2.11 or newer");

namespace tandem::compat {

// ProcessGroupGloo/NCCL derive from c10d::Backend (c10d::ProcessGroup is a
// dispatcher above them). tandem talks to the concrete backend directly.
using BackendBase = c10d::Backend;

using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

// TCPStore options for the classic (non-libuv) protocol, which both sides
// below speak: 2.x made the libuv server the default.
inline c10d::TCPStoreOptions classic_store_options(int port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.waitWorkers = false;
  opts.timeout = timeout;
  opts.useLibUV = false;
  return opts;
}

// A client of a c10d TCPStore hosted by another launcher (torchrun's agent
// store).
inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store_client(const std::string& host, int port,
                                                                int world_size,
                                                                std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts = classic_store_options(port, timeout);
  opts.isServer = false;
  opts.numWorkers = world_size;
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

// A c10d TCPStore server that takes over `listen_fd`, a socket the caller
// bound and put in listening state (so it decides the address, loopback for
// one node), the way torchrun's agent hosts the store for Python workers.
inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store_server(const std::string& host, int port,
                                                                int listen_fd,
                                                                std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts = classic_store_options(port, timeout);
  opts.isServer = true;
  opts.masterListenFd = listen_fd;
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

// Base of tandem's own c10d stores. Store::clone() (a second, independent
// connection to the same store) is pure virtual; stores implement
// clone_store() and this forwards to it.
class StoreBase : public c10d::Store {
 public:
  using c10d::Store::Store;
  virtual c10::intrusive_ptr<c10d::Store> clone_store() = 0;
  c10::intrusive_ptr<c10d::Store> clone() override { return clone_store(); }
};

// c10d's Flight Recorder (a ring of recent collectives for debugging hangs)
// in LibTorch up to 2.12 adds a process group to a std::map before it takes
// its mutex (FlightRecorder::recordWithResetEnabled), so a group recording
// its first collective while another thread records can corrupt the map and
// crash. 2.13 takes the mutex first. Where this is true, libtandem turns the
// recorder off at load (src/comm/flight_recorder_guard.cpp).
inline constexpr bool kFlightRecorderRaces = !TANDEM_TORCH_AT_LEAST(2, 13);

// Autocast state for one device type (kCPU or kCUDA); thread-local.
inline bool autocast_enabled(c10::DeviceType device) {
  return at::autocast::is_autocast_enabled(device);
}

inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  at::autocast::set_autocast_enabled(device, enabled);
}

inline at::ScalarType autocast_dtype(c10::DeviceType device) {
  return at::autocast::get_autocast_dtype(device);
}

inline void set_autocast_dtype(c10::DeviceType device, at::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device, dtype);
}

}  // namespace tandem::compat
