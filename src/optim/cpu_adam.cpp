// cpu_adam_step(): checks, the step's constants, the ISA choice and the split
// of the work over threads. The loops themselves are in cpu_adam_{scalar,
// avx2,avx512}.cpp.

#include "tandem/optim/cpu_adam.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "optim/cpu_adam_kernels.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

constexpr const char* kIsaNames[] = {"scalar", "avx2", "avx512"};

// Threads split the array at multiples of the widest vector times 4, so a
// chunk never starts inside a vector, whatever the thread count. (Every path
// gives the same bits anyway; this keeps the vector loads aligned as well.)
constexpr int64_t kChunkAlign = 64;
// Below this many elements per thread, waking another thread costs more than
// it saves (~4096 elements is ~110 KiB of traffic, a few microseconds).
constexpr int64_t kMinElementsPerThread = 4096;

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
#if defined(__x86_64__) || defined(__i386__)
    // libgcc's checks include the OS's support for the wider registers (XCR0).
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f");
#else
    default:
      return false;
#endif
  }
  return false;
}

Isa detect_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

// -1: automatic; otherwise a forced Isa (test seam).
std::atomic<int> forced_isa{-1};

Isa current_isa() {
  static const Isa detected = detect_isa();
  const int forced = forced_isa.load(std::memory_order_relaxed);
  return forced < 0 ? detected : static_cast<Isa>(forced);
}

detail::AdamSpanFn span_fn(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return detail::adam_span_avx512;
    case Isa::kAvx2:
      return detail::adam_span_avx2;
    case Isa::kScalar:
      break;
  }
  return detail::adam_span_scalar;
}

Isa parse_isa(const char* name) {
  for (int i = 0; i < 3; ++i) {
    if (std::strcmp(name, kIsaNames[i]) == 0) return static_cast<Isa>(i);
  }
  TANDEM_THROW(UsageError, "unknown CPU Adam ISA '{}': use \"avx512\", \"avx2\" or \"scalar\"",
               name);
}

void check_hyperparams(const AdamHyperparams& h) {
  TANDEM_CHECK_ARG(h.lr >= 0, "cpu_adam_step: invalid learning rate {} (must be >= 0)", h.lr);
  TANDEM_CHECK_ARG(h.eps >= 0, "cpu_adam_step: invalid eps {} (must be >= 0)", h.eps);
  TANDEM_CHECK_ARG(h.beta1 >= 0 && h.beta1 < 1,
                   "cpu_adam_step: invalid beta1 {} (must be in [0, 1))", h.beta1);
  TANDEM_CHECK_ARG(h.beta2 >= 0 && h.beta2 < 1,
                   "cpu_adam_step: invalid beta2 {} (must be in [0, 1))", h.beta2);
  TANDEM_CHECK_ARG(h.weight_decay >= 0,
                   "cpu_adam_step: invalid weight_decay {} (must be >= 0)", h.weight_decay);
}

// The scalars as LibTorch's Adam::step / AdamW::step compute them in
// double, then rounded to float as ATen rounds a Scalar for a float tensor.
detail::AdamConstants make_constants(const AdamHyperparams& h, int64_t step) {
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  detail::AdamConstants c{};
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1 - h.beta2);
  c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-(h.lr / bias_correction1));
  // torch skips the weight-decay op altogether when weight_decay == 0.
  c.l2 = !h.decoupled_weight_decay && h.weight_decay != 0;
  c.decoupled = h.decoupled_weight_decay && h.weight_decay != 0;
  c.weight_decay = static_cast<float>(h.weight_decay);
  c.param_decay = static_cast<float>(1 - h.lr * h.weight_decay);
  return c;
}

}  // namespace

void cpu_adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                   int64_t step, const AdamHyperparams& h, int threads) {
  TANDEM_CHECK_ARG(n >= 0, "cpu_adam_step: negative element count {}", n);
  TANDEM_CHECK_ARG(step >= 1,
                   "cpu_adam_step: step must be the 1-based count of this update, got {}", step);
  check_hyperparams(h);
  if (n == 0) return;
  TANDEM_CHECK_ARG(param && grad && exp_avg && exp_avg_sq,
                   "cpu_adam_step: null array for {} elements (param {}, grad {}, exp_avg {}, "
                   "exp_avg_sq {})",
                   n, static_cast<const void*>(param), static_cast<const void*>(grad),
                   static_cast<const void*>(exp_avg), static_cast<const void*>(exp_avg_sq));

  const detail::AdamConstants c = make_constants(h, step);
  const detail::AdamSpanFn fn = span_fn(current_isa());
  const int64_t wanted = threads > 0 ? threads : at::get_num_threads();
  const int64_t team =
      std::clamp<int64_t>((n + kMinElementsPerThread - 1) / kMinElementsPerThread, 1, wanted);

  // Thread t of `count` takes whole kChunkAlign blocks [t * per, (t+1) * per).
  const auto run_part = [&](int64_t t, int64_t count) {
    const int64_t blocks = (n + kChunkAlign - 1) / kChunkAlign;
    const int64_t per = (blocks + count - 1) / count;
    const int64_t begin = std::min(n, t * per * kChunkAlign);
    const int64_t end = std::min(n, (t + 1) * per * kChunkAlign);
    if (begin < end) {
      fn(param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin, end - begin, c);
    }
  };
  if (team == 1) {
    run_part(0, 1);
    return;
  }
#ifdef _OPENMP
  // OpenMP keeps its threads between calls (ATen's own runtime here). Inside
  // another parallel region the team is just this thread.
#pragma omp parallel num_threads(static_cast<int>(team))
  run_part(omp_get_thread_num(), omp_get_num_threads());
#else
  std::vector<std::thread> workers;
  for (int64_t t = 1; t < team; ++t) workers.emplace_back(run_part, t, team);
  run_part(0, team);
  for (auto& worker : workers) worker.join();
#endif
}

const char* cpu_adam_isa() { return kIsaNames[static_cast<int>(current_isa())]; }

namespace detail {

void set_cpu_adam_isa_for_testing(const char* isa) {
  if (isa == nullptr) {
    forced_isa.store(-1);
    return;
  }
  const Isa parsed = parse_isa(isa);
  TANDEM_CHECK_ARG(isa_supported(parsed), "this CPU cannot run the '{}' CPU Adam path", isa);
  forced_isa.store(static_cast<int>(parsed));
}

bool cpu_adam_isa_supported(const char* isa) { return isa_supported(parse_isa(isa)); }

}  // namespace detail
}  // namespace tandem
