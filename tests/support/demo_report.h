#pragma once
// The gpt_addition demo's report at a step ({"step": N, "loss": ...}) in a
// job's output, for the end-to-end tests that compare runs by their loss.

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace tandem::testing {

// The last JSON object in `out` with a "loss" and "step" == `step` (lines
// may carry a rank prefix before the brace); null, with a test failure,
// when there is none.
inline nlohmann::json demo_report_at(const std::string& out, int step) {
  std::istringstream lines(out);
  nlohmann::json last;
  for (std::string line; std::getline(lines, line);) {
    const auto brace = line.find('{');
    if (brace == std::string::npos) continue;
    auto parsed = nlohmann::json::parse(line.substr(brace), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.contains("loss") && parsed.value("step", 0) == step) {
      last = parsed;
    }
  }
  EXPECT_FALSE(last.is_null()) << "no report of step " << step << " in:\n" << out;
  return last;
}

}  // namespace tandem::testing
