#include "comm/shm_transport.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/reduce_kernels.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::detail {
namespace {

// Rank `rank`'s slot of a buffer set; slot world_size is the result buffer.
std::uint8_t* slot(std::uint8_t* set, int rank) {
  return set + static_cast<std::size_t>(rank) * ShmTransport::kChunkBytes;
}

// A posted call shape takes a cache line of its own: ranks write theirs at once.
constexpr std::size_t kShapeBytes = 64;

std::size_t sets_bytes(int world_size) {
  return 2 * (static_cast<std::size_t>(world_size) + 1) * ShmTransport::kChunkBytes;
}

std::size_t rounds_for(std::size_t bytes, std::size_t per_round) {
  return std::max<std::size_t>(1, (bytes + per_round - 1) / per_round);
}

std::uint64_t hash_bytes(const std::vector<std::int64_t>& values) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (std::int64_t v : values) {
    h ^= static_cast<std::uint64_t>(v);
    h *= 1099511628211ull;
  }
  return h;
}

const char* kind_name(std::int64_t kind) {
  switch (kind) {
    case 1: return "all_reduce";
    case 2: return "all_gather";
    case 3: return "reduce_scatter";
    case 4: return "exchange";
  }
  return "an unknown collective";
}

// "all_reduce of 1000 Float elements (sum)", "exchange moving 16 bytes".
std::string describe_call(const ShmCallShape& shape) {
  std::string text = kind_name(shape.kind);
  if (shape.dtype < 0) return text + fmt::format(" moving {} bytes", shape.count);
  text += fmt::format(" of {} {} elements", shape.count,
                      c10::toString(static_cast<c10::ScalarType>(shape.dtype)));
  if (shape.op >= 0) text += fmt::format(" ({})", to_string(static_cast<ReduceOp>(shape.op)));
  return text;
}

}  // namespace

// Segment layout: two buffer sets (round parity 0 and 1), each holding one
// slot per rank plus one result buffer, all kChunkBytes long. Every round of
// every collective takes the next set, so the rules below hold across
// collectives of different kinds too.
//
// Why the barriers suffice: round c uses set c % 2, and each of its barriers
// comes after this rank's writes to the set and before reads of what other
// ranks wrote. A rank touches set c % 2 in round c only before it arrives at
// the first barrier of round c + 1. So once it has passed that barrier (every
// rank arrived there), no rank still reads or writes what round c left in the
// set, and round c + 2 may overwrite it. Within a round, all-reduce writes
// the result only after its first barrier (every slot is in) and reads it
// after its second (every slice is reduced).
//
// After the sets come two rows of posted call shapes, one per round parity.
// The shape posted in round c is read right after that round's first
// barrier and rewritten no earlier than round c + 2, so the same argument
// covers it.
std::size_t ShmTransport::segment_bytes(int world_size) {
  return sets_bytes(world_size) + 2 * static_cast<std::size_t>(world_size) * kShapeBytes;
}

ShmTransport::ShmTransport(ShmSegment segment, int rank, int world_size,
                           std::chrono::milliseconds timeout)
    : segment_(std::move(segment)),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout) {}

bool ShmTransport::supports(const at::Tensor& tensor, bool reduces) {
  return tensor.device().is_cpu() && tensor.layout() == at::kStrided && tensor.is_contiguous() &&
         (!reduces || reducible_dtype(tensor.scalar_type()));
}

std::shared_future<void> ShmTransport::submit(std::string what,
                                              std::function<void(const std::string&)> body) {
  return worker_.submit([this, body = std::move(body), what = std::move(what)] {
    if (!failed_.empty()) {
      TANDEM_THROW(CommError, "{} cannot run: the shared-memory transport failed earlier ({})",
                   what, failed_);
    }
    try {
      body(what);
    } catch (const std::exception& e) {
      failed_ = e.what();
      throw;
    }
  });
}

std::shared_future<void> ShmTransport::all_reduce(at::Tensor tensor, ReduceOp op, std::string what) {
  return submit(std::move(what), [this, tensor, op](const std::string& w) mutable {
    run_all_reduce(tensor, op, w);
  });
}

std::shared_future<void> ShmTransport::all_gather(at::Tensor output, at::Tensor input,
                                                  std::string what) {
  return submit(std::move(what), [this, output, input](const std::string& w) {
    run_all_gather(output, input, w);
  });
}

std::shared_future<void> ShmTransport::reduce_scatter(at::Tensor output, at::Tensor input,
                                                      ReduceOp op, std::string what) {
  return submit(std::move(what), [this, output, input, op](const std::string& w) {
    run_reduce_scatter(output, input, op, w);
  });
}

std::shared_future<void> ShmTransport::exchange(at::Tensor output, at::Tensor input,
                                                ExchangePlan plan, std::string what) {
  return submit(std::move(what), [this, output, input, plan = std::move(plan)](const std::string& w) {
    run_exchange(output, input, plan, w);
  });
}

std::uint8_t* ShmTransport::next_set() {
  const std::size_t set_bytes = (static_cast<std::size_t>(world_size_) + 1) * kChunkBytes;
  return segment_.data() + (round_++ % 2) * set_bytes;
}

