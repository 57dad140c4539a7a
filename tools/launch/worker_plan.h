#pragma once
// What one node's launcher starts: each worker's environment (torchrun's
// contract), and where the workers' logs and error files go.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launch/host_filter.h"
#include "launch/launch_options.h"
#include "launch/worker_group.h"

namespace tandem::cli {

struct Plan {
  NodeLayout layout;
  bool set_visible_devices = false;
  int nodes = 1;  // GROUP_WORLD_SIZE: the nodes of this attempt
  // TANDEM_GRADIENT_ACCUMULATION_STEPS for every worker (--keep-global-batch
  // after a restart at another world size); unset: left as it is.
  std::optional<int64_t> accumulation;
};

// Workers of restart number `attempt`; their logs and error files go under
// `attempt_dir` (<log dir or a temporary directory>/attempt_<attempt>).
std::vector<WorkerSpec> make_workers(const LaunchOptions& opts, const Plan& plan, int master_port,
                                     bool agent_store, int attempt,
                                     const std::string& attempt_dir);

// Where logs and error files go: the log directory, or a temporary one
// that is removed when the launcher exits.
class RunDirectory {
 public:
  explicit RunDirectory(const std::string& log_dir);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  std::string attempt_dir(int attempt) const;
  bool kept() const { return !temporary_; }

 private:
  std::string path_;
  bool temporary_ = false;
};

}  // namespace tandem::cli
