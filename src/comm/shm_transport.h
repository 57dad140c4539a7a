#pragma once
// Intra-node all-reduce through shared memory.
//
// When every rank of a group runs on one host, copying tensors through a
// shared segment beats Gloo's loopback TCP by a wide margin: no kernel copies,
// no syscalls per byte, and the reduction reads each rank's data exactly once.
//
// Per chunk of at most kChunkBytes: each rank copies its chunk into its slot;
// barrier; rank r reduces slice r of every slot into the shared result;
// barrier; each rank copies the result out. Two buffer sets alternate between
// chunks, so two barriers per chunk are enough (see the .cpp for why).
//
// Collectives run on a dedicated thread in submission order, so async
// all-reduces overlap the caller's compute. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/core/Tensor.h>

#include "comm/shm_segment.h"
#include "tandem/comm/process_group.h"

namespace tandem::detail {

class ShmTransport {
 public:
  static constexpr std::size_t kChunkBytes = std::size_t{4} << 20;

  // Bytes each segment needs for `world_size` ranks.
  static std::size_t segment_bytes(int world_size);

  ShmTransport(ShmSegment segment, int rank, int world_size, std::chrono::milliseconds timeout);
  ~ShmTransport();

  // True when all_reduce can carry `tensor` (CPU, dense, contiguous, a
  // reducible dtype).
  static bool supports(const at::Tensor& tensor);

  // Queues an in-place all-reduce; the future completes (or holds the error)
  // when `tensor` holds the result. `what` names it in errors.
  std::shared_future<void> all_reduce(at::Tensor tensor, ReduceOp op, std::string what);

 private:
  void run_all_reduce(at::Tensor& tensor, ReduceOp op, const std::string& what);
  void worker_loop();

  ShmSegment segment_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  std::uint32_t generation_ = 0;
  std::uint64_t chunk_counter_ = 0;
  std::string failed_;  // first error; the transport is unusable after one

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace tandem::detail
