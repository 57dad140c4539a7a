#pragma once
// Small text helpers shared by the layers (private to libtandem).

#include <map>
#include <set>
#include <string>
#include <vector>

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

// 32 bytes from getrandom(2) as 64 hex digits: a store token
// (random_store_token, TANDEM_STORE_TOKEN_FILE). Defined in rank_env.cpp.
std::string random_token_hex();

// "0, 1, 2": ranks for an error message, the first 16 and then
// ", ... (N in all)", so that a message stays readable at 1000 ranks.
inline std::string rank_list(const std::vector<int>& ranks) {
  constexpr std::size_t kMaxNamed = 16;
  std::string text;
  for (std::size_t i = 0; i < ranks.size() && i < kMaxNamed; ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  if (ranks.size() > kMaxNamed) text += ", ... (" + std::to_string(ranks.size()) + " in all)";
  return text;
}

}  // namespace tandem::detail
