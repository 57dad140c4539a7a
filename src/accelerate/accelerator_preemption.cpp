// Preemption's stop: every rank reached the same step boundary and learned
// that some rank got the signal (Preemption::poll). Save there (the atomic
// commit: a half-written checkpoint never becomes `latest`), wait for every
// rank, requeue the Slurm job from the main process, and exit.

#include <cstdio>
#include <cstdlib>

#include "accelerate/accelerator_impl.h"
#include "tandem/core/logging.h"

namespace tandem {

void Accelerator::preemption_point() {
  if (impl_->preemption) impl_->prepared.controller()->at_step_boundary();
}

void Accelerator::Impl::preemption_boundary() {
  const int signal = preemption->poll();
  if (signal == 0) return;
  const PreemptionConfig& settings = preemption->config();
  const int64_t step = prepared.controller()->state().optimizer_steps;
  if (main_process()) {
    log_warn("preemption: {} reached the job; every rank stops after optimizer step {}{}",
             detail::Preemption::signal_name(signal), step,
             settings.save ? ", saving in " + settings.checkpoint_dir : " (save is off)");
  }
  if (settings.save) checkpointer->save_state(settings.checkpoint_dir, SaveStateOptions{});
  trackers->close();
  group->barrier();  // every rank's part of the checkpoint is committed
  if (main_process()) {
    // Said before the requeue: Slurm ends the job's processes, and the
    // step's output forwarding with them, as soon as `scontrol requeue`
    // succeeds, and a line written after it can be lost.
    std::string not_requeued;
    const std::string job = preemption->job_to_requeue(&not_requeued);
    log_warn("preemption: stopped at step {}{}; {}exiting with code {}", step,
             settings.save ? " with a checkpoint in " + settings.checkpoint_dir : "",
             job.empty() ? "" : "requeuing Slurm job " + job + ", ", kPreemptedExitCode);
    if (!not_requeued.empty()) log_warn("preemption: {}", not_requeued);
    std::fflush(nullptr);
    const std::string failed = preemption->requeue(job);
    if (!failed.empty()) log_warn("preemption: {}", failed);
  }
  std::fflush(nullptr);
  // No destructors: other threads (the store, the transports) may be
  // mid-call, and the job is over for this process.
  std::_Exit(kPreemptedExitCode);
}

}  // namespace tandem