void ShmTransport::arrive_and_wait(const std::string& what) {
  segment_.barrier(++generation_, timeout_, what);
}

ShmCallShape* ShmTransport::posted_shape(std::uint64_t parity, int rank) const {
  static_assert(sizeof(ShmCallShape) <= kShapeBytes, "a posted shape must fit its line");
  const std::size_t index = parity * static_cast<std::size_t>(world_size_) +
                            static_cast<std::size_t>(rank);
  return reinterpret_cast<ShmCallShape*>(segment_.data() + sets_bytes(world_size_) +
                                         index * kShapeBytes);
}

std::uint8_t* ShmTransport::begin_round(std::size_t round, const ShmCallShape& shape) {
  if (round == 0) *posted_shape(round_ % 2, rank_) = shape;
  return next_set();
}

// Past the desync check's window (process_group_impl.cpp), nothing else
// stops ranks that pass different sizes: while their round counts agree,
// each would silently reduce or copy the other's bytes as if they matched.
void ShmTransport::arrive_and_check(std::size_t round, const ShmCallShape& shape,
                                    const std::string& what) {
  arrive_and_wait(what);
  if (round != 0) return;
  const std::uint64_t parity = (round_ - 1) % 2;  // begin_round took this round's set
  bool agree = true;
  for (int r = 0; r < world_size_ && agree; ++r) agree = *posted_shape(parity, r) == shape;
  if (agree) return;
  // Every rank reads the same rows, so every rank throws.
  std::vector<ShmCallShape> kinds;
  std::vector<std::string> ranks;
  for (int r = 0; r < world_size_; ++r) {
    const ShmCallShape posted = *posted_shape(parity, r);
    auto it = std::find(kinds.begin(), kinds.end(), posted);
    if (it == kinds.end()) {
      kinds.push_back(posted);
      ranks.emplace_back();
      it = kinds.end() - 1;
    }
    auto& names = ranks[static_cast<std::size_t>(it - kinds.begin())];
    names += (names.empty() ? "" : ", ") + std::to_string(r);
  }
  std::string who;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    const bool several = ranks[i].find(',') != std::string::npos;
    who += fmt::format("{}{} {} called {}", i == 0 ? "" : (i == 1 ? " but " : " and "),
                       several ? "ranks" : "rank", ranks[i], describe_call(kinds[i]));
  }
  TANDEM_THROW(CommError,
               "{}: the ranks passed different tensors to it: {} (shared-memory transport; "
               "ranks are numbered in this group). A collective desync: every rank must pass the "
               "same dtype, size and reduce op. Only the first collectives are checked "
               "(ProcessGroupOptions::desync_check_collectives); TANDEM_DEBUG=DETAIL checks "
               "every collective and names the first difference. The group's shared-memory "
               "collectives fail after it",
               what, who);
}

void ShmTransport::run_all_reduce(at::Tensor& tensor, ReduceOp op, const std::string& what) {
  const std::size_t elem = tensor.element_size();
  const std::size_t total = static_cast<std::size_t>(tensor.numel()) * elem;
  const std::size_t chunk_elems = kChunkBytes / elem;
  const ShmCallShape shape{1, static_cast<std::int64_t>(tensor.scalar_type()),
                           static_cast<std::int64_t>(op), tensor.numel()};
  auto* bytes = static_cast<std::uint8_t*>(tensor.data_ptr());
  std::vector<const void*> slices(static_cast<std::size_t>(world_size_));
  const std::size_t rounds = rounds_for(total, chunk_elems * elem);
  for (std::size_t round = 0; round < rounds; ++round) {
    const std::size_t offset = round * chunk_elems * elem;
    const std::size_t len = std::min(chunk_elems * elem, total - offset);
    const std::size_t count = len / elem;
    std::uint8_t* set = begin_round(round, shape);
    std::uint8_t* result = slot(set, world_size_);

    if (len > 0) std::memcpy(slot(set, rank_), bytes + offset, len);
    arrive_and_check(round, shape, what);

    // This rank's slice of the chunk, in whole elements.
    const std::size_t per_rank = (count + world_size_ - 1) / world_size_;
    const std::size_t lo = std::min(count, per_rank * rank_);
    const std::size_t hi = std::min(count, lo + per_rank);
    for (int k = 0; k < world_size_; ++k) slices[k] = slot(set, k) + lo * elem;
    if (hi > lo) {
      reduce_buffers(result + lo * elem, slices.data(), world_size_,
                     static_cast<std::int64_t>(hi - lo), tensor.scalar_type(), op);
    }
    arrive_and_wait(what);

    if (len > 0) std::memcpy(bytes + offset, result, len);
  }
}

