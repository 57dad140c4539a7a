#pragma once
// Agreeing on an outcome that may differ between ranks (one rank's file
// missing or damaged, one rank's user callback throwing), so that no rank
// goes on, into a collective or into training, while another has failed.
// Internal to the library.

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tandem/comm/process_group.h"

namespace tandem::detail {

// Runs `body`, then learns every rank's outcome (one all_gather_strings).
// Rethrows this rank's own exception when its body threw; otherwise returns
// every rank's error text, "" for each rank whose body succeeded. `body`
// must not run a collective that a rank failing before it would skip.
// Collective.
inline std::vector<std::string> run_agreed(ProcessGroup& group,
                                           const std::function<void()>& body) {
  std::exception_ptr own;
  std::string mine;
  try {
    body();
  } catch (const std::exception& e) {
    own = std::current_exception();
    mine = *e.what() != '\0' ? e.what() : "an exception without a message";
  } catch (...) {
    own = std::current_exception();
    mine = "an exception that is not a std::exception";
  }
  std::vector<std::string> errors = group.all_gather_strings(mine);
  if (own) std::rethrow_exception(own);
  return errors;
}

// "\n  rank R: text" for every rank whose text is not empty; "" when none.
inline std::string rank_failures(const std::vector<std::string>& errors) {
  std::string out;
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) out += fmt::format("\n  rank {}: {}", r, errors[r]);
  }
  return out;
}

}  // namespace tandem::detail
