#include "tandem/core/cpu_allocator.h"

#include <unistd.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

namespace tandem {
namespace {

constexpr std::size_t kLargeBlock = std::size_t{1} << 20;
constexpr std::size_t kRounding = std::size_t{64} << 10;  // reuse across slightly different sizes

std::size_t round_up(std::size_t n) { return (n + kRounding - 1) / kRounding * kRounding; }

class CachingCpuAllocator final : public c10::Allocator {
 public:
  explicit CachingCpuAllocator(std::uint64_t max_cached) : max_cached_(max_cached) {}

  c10::DataPtr allocate(std::size_t n) override {
    if (n < kLargeBlock) {
      void* p = c10::alloc_cpu(n);
      return {p, p, &free_block, c10::Device(c10::kCPU)};
    }
    const std::size_t size = round_up(n);
    void* p = take_cached(size);
    if (p == nullptr) p = fresh(size);
    return {p, p, &free_block, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  CpuAllocatorStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void release_all() const {
    std::lock_guard<std::mutex> lock(mutex_);
    release_locked();
  }

  static CachingCpuAllocator* instance;

 private:
  static void free_block(void* p) { instance->give_back(p); }

  void* take_cached(std::size_t size) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    stats_.in_use_bytes += size;
    ++stats_.reuse_count;
    live_[p] = size;
    return p;
  }

  void* fresh(std::size_t size) const {
    void* p = nullptr;
    try {
      p = c10::alloc_cpu(size);
    } catch (const c10::Error&) {
      release_all();  // cached blocks may be what stands between us and success
      p = c10::alloc_cpu(size);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.in_use_bytes += size;
    ++stats_.fresh_count;
    live_[p] = size;
    return p;
  }

  void give_back(void* p) const {
    if (p == nullptr) return;
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      lock.unlock();
      c10::free_cpu(p);  // a small block
      return;
    }
    const std::size_t size = it->second;
    live_.erase(it);
    stats_.in_use_bytes -= size;
    if (stats_.cached_bytes + size > max_cached_) {
      lock.unlock();
      c10::free_cpu(p);
      return;
    }
    free_[size].push_back(p);
    stats_.cached_bytes += size;
  }

  void release_locked() const {
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) c10::free_cpu(p);
      stats_.cached_bytes -= size * blocks.size();
      blocks.clear();
    }
  }

  const std::uint64_t max_cached_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, std::size_t> live_;
  mutable std::unordered_map<std::size_t, std::vector<void*>> free_;
  mutable CpuAllocatorStats stats_;
};

CachingCpuAllocator* CachingCpuAllocator::instance = nullptr;
std::once_flag install_once;

}  // namespace

void enable_cpu_caching_allocator(std::uint64_t max_cached_bytes) {
  std::call_once(install_once, [&] {
    if (max_cached_bytes == 0) {
      max_cached_bytes = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                         static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) / 4;
    }
    // Never destroyed: tensors may be freed during static destruction.
    CachingCpuAllocator::instance = new CachingCpuAllocator(max_cached_bytes);
    c10::SetCPUAllocator(CachingCpuAllocator::instance, /*priority=*/1);
  });
}

bool cpu_caching_allocator_enabled() { return CachingCpuAllocator::instance != nullptr; }

CpuAllocatorStats cpu_allocator_stats() {
  return CachingCpuAllocator::instance ? CachingCpuAllocator::instance->stats() : CpuAllocatorStats{};
}

void release_cached_cpu_memory() {
  if (CachingCpuAllocator::instance) CachingCpuAllocator::instance->release_all();
}

}  // namespace tandem
