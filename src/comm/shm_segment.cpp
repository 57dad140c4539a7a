#include "comm/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "tandem/comm/shm_cleanup.h"
#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

constexpr std::size_t kLine = 64;
// Word 0 is the futex every waiter sleeps on; counters follow, one per line
// so that ranks do not false-share.
constexpr std::size_t kControlBytes = kLine * (ShmSegment::kMaxRanks + 1);

std::atomic<std::uint32_t>* word(void* base, std::size_t index) {
  return reinterpret_cast<std::atomic<std::uint32_t>*>(static_cast<std::uint8_t*>(base) + index * kLine);
}

std::string fresh_name() {
  std::random_device rd;
  return "/tandem-" + std::to_string(::getpid()) + "-" + std::to_string(rd()) + std::to_string(rd());
}

void* map_fd(int fd, std::size_t total, const std::string& name) {
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    TANDEM_THROW(CommError, "cannot map shared memory {} ({} bytes): {}", name, total, std::strerror(errno));
  }
  return base;
}

}  // namespace

void futex_wake_all(std::atomic<std::uint32_t>* w) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void futex_wait(std::atomic<std::uint32_t>* w, std::uint32_t expected, std::chrono::nanoseconds max) {
  timespec ts{static_cast<time_t>(max.count() / 1000000000), static_cast<long>(max.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(w), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

ShmSegment::ShmSegment(std::string name, void* base, std::size_t total, int rank, int world_size)
    : name_(std::move(name)),
      base_(base),
      total_bytes_(total),
      data_(static_cast<std::uint8_t*>(base) + kControlBytes),
      data_bytes_(total - kControlBytes),
      rank_(rank),
      world_size_(world_size),
      spin_limit_(world_size <= static_cast<int>(std::thread::hardware_concurrency()) ? 2000 : 0) {}

ShmSegment ShmSegment::create(std::size_t data_bytes, int rank, int world_size) {
  TANDEM_CHECK_ARG(world_size <= kMaxRanks, "shared memory supports up to {} ranks per host",
                   kMaxRanks);
  const std::size_t total = kControlBytes + data_bytes;
  static std::once_flag swept;  // names dead processes left behind, once per process
  std::call_once(swept, [] { remove_stale_shared_memory(600); });
  std::string name = fresh_name();
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    TANDEM_THROW(CommError, "cannot create shared memory {}: {}", name, std::strerror(errno));
  }
  // posix_fallocate reserves the pages now, so a full /dev/shm fails here
  // with ENOSPC instead of a SIGBUS in the middle of a collective.
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(total));
  if (err != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    TANDEM_THROW(CommError,
                 "cannot reserve {} MiB of shared memory in /dev/shm: {}. Free space there, "
                 "enlarge it (docker: --shm-size), or set TANDEM_SHM=0 to use Gloo only",
                 total >> 20, std::strerror(err));
  }
  return ShmSegment(name, map_fd(fd, total, name), total, rank, world_size);
}

ShmSegment ShmSegment::open(const std::string& name, std::size_t data_bytes, int rank, int world_size) {
  const std::size_t total = kControlBytes + data_bytes;
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    TANDEM_THROW(CommError, "cannot open shared memory {} created by rank 0: {}", name,
                 std::strerror(errno));
  }
  return ShmSegment(name, map_fd(fd, total, name), total, rank, world_size);
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) ::munmap(base_, total_bytes_);
    name_ = std::move(other.name_);
    base_ = other.base_;
    total_bytes_ = other.total_bytes_;
    data_ = other.data_;
    data_bytes_ = other.data_bytes_;
    rank_ = other.rank_;
    world_size_ = other.world_size_;
    spin_limit_ = other.spin_limit_;
    other.base_ = nullptr;
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) ::munmap(base_, total_bytes_);
}

void ShmSegment::unlink() { ::shm_unlink(name_.c_str()); }

bool ShmSegment::all_arrived(std::uint32_t generation) const {
  for (int r = 0; r < world_size_; ++r) {
    std::uint32_t seen = word(base_, 1 + r)->load(std::memory_order_acquire);
    if (static_cast<std::int32_t>(seen - generation) < 0) return false;
  }
  return true;
}

void ShmSegment::barrier(std::uint32_t generation, std::chrono::milliseconds timeout,
                         const std::string& what) {
  auto* wake = word(base_, 0);
  word(base_, 1 + rank_)->store(generation, std::memory_order_release);
  wake->fetch_add(1, std::memory_order_acq_rel);
  futex_wake_all(wake);
  for (int spin = 0; spin < spin_limit_; ++spin) {
    if (all_arrived(generation)) return;
    cpu_relax();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::uint32_t seen = wake->load(std::memory_order_acquire);
    if (all_arrived(generation)) return;
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds(0)) break;
    futex_wait(wake, seen, std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(100)));
  }
  std::string missing;
  for (int r = 0; r < world_size_; ++r) {
    std::uint32_t seen = word(base_, 1 + r)->load(std::memory_order_acquire);
    if (static_cast<std::int32_t>(seen - generation) < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  TANDEM_THROW(TimeoutError,
               "{} did not complete within {} ms: rank(s) {} never arrived (shared-memory "
               "transport). A rank is missing, slow or stuck; check its log, or raise the timeout",
               what, timeout.count(), missing);
}

}  // namespace tandem::detail
