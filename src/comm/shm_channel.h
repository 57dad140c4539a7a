#pragma once
// ShmChannel: one direction of point-to-point traffic between two processes
// (or threads) of one host: a byte ring in a shared-memory segment, with one
// writer and one reader.
//
// The two ends meet without waiting for each other: whichever attaches first
// creates the segment and publishes its name under a store key with
// compare-and-set; the second maps it and removes the name, so nothing stays
// in /dev/shm once both are attached. A creator destroyed before its peer
// came removes the name, unless it wrote data the peer has yet to read (a
// sender may finish and leave first): then the receiver removes it when it
// maps it, and only a receiver that never comes leaves it behind.
//
// Layout of the data area: [write position][read position][data sequence]
// [space sequence][attached], one cache line each, then the ring. Positions count
// bytes since the start and only grow; the writer owns the first, the reader
// the second. Each side bumps its sequence word and wakes the futex after it
// moves its position, so the other side sleeps instead of spinning.
//
// Not thread-safe: one thread writes and one thread reads.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include "comm/shm_segment.h"

namespace c10d {
class Store;
}

namespace tandem::detail {

// How long a write or read may wait, and how its timeout reads:
// "<what> timed out after <timeout> ms: <explain()>".
struct ShmChannelBound {
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout;
  const std::atomic<bool>* stopping;  // ends a wait with Stopped when true
  const std::string* what;
  const std::function<std::string()>* explain;  // may hold null
};

class ShmChannel {
 public:
  static constexpr std::size_t kRingBytes = std::size_t{2} << 20;

  // Thrown when a wait ends early because the bound's stop flag turned true.
  struct Stopped {};

  // Attaches to the channel named by `key` in `store`, creating it if the
  // peer has not yet. Never blocks on the peer. Throws CommError when the
  // segment cannot be made or mapped.
  static ShmChannel attach(c10d::Store& store, const std::string& key);

  ShmChannel() = default;
  ShmChannel(ShmChannel&&) noexcept = default;
  ShmChannel& operator=(ShmChannel&&) noexcept = default;
  ~ShmChannel();

  using Bound = ShmChannelBound;

  // Copies `bytes` bytes into the ring, as space frees up; returns once all
  // are in (the reader may not have taken them yet). Throws TimeoutError
  // when the deadline passes first, Stopped when *stopping turns true.
  void write(const void* data, std::size_t bytes, const Bound& bound);
  // Reads `bytes` bytes into `data` (skips them when it is null), as they
  // arrive. Same errors as write().
  void read(void* data, std::size_t bytes, const Bound& bound);

 private:
  ShmChannel(ShmSegment segment, bool creator);
  // Sleeps until `sequence` moves from `seen` (or a short slice passes),
  // after checking the bound's deadline and stop flag.
  void wait_for(std::atomic<std::uint32_t>* sequence, std::uint32_t seen, const Bound& bound);

  ShmSegment segment_;
  bool creator_ = false;
};

}  // namespace tandem::detail
