#include "tandem/config/config_keys.h"

#include <algorithm>
#include <tuple>

#include "config/key_index.h"

namespace tandem {

std::vector<ConfigKeyInfo> config_keys() {
  using config_detail::KeyDisposition;
  std::vector<ConfigKeyInfo> out;
  for (const auto& level : config_detail::key_levels()) {
    auto path = [&](const std::string& key) {
      return level.path.empty() ? key : level.path + "." + key;
    };
    auto add = [&](const std::string& key, KeyDisposition disposition, const std::string& note,
                   const std::vector<std::string>& quiet) {
      out.push_back({to_string(level.format), path(key), config_detail::to_string(disposition),
                     note, quiet, level.type});
    };
    for (const auto& key : level.keys->read) add(key, KeyDisposition::kImplemented, "", {});
    for (const auto& n : level.keys->warned) add(n.key, KeyDisposition::kWarn, n.note, n.quiet);
    for (const auto& n : level.keys->refused) add(n.key, KeyDisposition::kRefuse, n.note, n.quiet);
  }
  std::sort(out.begin(), out.end(), [](const ConfigKeyInfo& a, const ConfigKeyInfo& b) {
    return std::tie(a.dialect, a.key, a.type) < std::tie(b.dialect, b.key, b.type);
  });
  return out;
}

}  // namespace tandem
