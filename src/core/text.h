#pragma once
// Small text helpers shared by the layers (private to libtandem).

#include <map>
#include <set>
#include <string>

namespace tandem::detail {

// "'a', 'b'" (sorted, as the set holds them), or "none": the keys a state
// dict lacks or has too many, for error messages.
inline std::string quoted_keys(const std::set<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) {
    if (!out.empty()) out += ", ";
    out += "'" + key + "'";
  }
  return out.empty() ? "none" : out;
}

// The value of environment variable `name` in `vars`; nullptr when it is
// unset or empty (an empty variable counts as unset, as torchrun's do).
inline const std::string* find_variable(const std::map<std::string, std::string>& vars,
                                        const char* name) {
  auto it = vars.find(name);
  if (it == vars.end() || it->second.empty()) return nullptr;
  return &it->second;
}

}  // namespace tandem::detail
