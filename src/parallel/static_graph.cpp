#include "parallel/static_graph.h"

#include <algorithm>

#include <fmt/format.h>

#include "tandem/core/error.h"

namespace tandem::detail {

void StaticGraph::start_backward() { std::fill(counts_.begin(), counts_.end(), 0); }

StaticGraph::Firing StaticGraph::fire(std::size_t index) {
  const int count = ++counts_[index];
  if (!recorded_) return count == 1 ? Firing::kFirst : Firing::kAgain;
  if (count > expected_[index]) return Firing::kUnexpected;
  return count == expected_[index] ? Firing::kComplete : Firing::kPending;
}

void StaticGraph::record(const std::vector<bool>& used_somewhere) {
  TANDEM_CHECK(used_somewhere.size() == counts_.size(),
               "StaticGraph::record: {} flags for {} parameters", used_somewhere.size(),
               counts_.size());
  expected_ = counts_;
  used_somewhere_ = used_somewhere;
  recorded_ = true;
}

std::vector<std::string> StaticGraph::changes(const std::vector<std::string>& names) const {
  std::vector<std::string> out;
  if (!recorded_) return out;
  for (std::size_t i = 0; i < counts_.size(); ++i) {
    if (counts_[i] == expected_[i]) continue;
    out.push_back(fmt::format("{} ({} gradient(s), {} in the first backward)", names[i],
                              counts_[i], expected_[i]));
  }
  return out;
}

}  // namespace tandem::detail
