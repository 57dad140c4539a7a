#pragma once
// DDPOptions::static_graph's record: in the first synchronised backward, how
// many times each parameter's gradient hook fires (a reentrant backward,
// such as a block checkpointed twice, fires it once per pass) and which
// parameters no rank uses; in every later backward, the check that the
// graph is still the same. The reducer counts a parameter ready when its
// count reaches the first backward's, and marks those this rank did not use
// ready (as zeros) as soon as the backward starts.
//
// Not thread-safe: the reducer calls it under its own lock.

#include <cstddef>
#include <string>
#include <vector>

namespace tandem::detail {

class StaticGraph {
 public:
  explicit StaticGraph(std::size_t params) : counts_(params, 0) {}

  // True once record() ran: the first synchronised backward is over.
  bool recorded() const { return recorded_; }
  // Starts counting a backward's firings.
  void start_backward();

  enum class Firing {
    kFirst,       // not recorded yet: the parameter's first firing this backward
    kAgain,       // not recorded yet: a later one
    kPending,     // recorded: more firings are due this backward
    kComplete,    // recorded: the last firing due; its gradient is complete
    kUnexpected,  // recorded: more firings than in the first backward
  };
  Firing fire(std::size_t index);

  // Ends the first backward: `used_somewhere[i]` says whether any rank's
  // gradient hook for parameter i fired (an all-reduce of fired()).
  void record(const std::vector<bool>& used_somewhere);
  bool fired(std::size_t index) const { return counts_[index] > 0; }
  // Recorded: parameter i's hook never fires on this rank; its gradient is
  // zeros here.
  bool unused_here(std::size_t index) const { return expected_[index] == 0; }
  // Recorded: no rank uses parameter i; its .grad is left alone.
  bool unused_everywhere(std::size_t index) const { return !used_somewhere_[index]; }
  // After a recorded backward: the parameters whose hooks fired another
  // number of times than in the first backward, described with their names
  // ("fc.weight (2 gradients, 1 in the first backward)"); empty when the
  // graph was the same.
  std::vector<std::string> changes(const std::vector<std::string>& names) const;

 private:
  bool recorded_ = false;
  std::vector<int> counts_;    // this backward
  std::vector<int> expected_;  // the first backward's
  std::vector<bool> used_somewhere_;
};

}  // namespace tandem::detail
