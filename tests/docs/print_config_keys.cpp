// Prints every key the config readers accept, one per line, sorted:
//
//   FORMAT<TAB>KEY<TAB>DISPOSITION
//
// FORMAT is tandem_yaml, accelerate_yaml or deepspeed_json; KEY is the
// dotted path (zero_optimization.offload_param.device); DISPOSITION is read,
// warned or ignored, the KeyTable list the key is in (an ignored prefix
// prints as `prefix*`). tests/docs/check_config_keys.sh compares this with
// docs/config.md's key index.

#include <cstdio>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "config/key_index.h"

int main() {
  using tandem::config_detail::KeyLevel;
  std::set<std::tuple<std::string, std::string, std::string>> lines;
  for (const KeyLevel& level : tandem::config_detail::key_levels()) {
    const std::string format = tandem::to_string(level.format);
    auto add = [&](const std::vector<std::string>& keys, const char* disposition,
                   const char* suffix) {
      for (const auto& key : keys) {
        std::string path = level.path.empty() ? key : level.path + "." + key;
        lines.emplace(format, path + suffix, disposition);
      }
    };
    add(level.keys->read, "read", "");
    add(level.keys->warned, "warned", "");
    add(level.keys->ignored, "ignored", "");
    add(level.keys->ignored_prefixes, "ignored", "*");
  }
  for (const auto& [format, key, disposition] : lines) {
    std::printf("%s\t%s\t%s\n", format.c_str(), key.c_str(), disposition.c_str());
  }
  return lines.empty() ? 1 : 0;
}
