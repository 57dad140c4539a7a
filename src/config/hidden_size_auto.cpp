// The zero_optimization sizes that Accelerate fills from the model's hidden
// size when a DeepSpeed config gives them as "auto".

#include <limits>

#include "tandem/config/config.h"
#include "tandem/core/error.h"

namespace tandem {

HiddenSizeAutoSizes hidden_size_auto_sizes(int64_t hidden_size) {
  TANDEM_CHECK_ARG(hidden_size >= 1 && hidden_size <= 3'037'000'499,
                   "hidden size {} is out of range: give the model's hidden (embedding) width, "
                   "a positive number whose square fits in 63 bits",
                   hidden_size);
  const double h = static_cast<double>(hidden_size);
  HiddenSizeAutoSizes sizes;
  sizes.reduce_bucket_size = hidden_size * hidden_size;
  // Python's int(0.9 * hidden_size * hidden_size): double products, left to
  // right, truncated toward zero.
  sizes.stage3_prefetch_bucket_size = static_cast<int64_t>(0.9 * h * h);
  sizes.stage3_param_persistence_threshold = 10 * hidden_size;
  return sizes;
}

const std::vector<std::string>& hidden_size_auto_keys() {
  static const std::vector<std::string> keys = {
      "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
      "zero_optimization.stage3_param_persistence_threshold"};
  return keys;
}

std::vector<std::string> fill_hidden_size_auto(Config& config, int64_t hidden_size) {
  const HiddenSizeAutoSizes sizes = hidden_size_auto_sizes(hidden_size);
  const int64_t values[] = {sizes.reduce_bucket_size, sizes.stage3_prefetch_bucket_size,
                            sizes.stage3_param_persistence_threshold};
  int64_t* fields[] = {&config.zero.reduce_bucket_size, &config.zero.stage3_prefetch_bucket_size,
                       &config.zero.stage3_param_persistence_threshold};
  // DeepSpeed's short field names stand for the stage3_ keys.
  const char* aliases[] = {"", "zero_optimization.prefetch_bucket_size",
                           "zero_optimization.param_persistence_threshold"};
  std::vector<std::string> filled;
  for (std::size_t i = 0; i < hidden_size_auto_keys().size(); ++i) {
    for (const std::string& key : {hidden_size_auto_keys()[i], std::string(aliases[i])}) {
      if (key.empty() || !config.auto_keys.count(key)) continue;
      *fields[i] = values[i];
      config.auto_keys.erase(key);
      filled.push_back(key);
    }
  }
  return filled;
}

}  // namespace tandem
