// Accelerator::free_memory and find_executable_batch_size: letting go of
// what was prepared, and retrying a run at smaller batch sizes after an
// out-of-memory error, with every rank agreeing on the size.

#include <exception>
#include <new>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <fmt/ranges.h>

#include "accelerate/accelerator_impl.h"
#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "core/torch_compat_memory.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {

void Accelerator::free_memory() {
  Impl& s = *impl_;
  // The join hooks sit on the models' parameters: off first.
  s.join_hooks.reset();
  // A fresh micro-step schedule at step 0 (Accelerate resets its step).
  s.prepared.clear(s.config.gradient_accumulation_steps.value_or(1));
  s.data->reset();
  s.models_checked = false;
  compat::empty_cuda_cache();
}

namespace accelerator_memory_detail {

// What one attempt did on this rank, as the agreement sends it.
constexpr const char* kOutOfMemory = "oom";

// LibTorch's CPU allocator reports running out of memory as a plain
// c10::Error (an enforce failure in alloc_cpu.cpp), not an OutOfMemoryError;
// Accelerate's should_reduce_batch_size recognises it by this message too.
bool cpu_allocator_out_of_memory(const c10::Error& e) {
  return std::string(e.what()).find("DefaultCPUAllocator: can't allocate memory") !=
         std::string::npos;
}

}  // namespace accelerator_memory_detail

int64_t Accelerator::find_executable_batch_size(const std::function<void(int64_t)>& fn,
                                                int64_t starting_batch_size,
                                                const std::function<int64_t(int64_t)>& reduce) {
  TANDEM_CHECK_ARG(fn != nullptr, "Accelerator::find_executable_batch_size: fn is empty");
  TANDEM_CHECK_ARG(starting_batch_size >= 1,
                   "Accelerator::find_executable_batch_size: starting_batch_size must be >= 1, "
                   "got {}",
                   starting_batch_size);
  const int world = num_processes();
  // Accelerate's reduce_batch_size_fn default: int(batch_size * 0.9), in
  // the same double arithmetic, so the sizes tried are Accelerate's.
  const auto next_size = [&](int64_t batch_size) {
    if (!reduce) return static_cast<int64_t>(static_cast<double>(batch_size) * 0.9);
    const int64_t smaller = reduce(batch_size);
    TANDEM_CHECK_ARG(smaller < batch_size,
                     "Accelerator::find_executable_batch_size: reduce({}) returned {}, which is "
                     "not smaller; the search would never end. Return a smaller size",
                     batch_size, smaller);
    return smaller;
  };
  for (int64_t batch_size = starting_batch_size;; batch_size = next_size(batch_size)) {
    // Every rank reaches this with the same batch_size (decided below from
    // what all ranks reported), so every rank throws here alike.
    TANDEM_CHECK_ARG(batch_size >= 1,
                     "Accelerator::find_executable_batch_size: no executable batch size found: "
                     "every size tried from {} down ran out of memory on some rank. Free memory "
                     "(a smaller model, mixed precision, ZeRO, activation checkpointing) or "
                     "check that fn releases what an attempt allocated",
                     starting_batch_size);
    std::string outcome;  // empty: fn returned
    std::exception_ptr error;
    try {
      fn(batch_size);
    } catch (const c10::OutOfMemoryError&) {
      outcome = accelerator_memory_detail::kOutOfMemory;
    } catch (const std::bad_alloc&) {
      outcome = accelerator_memory_detail::kOutOfMemory;
    } catch (const c10::Error& e) {
      if (accelerator_memory_detail::cpu_allocator_out_of_memory(e)) {
        outcome = accelerator_memory_detail::kOutOfMemory;
      } else {
        outcome = std::string("error: ") + e.what();
        error = std::current_exception();
      }
    } catch (const std::exception& e) {
      outcome = std::string("error: ") + e.what();
      error = std::current_exception();
    } catch (...) {
      outcome = "error: a non-standard exception";
      error = std::current_exception();
    }
    // Agree, so that a rank whose attempt ran while another ran out of
    // memory retries too: fn runs with the same sizes everywhere.
    const std::vector<std::string> outcomes = impl_->group->all_gather_strings(outcome);
    std::vector<int> out_of_memory;
    for (int r = 0; r < world; ++r) {
      const std::string& o = outcomes[static_cast<std::size_t>(r)];
      if (o == accelerator_memory_detail::kOutOfMemory) {
        out_of_memory.push_back(r);
      } else if (!o.empty()) {
        if (error) std::rethrow_exception(error);
        TANDEM_THROW(Error,
                     "Accelerator::find_executable_batch_size: [rank {}/{}] fn({}) failed on "
                     "rank {}: {}. Every rank stops; see that rank's error",
                     process_index(), world, batch_size, r, o.substr(7));
      }
    }
    if (out_of_memory.empty()) return batch_size;
    if (is_main_process()) {
      log_warn("find_executable_batch_size: batch size {} ran out of memory on rank(s) {}; "
               "trying a smaller one",
               batch_size, fmt::join(out_of_memory, ", "));
    }
    compat::empty_cuda_cache();
  }
}

}  // namespace tandem
