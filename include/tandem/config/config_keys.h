#pragma once
// Every key tandem's config readers accept, with what tandem does with it:
// the single source behind `tandem config keys --json`, docs/config.md's
// key index (checked by the ctest Docs.ConfigKeysMatchTheParsers) and the
// test that walks every key through `tandem config check`.

#include <string>
#include <vector>

namespace tandem {

struct ConfigKeyInfo {
  std::string dialect;      // "deepspeed_json", "accelerate_yaml" or "tandem_yaml"
  std::string key;          // dotted path: "zero_optimization.offload_param.device";
                            // a prefix ends in '*' ("tpu_*")
  std::string disposition;  // "implemented", "warn" or "refuse"
  // warn: what tandem does instead; refuse: why not and the fix. Empty for
  // implemented keys, whose meaning docs/config.md gives.
  std::string note;
  // warn and refuse: values that need no word (the other tool's default,
  // written into every file): "false", "{}", "null", ...
  std::vector<std::string> quiet;
  // For optimizer.params and scheduler.params, the type whose table this
  // is ("AdamW", "WarmupLR"); empty elsewhere.
  std::string type;
};

// Sorted by dialect, key and type. A key valid under several optimizer or
// scheduler types appears once per type.
std::vector<ConfigKeyInfo> config_keys();

}  // namespace tandem
