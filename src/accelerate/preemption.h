#pragma once
// Preemption: save and stop on a signal (the config's preemption block,
// docs/slurm.md). Owned by the Accelerator while the block is enabled.
//
//   signals   handlers for the block's signals only note which arrived (a
//             flag, async-signal-safe); nothing else happens in the handler
//   poll()    at a step boundary (a prepared loader about to hand out a
//             batch with no gradients pending, or Accelerator::
//             preemption_point()), every rank contributes what it saw to one
//             all-reduce: all ranks learn the same answer at the same step
//   stop()    the Accelerator saves there, then the main process requeues
//             the Slurm job where asked, and every process exits with
//             kPreemptedExitCode
//
// Handlers are process-wide: one Preemption at a time per process (ranks
// run as threads share it); the destructor puts the previous ones back.

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/process_group.h"
#include "tandem/config/config.h"

namespace tandem::detail {

class Preemption {
 public:
  // Installs the handlers; UsageError for a block that cannot work
  // (save without checkpoint_dir, requeue "true" outside a Slurm job).
  Preemption(const PreemptionConfig& config, std::shared_ptr<ProcessGroup> group);
  ~Preemption();
  Preemption(const Preemption&) = delete;
  Preemption& operator=(const Preemption&) = delete;

  const PreemptionConfig& config() const { return config_; }

  // Collective: the signal some rank received since the handlers went in
  // (the lowest number when several did), or 0 when none did. Every rank
  // must call it at the same step boundaries.
  int poll();

  // The Slurm job to requeue: SLURM_JOB_ID when the block asks for a
  // requeue (auto or true) inside a job that sbatch submitted; "" otherwise.
  // Slurm requeues batch jobs only: for a job srun or salloc started
  // (`scontrol show job` says BatchFlag=0) it is "", and `*why_not`, when
  // given, says so and what to do instead. Runs `scontrol show job`: for the
  // main process, once, at the stop.
  std::string job_to_requeue(std::string* why_not = nullptr) const;

  // The main process's `scontrol requeue JOB`: "" when it succeeded, else
  // what went wrong and the fix. A successful requeue has Slurm end the
  // job's processes at once, so whatever is to be said must be said before
  // calling it.
  std::string requeue(const std::string& job);

  // The SIG name of `signal` ("SIGUSR1").
  static std::string signal_name(int signal);

 private:
  PreemptionConfig config_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<std::pair<int, struct sigaction>> previous_;
};

// The signal a preemption block's name stands for ("USR1" -> SIGUSR1).
int signal_number(const std::string& name);

}  // namespace tandem::detail
