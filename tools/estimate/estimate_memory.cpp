#include "estimate/estimate_memory.h"

#include <algorithm>
#include <cctype>

#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

constexpr const char* kParamsExample = "write it like 7.5e9, 7B, 1.3b, 125M, 13k or 1000000";

// Power of ten of a suffix letter, or -1 when `c` is not one.
int suffix_exponent(char c) {
  switch (std::tolower(static_cast<unsigned char>(c))) {
    case 'k': return 3;
    case 'm': return 6;
    case 'b': return 9;
    case 't': return 12;
    default: return -1;
  }
}

[[noreturn]] void throw_unreadable(const std::string& text) {
  TANDEM_THROW(UsageError, "--params: cannot read '{}' as a parameter count; {}", text,
               kParamsExample);
}

// How many bytes per parameter a state takes, and whether each rank holds
// all of it or a 1/N shard.
struct Part {
  int bytes = 0;
  bool sharded = false;
};

struct Layout {
  Part params, gradients, optimizer_states;
};

constexpr Part full(int bytes) { return {bytes, false}; }
constexpr Part shard(int bytes) { return {bytes, true}; }

// What the host keeps when the optimizer is offloaded: the fp32 gradient
// shard the host step reads, and fp32 weights + the two Adam moments it
// updates (in fp32 training too: the host needs its own copy to step on).
constexpr int kHostGradientBytes = 4;
constexpr int kHostOptimizerBytes = 12;

std::string part_formula(const Part& part) {
  if (part.bytes == 0) return "";
  return std::to_string(part.bytes) + (part.sharded ? "P/N" : "P");
}

std::string layout_formula(const Layout& layout) {
  std::string out;
  for (const Part* part : {&layout.params, &layout.gradients, &layout.optimizer_states}) {
    std::string term = part_formula(*part);
    if (term.empty()) continue;
    out += (out.empty() ? "" : " + ") + term;
  }
  return out.empty() ? "0" : out;
}

ModelStateBytes layout_bytes(const Layout& layout, int64_t params, int64_t world_size) {
  // ZeRO pads its flat buffers to a multiple of N, so a shard is ceil(P/N).
  const int64_t shard_elements = (params + world_size - 1) / world_size;
  auto bytes = [&](const Part& part) {
    return part.bytes * (part.sharded ? shard_elements : params);
  };
  return {bytes(layout.params), bytes(layout.gradients), bytes(layout.optimizer_states)};
}

}  // namespace

int64_t parse_param_count(const std::string& text) {
  // Read it as decimal digits and a power of ten, so that "1.3b" is exactly
  // 1300000000 with no binary floating point in between.
  size_t i = 0;
  const size_t n = text.size();
  TANDEM_CHECK_ARG(n > 0, "--params is empty; {}", kParamsExample);
  if (text[0] == '-') {
    TANDEM_THROW(UsageError, "--params must be a positive parameter count, got '{}'; {}", text,
                 kParamsExample);
  }
  std::string digits;
  int64_t scale = 0;
  while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) digits += text[i++];
  if (i < n && text[i] == '.') {
    ++i;
    while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) {
      digits += text[i++];
      --scale;
    }
  }
  if (digits.empty()) throw_unreadable(text);
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool negative = false;
    if (i < n && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
    if (i == n || !std::isdigit(static_cast<unsigned char>(text[i]))) throw_unreadable(text);
    int64_t exponent = 0;
    while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) {
      // Saturate: anything past a million digits is out of range either way.
      exponent = std::min<int64_t>(exponent * 10 + (text[i++] - '0'), 1'000'000);
    }
    scale += negative ? -exponent : exponent;
  } else if (i < n && suffix_exponent(text[i]) >= 0) {
    scale += suffix_exponent(text[i++]);
  }
  if (i != n) throw_unreadable(text);

  // Canonical form: digits without leading or trailing zeros, times 10^scale.
  const size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) {
    TANDEM_THROW(UsageError, "--params must be at least 1, got '{}'; {}", text, kParamsExample);
  }
  digits.erase(0, first);
  while (digits.back() == '0') {
    digits.pop_back();
    ++scale;
  }
  TANDEM_CHECK_ARG(scale >= 0, "--params '{}' is not a whole number of parameters; {}", text,
                   kParamsExample);
  // 10^16 > kMaxParamCount, so a longer number is too large; a shorter one
  // fits in int64 as it is built.
  const bool too_large = static_cast<int64_t>(digits.size()) + scale > 16;
  int64_t value = 0;
  if (!too_large) {
    for (char d : digits) value = value * 10 + (d - '0');
    for (int64_t k = 0; k < scale; ++k) value *= 10;
  }
  TANDEM_CHECK_ARG(!too_large && value <= kMaxParamCount,
                   "--params '{}' is more than 1e15 (1000T) parameters, the most this estimate "
                   "counts; {}",
                   text, kParamsExample);
  return value;
}

std::vector<StrategyEstimate> estimate_model_states(const MemoryEstimateOptions& options) {
  TANDEM_CHECK_ARG(options.params >= 1 && options.params <= kMaxParamCount,
                   "params must be 1..{}, got {}", kMaxParamCount, options.params);
  TANDEM_CHECK_ARG(options.world_size >= 1, "the world size must be at least 1, got {}",
                   options.world_size);
  const bool mixed = options.mixed_precision != MixedPrecision::kNo;
  const int p = mixed ? 2 : 4;   // fp16/bf16 or fp32 parameters
  const int g = mixed ? 2 : 4;   // gradients in the parameters' dtype
  const int o = mixed ? 12 : 8;  // (fp32 master +) two fp32 Adam moments
  const Layout offloaded_optimizer{{}, shard(kHostGradientBytes), shard(kHostOptimizerBytes)};

  struct Row {
    const char* key;
    const char* label;
    Layout device;
    Layout host;
  };
  std::vector<Row> rows = {
      {"ddp", "DDP", {full(p), full(g), full(o)}, {}},
      {"zero1", "ZeRO-1", {full(p), full(g), shard(o)}, {}},
      {"zero2", "ZeRO-2", {full(p), shard(g), shard(o)}, {}},
      {"zero3", "ZeRO-3", {shard(p), shard(g), shard(o)}, {}},
  };
  if (options.offload) {
    // Stage 1 does not partition gradients, so the full gradient stays on the
    // device until the step; stages 2 and 3 send each reduced shard to the host.
    rows.push_back({"zero1_offload", "ZeRO-1, offload optimizer", {full(p), full(g), {}},
                    offloaded_optimizer});
    rows.push_back({"zero2_offload", "ZeRO-2, offload optimizer", {full(p), {}, {}},
                    offloaded_optimizer});
    rows.push_back({"zero3_offload", "ZeRO-3, offload optimizer", {shard(p), {}, {}},
                    offloaded_optimizer});
    Layout with_params = offloaded_optimizer;
    with_params.params = shard(p);
    rows.push_back({"zero3_offload_param", "ZeRO-3, offload optimizer+param", {}, with_params});
  }

  std::vector<StrategyEstimate> out;
  for (const Row& row : rows) {
    out.push_back({row.key, row.label, layout_bytes(row.device, options.params, options.world_size),
                   layout_bytes(row.host, options.params, options.world_size),
                   layout_formula(row.device), layout_formula(row.host)});
  }
  return out;
}

}  // namespace tandem::cli