void ShmTransport::run_all_gather(const at::Tensor& output, const at::Tensor& input,
                                  const std::string& what) {
  // Bytes only: a round may end inside an element.
  const std::size_t total = static_cast<std::size_t>(input.numel()) * input.element_size();
  const auto* in = static_cast<const std::uint8_t*>(input.data_ptr());
  auto* out = static_cast<std::uint8_t*>(output.data_ptr());
  const ShmCallShape shape{2, static_cast<std::int64_t>(input.scalar_type()), -1, input.numel()};
  const std::size_t rounds = rounds_for(total, kChunkBytes);
  for (std::size_t round = 0; round < rounds; ++round) {
    const std::size_t offset = round * kChunkBytes;
    const std::size_t len = std::min(kChunkBytes, total - offset);
    std::uint8_t* set = begin_round(round, shape);
    if (len > 0) std::memcpy(slot(set, rank_), in + offset, len);
    arrive_and_check(round, shape, what);
    if (len == 0) break;
    for (int k = 0; k < world_size_; ++k) {
      std::uint8_t* dst = out + static_cast<std::size_t>(k) * total + offset;
      const std::uint8_t* src = k == rank_ ? in + offset : slot(set, k);
      if (dst != src) std::memcpy(dst, src, len);  // equal when input aliases its place
    }
  }
}

void ShmTransport::run_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                      ReduceOp op, const std::string& what) {
  const std::size_t elem = input.element_size();
  const std::size_t n = static_cast<std::size_t>(output.numel());  // elements per rank's chunk
  // Per round, `piece` elements of each of the world_size chunks fill a slot.
  const std::size_t most = kChunkBytes / (static_cast<std::size_t>(world_size_) * elem);
  const auto* in = static_cast<const std::uint8_t*>(input.data_ptr());
  auto* out = static_cast<std::uint8_t*>(output.data_ptr());
  std::vector<const void*> pieces(static_cast<std::size_t>(world_size_));
  const ShmCallShape shape{3, static_cast<std::int64_t>(input.scalar_type()),
                           static_cast<std::int64_t>(op), input.numel()};
  const std::size_t rounds = rounds_for(n, most);
  for (std::size_t round = 0; round < rounds; ++round) {
    const std::size_t offset = round * most;
    const std::size_t piece = std::min(most, n - offset);
    std::uint8_t* set = begin_round(round, shape);
    std::uint8_t* mine = slot(set, rank_);
    for (int r = 0; r < world_size_ && piece > 0; ++r) {
      std::memcpy(mine + r * piece * elem, in + (r * n + offset) * elem, piece * elem);
    }
    arrive_and_check(round, shape, what);
    if (piece == 0) break;
    for (int k = 0; k < world_size_; ++k) pieces[k] = slot(set, k) + rank_ * piece * elem;
    reduce_buffers(out + offset * elem, pieces.data(), world_size_,
                   static_cast<std::int64_t>(piece), input.scalar_type(), op);
  }
}

// Exchange: a slot is cut into world_size parts of `part` bytes, part d
// carrying this round's piece for rank d. Every rank derives the number of
// rounds from the same byte matrix, so all take the same barriers; a rank's
// reads of round c happen between the barriers of rounds c and c + 1, as in
// the other collectives.
void ShmTransport::run_exchange(const at::Tensor& output, const at::Tensor& input,
                                const ExchangePlan& plan, const std::string& what) {
  const auto world = static_cast<std::size_t>(world_size_);
  const auto me = static_cast<std::size_t>(rank_);
  const std::size_t part = kChunkBytes / world;
  auto bytes = [&](std::size_t src, std::size_t dst) {
    return static_cast<std::size_t>(plan.bytes[src * world + dst]);
  };
  const auto* in = input.defined() ? static_cast<const std::uint8_t*>(input.data_ptr()) : nullptr;
  auto* out = output.defined() ? static_cast<std::uint8_t*>(output.data_ptr()) : nullptr;
  std::size_t rounds = 1;  // one at least, to compare the ranks' plans
  for (std::size_t src = 0; src < world; ++src) {
    for (std::size_t dst = 0; dst < world; ++dst) {
      if (src != dst) rounds = std::max(rounds, (bytes(src, dst) + part - 1) / part);
    }
  }
  if (bytes(me, me) > 0) {
    std::memcpy(out + plan.recv_offsets[me], in + plan.send_offsets[me], bytes(me, me));
  }
  // The whole matrix, as every rank must pass the same one.
  std::int64_t moved = 0;
  for (std::int64_t b : plan.bytes) moved += b;
  const ShmCallShape shape{4, -1, -1, moved, hash_bytes(plan.bytes)};
  for (std::size_t round = 0; round < rounds; ++round) {
    const std::size_t lo = round * part;
    std::uint8_t* set = begin_round(round, shape);
    std::uint8_t* mine = slot(set, rank_);
    for (std::size_t dst = 0; dst < world; ++dst) {
      if (dst == me || bytes(me, dst) <= lo) continue;
      std::memcpy(mine + dst * part, in + plan.send_offsets[dst] + lo,
                  std::min(part, bytes(me, dst) - lo));
    }
    arrive_and_check(round, shape, what);
    for (std::size_t src = 0; src < world; ++src) {
      if (src == me || bytes(src, me) <= lo) continue;
      std::memcpy(out + plan.recv_offsets[src] + lo,
                  slot(set, static_cast<int>(src)) + me * part, std::min(part, bytes(src, me) - lo));
    }
  }
}

}  // namespace tandem::detail
