#pragma once
// Intra-node all-reduce, all-gather, reduce-scatter and exchanges (all-to-all,
// gather, scatter) through shared memory.
//
// When every rank of a group runs on one host, copying tensors through a
// shared segment beats Gloo's loopback TCP by a wide margin: no kernel copies,
// no syscalls per byte, and the reduction reads each rank's data exactly once.
//
// Each collective runs in rounds of at most kChunkBytes per rank slot, so a
// tensor of any size passes through a fixed segment. All-reduce, per round:
// each rank copies its chunk into its slot; barrier; rank r reduces slice r
// of every slot into the shared result; barrier; each rank copies the result
// out. All-gather: copy in; barrier; copy every slot out. Reduce-scatter:
// each rank stages, for every destination rank, the next piece of that rank's
// chunk; barrier; each rank reduces its own pieces across the slots straight
// into its output. Exchange: each rank stages, for every other rank, the next
// piece of what it sends that rank in that rank's part of its slot; barrier;
// each rank copies its part of every other slot out. Two buffer sets
// alternate between rounds, so these barriers are enough (see the .cpp for
// why).
//
// Every rank posts the shape of its call (operation, dtype, reduce op,
// element count, an exchange's byte matrix) in the first round, and every
// rank compares them after that round's barrier: ranks that passed different
// tensors get a CommError naming each rank's call instead of mixing
// unrelated bytes. It costs one small write and world_size small reads per
// call, and an empty call takes one round (one barrier).
//
// Collectives run on a dedicated thread in submission order, so async
// all-reduces overlap the caller's compute. Thread-safe.

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/serial_worker.h"
#include "comm/shm_segment.h"
#include "tandem/comm/process_group.h"

namespace tandem::detail {

// What a rank passed to a shared-memory collective; every rank must pass the
// same (ShmTransport compares them in each call's first round).
struct ShmCallShape {
  std::int64_t kind = 0;    // 1 all-reduce, 2 all-gather, 3 reduce-scatter, 4 exchange
  std::int64_t dtype = -1;  // at::ScalarType; -1 for an exchange (bytes only)
  std::int64_t op = -1;     // ReduceOp; -1 when nothing is reduced
  std::int64_t count = 0;   // elements; an exchange: the bytes of its whole matrix
  std::uint64_t plan = 0;   // an exchange's byte matrix, hashed
  bool operator==(const ShmCallShape& o) const {
    return kind == o.kind && dtype == o.dtype && op == o.op && count == o.count && plan == o.plan;
  }
};

class ShmTransport {
 public:
  static constexpr std::size_t kChunkBytes = std::size_t{4} << 20;

  // Bytes each segment needs for `world_size` ranks.
  static std::size_t segment_bytes(int world_size);

  ShmTransport(ShmSegment segment, int rank, int world_size, std::chrono::milliseconds timeout);

  // True when the transport can carry `tensor`: CPU, dense, contiguous and,
  // for the collectives that reduce, a dtype reduce_buffers() handles
  // (all-gather only moves bytes, so any dtype).
  static bool supports(const at::Tensor& tensor, bool reduces = true);

  // Each call queues a collective and returns a future that completes (or
  // holds the error) once its output holds the result. The tensors must be
  // contiguous CPU tensors that stay alive and untouched until then; every
  // rank must queue the same collectives with the same sizes in the same
  // order. `what` names the collective in errors.

  // In-place all-reduce of `tensor`.
  std::shared_future<void> all_reduce(at::Tensor tensor, ReduceOp op, std::string what);
  // `output` (world_size x input.numel() elements) gets rank r's `input` at
  // offset r * input.numel(). Input may alias its own place in the output.
  std::shared_future<void> all_gather(at::Tensor output, at::Tensor input, std::string what);
  // `output` gets chunk `rank` (output.numel() elements) of the reduction of
  // every rank's `input` (world_size x output.numel() elements), reduced as
  // all_reduce reduces it. Output may alias its own chunk of the input.
  std::shared_future<void> reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op,
                                          std::string what);

  // Who sends how many bytes to whom, and where they lie.
  struct ExchangePlan {
    // world_size x world_size, row = source: bytes[src * world + dst] bytes
    // go from src to dst. Every rank passes the same matrix.
    std::vector<std::int64_t> bytes;
    // This rank's byte offset in `input` of what it sends each destination.
    std::vector<std::int64_t> send_offsets;
    // This rank's byte offset in `output` of what each source sends it.
    std::vector<std::int64_t> recv_offsets;
  };
  // Moves bytes between every pair of ranks as `plan` says: all_to_all,
  // gather and scatter. A rank that receives (sends) nothing may pass an
  // undefined output (input). Input and output must not overlap.
  std::shared_future<void> exchange(at::Tensor output, at::Tensor input, ExchangePlan plan,
                                    std::string what);

 private:
  // Queues `body` on the worker; after a failure every later body is
  // refused, as the ranks' barrier counts no longer agree.
  std::shared_future<void> submit(std::string what, std::function<void(const std::string&)> body);
  // The buffer set of the next round (the sets alternate).
  std::uint8_t* next_set();
  void arrive_and_wait(const std::string& what);
  // Round `round` of a call shaped `shape`: the round's buffer set; in the
  // first round, this rank's shape is posted beside it.
  std::uint8_t* begin_round(std::size_t round, const ShmCallShape& shape);
  // The barrier after round `round`'s writes; after the first round's,
  // throws CommError unless every rank posted `shape`.
  void arrive_and_check(std::size_t round, const ShmCallShape& shape, const std::string& what);
  ShmCallShape* posted_shape(std::uint64_t parity, int rank) const;
  void run_all_reduce(at::Tensor& tensor, ReduceOp op, const std::string& what);
  void run_all_gather(const at::Tensor& output, const at::Tensor& input, const std::string& what);
  void run_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                          const std::string& what);
  void run_exchange(const at::Tensor& output, const at::Tensor& input, const ExchangePlan& plan,
                    const std::string& what);

  ShmSegment segment_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  std::uint32_t generation_ = 0;
  std::uint64_t round_ = 0;  // rounds run so far, of every collective
  std::string failed_;  // first error; the transport is unusable after one
  SerialWorker worker_;  // last: stops before the state its jobs use
};

}  // namespace tandem::detail
