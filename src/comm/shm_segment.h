#pragma once
// A shared-memory segment mapped by every rank on one host, with a futex
// barrier in its first page. The building block of the intra-node transport.
//
// Layout: [control: wake word + one arrival counter per rank][data bytes].
// Not thread-safe: one thread per rank drives barrier().

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::detail {

// Futex on a 32-bit word that several processes map: futex_wait sleeps while
// *word == expected, for at most `max` (spurious wake-ups happen: recheck);
// futex_wake_all wakes every sleeper.
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::chrono::nanoseconds max);
void futex_wake_all(std::atomic<std::uint32_t>* word);

// Spin-loop hint.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

class ShmSegment {
 public:
  static constexpr int kMaxRanks = 255;

  // Rank 0 creates a segment of `data_bytes` under a fresh name; returns it
  // mapped. Throws CommError (e.g. /dev/shm full) with the size and the fix.
  static ShmSegment create(std::size_t data_bytes, int rank, int world_size);
  // Other ranks map the segment rank 0 created.
  static ShmSegment open(const std::string& name, std::size_t data_bytes, int rank, int world_size);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // Removes the name (the mapping stays valid). Rank 0 calls it once every
  // rank has mapped the segment, so nothing is left in /dev/shm after a crash.
  void unlink();

  const std::string& name() const { return name_; }
  std::uint8_t* data() const { return data_; }
  std::size_t data_bytes() const { return data_bytes_; }
  bool valid() const { return base_ != nullptr; }

  // Waits until every rank has called barrier() `generation` times. Spins
  // briefly, then sleeps on a futex. Throws TimeoutError naming the ranks
  // that did not arrive within `timeout`; `what` names the operation.
  void barrier(std::uint32_t generation, std::chrono::milliseconds timeout, const std::string& what);

 private:
  ShmSegment(std::string name, void* base, std::size_t total, int rank, int world_size);
  bool all_arrived(std::uint32_t generation) const;

  std::string name_;
  void* base_ = nullptr;
  std::size_t total_bytes_ = 0;
  std::uint8_t* data_ = nullptr;
  std::size_t data_bytes_ = 0;
  int rank_ = 0;
  int world_size_ = 1;
  int spin_limit_ = 0;  // busy-wait only when every rank can have a core
};

}  // namespace tandem::detail
