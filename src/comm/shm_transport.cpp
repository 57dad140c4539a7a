#include "comm/shm_transport.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/reduce_kernels.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::detail {

// Segment layout: two buffer sets (chunk parity 0 and 1), each holding one
// slot per rank plus one result buffer, all kChunkBytes long.
//
// Why two barriers per chunk suffice: chunk c uses set c % 2. Writing slot
// `rank` of that set is safe once every rank finished reducing chunk c - 2,
// which they did before the second barrier of c - 1 (the last one this rank
// passed). Writing the result of set c % 2 is safe once every rank finished
// copying out chunk c - 2: the first barrier of chunk c proves every rank has
// finished chunk c - 1 entirely.
std::size_t ShmTransport::segment_bytes(int world_size) {
  return 2 * (static_cast<std::size_t>(world_size) + 1) * kChunkBytes;
}

ShmTransport::ShmTransport(ShmSegment segment, int rank, int world_size,
                           std::chrono::milliseconds timeout)
    : segment_(std::move(segment)), rank_(rank), world_size_(world_size), timeout_(timeout) {
  worker_ = std::thread([this] { worker_loop(); });
}

ShmTransport::~ShmTransport() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

bool ShmTransport::supports(const at::Tensor& tensor) {
  return tensor.device().is_cpu() && tensor.layout() == at::kStrided && tensor.is_contiguous() &&
         reducible_dtype(tensor.scalar_type());
}

void ShmTransport::worker_loop() {
  set_thread_rank_label(rank_, world_size_);  // errors raised here name the rank
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

std::shared_future<void> ShmTransport::all_reduce(at::Tensor tensor, ReduceOp op, std::string what) {
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> future = done->get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back([this, tensor, op, what = std::move(what), done]() mutable {
      try {
        run_all_reduce(tensor, op, what);
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    });
  }
  cv_.notify_one();
  return future;
}

void ShmTransport::run_all_reduce(at::Tensor& tensor, ReduceOp op, const std::string& what) {
  if (!failed_.empty()) {
    TANDEM_THROW(CommError, "{} cannot run: the shared-memory transport failed earlier ({})", what,
                 failed_);
  }
  const std::size_t elem = tensor.element_size();
  const std::size_t total = static_cast<std::size_t>(tensor.numel()) * elem;
  const std::size_t chunk_elems = kChunkBytes / elem;
  auto* bytes = static_cast<std::uint8_t*>(tensor.data_ptr());
  const std::size_t set_bytes = (static_cast<std::size_t>(world_size_) + 1) * kChunkBytes;
  std::vector<const void*> slices(static_cast<std::size_t>(world_size_));
  try {
    for (std::size_t offset = 0; offset < total; offset += chunk_elems * elem) {
      const std::size_t len = std::min(chunk_elems * elem, total - offset);
      const std::size_t count = len / elem;
      std::uint8_t* set = segment_.data() + (chunk_counter_++ % 2) * set_bytes;
      std::uint8_t* result = set + static_cast<std::size_t>(world_size_) * kChunkBytes;

      std::memcpy(set + static_cast<std::size_t>(rank_) * kChunkBytes, bytes + offset, len);
      segment_.barrier(++generation_, timeout_, what);

      // This rank's slice of the chunk, in whole elements.
      const std::size_t per_rank = (count + world_size_ - 1) / world_size_;
      const std::size_t lo = std::min(count, per_rank * rank_);
      const std::size_t hi = std::min(count, lo + per_rank);
      for (int k = 0; k < world_size_; ++k) {
        slices[k] = set + static_cast<std::size_t>(k) * kChunkBytes + lo * elem;
      }
      reduce_buffers(result + lo * elem, slices.data(), world_size_,
                     static_cast<std::int64_t>(hi - lo), tensor.scalar_type(), op);
      segment_.barrier(++generation_, timeout_, what);

      std::memcpy(bytes + offset, result, len);
    }
  } catch (const std::exception& e) {
    failed_ = e.what();
    throw;
  }
}

}  // namespace tandem::detail
