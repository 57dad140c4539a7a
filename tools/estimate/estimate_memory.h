#pragma once
// Model-state memory per rank for DDP and ZeRO stages 1-3, with and without
// CPU offload: the arithmetic behind `tandem estimate-memory`. Pure functions,
// no I/O; every function here is thread-safe.
//
// Model states are the parameters, their gradients and the Adam optimizer
// state (ZeRO paper, Rajbhandari et al. 2020, section 3). Bytes per parameter:
//
//                     params  grads  optimizer states
//   mixed (fp16/bf16)    2      2     12 (fp32 master 4 + Adam moments 4 + 4)
//   fp32                 4      4      8 (Adam moments; the params are the master)
//
// A sharded state holds ceil(P/N) elements on each rank, as ZeRO pads its
// flat buffers to a multiple of the world size. Offloading the optimizer
// (ZeRO-Offload) keeps, per rank, on the host: the fp32 gradient shard (4)
// and the optimizer step's state (12: fp32 weights + both moments; in fp32
// training the host also needs its own fp32 copy of the shard to step on).
// Activations, communication buckets and the layers ZeRO-3 gathers while
// computing are working memory, not model states, and are not counted.

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/config/config.h"

namespace tandem::cli {

// The largest parameter count accepted (1000T); keeps every byte count of the
// estimate, per node included, well inside int64.
inline constexpr int64_t kMaxParamCount = 1'000'000'000'000'000;

// Parses a parameter count: an integer ("1000000"), a decimal with an
// exponent ("7.5e9", "1e6") or with a suffix k/M/B/T in either case (thousand,
// million, billion, trillion: "13k", "125M", "350m", "7B", "1.3b"). The value
// is computed exactly and must be a whole number from 1 to kMaxParamCount.
// Throws UsageError naming --params, with an example, for anything else.
int64_t parse_param_count(const std::string& text);

// Bytes of each model state, on one rank.
struct ModelStateBytes {
  int64_t params = 0;
  int64_t gradients = 0;
  int64_t optimizer_states = 0;

  int64_t total() const { return params + gradients + optimizer_states; }
};

// One way to train, and what it keeps on each rank.
struct StrategyEstimate {
  std::string key;    // JSON key: "ddp", "zero2", "zero3_offload_param", ...
  std::string label;  // for people: "DDP", "ZeRO-2 + offload", ...
  ModelStateBytes device;  // on the accelerator, per rank: the model_state_bytes
  ModelStateBytes host;    // in host memory, per rank (0 without offload)
  // The sums above in terms of P (parameters) and N (world size), terms in
  // the order params + gradients + optimizer states: "2P + 2P + 12P/N".
  std::string device_formula;
  std::string host_formula;
};

struct MemoryEstimateOptions {
  int64_t params = 0;  // 1..kMaxParamCount
  int64_t world_size = 1;  // >= 1
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  bool offload = false;  // add the offload variants
};

// DDP, ZeRO-1, ZeRO-2 and ZeRO-3, in that order; with `offload` also
// "zero1_offload", "zero2_offload", "zero3_offload" (offload_optimizer to the
// CPU) and "zero3_offload_param" (offload_optimizer and offload_param).
// Throws UsageError when params or world_size is out of range.
std::vector<StrategyEstimate> estimate_model_states(const MemoryEstimateOptions& options);

}  // namespace tandem::cli
