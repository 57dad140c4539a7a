#include "comm/shm_channel.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tandem/core/error.h"

namespace tandem::detail {
namespace shm_ring {

constexpr std::size_t kLine = 64;
constexpr std::size_t kHeaderBytes = 5 * kLine;

std::atomic<std::uint64_t>* position(std::uint8_t* base, int index) {
  return reinterpret_cast<std::atomic<std::uint64_t>*>(base + index * kLine);
}
std::atomic<std::uint32_t>* sequence(std::uint8_t* base, int index) {
  return reinterpret_cast<std::atomic<std::uint32_t>*>(base + index * kLine);
}

enum Line : int { kWritten = 0, kRead = 1, kDataSeq = 2, kSpaceSeq = 3, kAttached = 4 };

// Spins this many times before sleeping: long enough to catch a peer that is
// copying on another core, short enough not to matter when it is not.
// (hardware_concurrency() reads /sys: asked once.)
int spin_limit() {
  static const int limit = std::thread::hardware_concurrency() > 1 ? 4000 : 0;
  return limit;
}

}  // namespace shm_ring

ShmChannel::ShmChannel(ShmSegment segment, bool creator)
    : segment_(std::move(segment)), creator_(creator) {}

ShmChannel ShmChannel::attach(c10d::Store& store, const std::string& key) {
  constexpr std::size_t kBytes = shm_ring::kHeaderBytes + kRingBytes;
  std::vector<std::uint8_t> winner;
  if (store.check({key})) {
    winner = store.get(key);  // the peer came first: no segment of our own
  } else {
    ShmSegment mine = ShmSegment::create(kBytes, 0, 1);
    const std::vector<std::uint8_t> name(mine.name().begin(), mine.name().end());
    try {
      winner = store.compareSet(key, {}, name);
    } catch (...) {
      mine.unlink();  // the store is gone: no peer will ever look for the name
      throw;
    }
    if (winner == name) return ShmChannel(std::move(mine), true);
    mine.unlink();  // the peer won the race between check and compare-and-set
  }
  // Map the peer's segment, tell it we came, and remove the name.
  ShmSegment theirs = ShmSegment::open(std::string(winner.begin(), winner.end()), kBytes, 1, 1);
  shm_ring::sequence(theirs.data(), shm_ring::kAttached)->store(1, std::memory_order_release);
  theirs.unlink();
  return ShmChannel(std::move(theirs), false);
}

ShmChannel::~ShmChannel() {
  if (!creator_ || !segment_.valid()) return;
  std::uint8_t* base = segment_.data();
  const bool peer_came =
      shm_ring::sequence(base, shm_ring::kAttached)->load(std::memory_order_acquire) != 0;
  const bool data_waits = shm_ring::position(base, shm_ring::kWritten)->load() !=
                          shm_ring::position(base, shm_ring::kRead)->load();
  // A sender may finish (and leave) before its receiver arrives: the name
  // stays for the receiver, which removes it once it has mapped the segment.
  // Otherwise the peer never came and nothing else will remove it.
  if (!peer_came && !data_waits) segment_.unlink();
}

void ShmChannel::wait_for(std::atomic<std::uint32_t>* seq, std::uint32_t seen, const Bound& bound) {
  if (bound.stopping->load(std::memory_order_acquire)) throw Stopped{};
  const auto now = std::chrono::steady_clock::now();
  if (now >= bound.deadline) {
    std::string why = *bound.explain ? (*bound.explain)() : "";
    if (why.empty()) why = "the peer is missing, slow or stuck; check its log, or raise the timeout";
    TANDEM_THROW(TimeoutError, "{} timed out after {} ms: {}", *bound.what, bound.timeout.count(),
                 why);
  }
  futex_wait(seq, seen,
             std::min<std::chrono::nanoseconds>(bound.deadline - now, std::chrono::milliseconds(50)));
}

void ShmChannel::write(const void* data, std::size_t bytes, const Bound& bound) {
  std::uint8_t* base = segment_.data();
  std::uint8_t* ring = base + shm_ring::kHeaderBytes;
  auto* write_pos = shm_ring::position(base, shm_ring::kWritten);
  auto* read_pos = shm_ring::position(base, shm_ring::kRead);
  auto* space_seq = shm_ring::sequence(base, shm_ring::kSpaceSeq);
  const auto* in = static_cast<const std::uint8_t*>(data);
  std::uint64_t head = write_pos->load(std::memory_order_relaxed);
  int spins = 0;
  while (bytes > 0) {
    const std::uint32_t seen = space_seq->load(std::memory_order_acquire);
    const std::uint64_t tail = read_pos->load(std::memory_order_acquire);
    const std::size_t free = kRingBytes - static_cast<std::size_t>(head - tail);
    if (free == 0) {
      if (++spins < shm_ring::spin_limit()) {
        cpu_relax();
      } else {
        wait_for(space_seq, seen, bound);
      }
      continue;
    }
    spins = 0;
    const std::size_t at = static_cast<std::size_t>(head % kRingBytes);
    const std::size_t n = std::min({bytes, free, kRingBytes - at});
    std::memcpy(ring + at, in, n);
    in += n;
    bytes -= n;
    head += n;
    write_pos->store(head, std::memory_order_release);
    shm_ring::sequence(base, shm_ring::kDataSeq)->fetch_add(1, std::memory_order_acq_rel);
    futex_wake_all(shm_ring::sequence(base, shm_ring::kDataSeq));
  }
}

void ShmChannel::read(void* data, std::size_t bytes, const Bound& bound) {
  std::uint8_t* base = segment_.data();
  const std::uint8_t* ring = base + shm_ring::kHeaderBytes;
  auto* write_pos = shm_ring::position(base, shm_ring::kWritten);
  auto* read_pos = shm_ring::position(base, shm_ring::kRead);
  auto* data_seq = shm_ring::sequence(base, shm_ring::kDataSeq);
  auto* out = static_cast<std::uint8_t*>(data);
  std::uint64_t tail = read_pos->load(std::memory_order_relaxed);
  int spins = 0;
  while (bytes > 0) {
    const std::uint32_t seen = data_seq->load(std::memory_order_acquire);
    const std::uint64_t head = write_pos->load(std::memory_order_acquire);
    const std::size_t ready = static_cast<std::size_t>(head - tail);
    if (ready == 0) {
      if (++spins < shm_ring::spin_limit()) {
        cpu_relax();
      } else {
        wait_for(data_seq, seen, bound);
      }
      continue;
    }
    spins = 0;
    const std::size_t at = static_cast<std::size_t>(tail % kRingBytes);
    const std::size_t n = std::min({bytes, ready, kRingBytes - at});
    if (out != nullptr) {
      std::memcpy(out, ring + at, n);
      out += n;
    }
    bytes -= n;
    tail += n;
    read_pos->store(tail, std::memory_order_release);
    shm_ring::sequence(base, shm_ring::kSpaceSeq)->fetch_add(1, std::memory_order_acq_rel);
    futex_wake_all(shm_ring::sequence(base, shm_ring::kSpaceSeq));
  }
}

}  // namespace tandem::detail
