#pragma once
// A caching allocator for large CPU tensors.
//
// glibc serves every block above a few tens of MiB (and, once its heap is
// trimmed, smaller ones too) with a fresh mmap, so each training step
// page-faults its gradients, activations and optimizer temporaries back in:
// on the DDP benchmark's W=2048 MLP that made torch::optim::Adam take ~450 ms
// instead of ~30 ms. PyTorch solves the same problem on CUDA with a caching
// allocator; this is its CPU counterpart. Blocks of at least 1 MiB are kept
// on free lists by (rounded) size and reused; smaller ones go to c10's
// default allocation. Cached memory is capped, and released before an
// allocation would fail.
//
// Thread-safe. Installing it is process-wide and permanent; tensors
// allocated before keep their own deleters and are freed correctly.

#include <cstddef>
#include <cstdint>

namespace tandem {

struct CpuAllocatorStats {
  std::uint64_t cached_bytes = 0;    // free blocks held for reuse
  std::uint64_t in_use_bytes = 0;    // large blocks handed out now
  std::uint64_t reuse_count = 0;     // large allocations served from the cache
  std::uint64_t fresh_count = 0;     // large allocations that needed new memory
};

// Makes the caching allocator LibTorch's CPU allocator. Idempotent.
// `max_cached_bytes` 0 means a quarter of physical memory.
void enable_cpu_caching_allocator(std::uint64_t max_cached_bytes = 0);

// True once enable_cpu_caching_allocator() has run.
bool cpu_caching_allocator_enabled();

CpuAllocatorStats cpu_allocator_stats();

// Frees every cached block (e.g. before forking a memory-hungry child).
void release_cached_cpu_memory();

}  // namespace tandem
