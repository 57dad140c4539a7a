#pragma once
// Spawns and supervises one node's worker processes.
//
// Each worker runs in its own process group, with PR_SET_PDEATHSIG so that
// it dies with the launcher even when the launcher is SIGKILLed. The first
// worker to fail stops all the others (SIGTERM, then SIGKILL after a grace
// period), and the processes a failed worker started in its group with it.
// SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to the launcher are forwarded the same
// way; SIGUSR1/SIGUSR2 are forwarded and nothing more (Slurm's warning
// signals). Whatever is left in the workers' groups when the last worker
// has exited is stopped the same way before run() returns.
// Single-threaded: run() owns the calling thread until every worker is gone.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/output_pump.h"
#include "tandem/config/config.h"

namespace tandem::cli {

struct WorkerSpec {
  int global_rank = 0;
  int local_rank = 0;
  std::vector<std::string> env;  // "KEY=VALUE", the complete environment
  StreamSink stdout_sink;
  StreamSink stderr_sink;
  // A --hostfile job's per-host launchers (host_fanout.h): the command for
  // this process instead of the group's, text for its stdin (a pipe kept
  // open until it exits: its end tells the host's launcher the head is
  // gone), and the host that labels its output.
  std::vector<std::string> argv;
  std::optional<std::string> stdin_text;
  std::string host;
  // CPUs the worker is pinned to (sched_setaffinity before exec); empty:
  // the launcher's own affinity.
  std::vector<int> cpus;
};

struct WorkerExit {
  int global_rank = 0;
  int pid = 0;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // signal that killed it, 0 if it exited
  double seconds = 0; // since start
  double wall_time = 0;  // when the launcher saw it end, seconds since the Unix epoch
  bool stopped = false;   // ended after the launcher began stopping the group
  // Stopped for preemption with its checkpoint saved (kPreemptedExitCode):
  // not a failure, and no reason to stop the others, which stop at the same
  // step.
  bool preempted() const { return signal == 0 && exit_code == kPreemptedExitCode; }
  bool failed() const { return signal != 0 || (exit_code != 0 && !preempted()); }
};

struct GroupResult {
  bool success = true;
  int launcher_signal = 0;           // SIGINT/SIGTERM received by the launcher
  bool has_first_failure = false;
  WorkerExit first_failure;          // the root cause when !success
  std::string stop_reason;           // why stop_when()'s check stopped the group, if it did
  bool preempted = false;            // some worker exited with kPreemptedExitCode
  std::vector<WorkerExit> exits;     // every worker, in exit order
};

class WorkerGroup {
 public:
  WorkerGroup(std::vector<std::string> argv, std::vector<WorkerSpec> workers,
              double grace_period_s, bool prefix_output);

  // Starts every worker and supervises until all have exited.
  GroupResult run();

  // Also stops the group, as a SIGHUP to the launcher would, when `fd` is
  // closed at its other end (`tandem launch --env-from-stdin`: the head of
  // a --hostfile job is gone). Call before run().
  void stop_when_closed(int fd) { watch_fd_ = fd; }

  // Also stops the group (SIGTERM, then SIGKILL after the grace period) when
  // `check`, called about every `every_s` seconds while the workers run,
  // returns a reason: the job's membership changed (a host came back, or
  // another node restarted the job). The result is then not a success and
  // has no failure; its stop_reason is the reason. Call before run().
  void stop_when(std::function<std::string()> check, double every_s) {
    stop_check_ = std::move(check);
    stop_check_every_s_ = every_s;
  }

  // A failure `secondary` says is only a consequence of another's (a
  // --hostfile host whose workers failed with communication errors only)
  // stops the group `wait_s` seconds later, unless a failure that is not
  // one comes first: that one then stops it at once and is the result's
  // first_failure, since it names the cause. Call before run().
  void wait_for_cause(std::function<bool(const WorkerExit&)> secondary, double wait_s) {
    secondary_ = std::move(secondary);
    cause_wait_s_ = wait_s;
  }

 private:
  void spawn(const WorkerSpec& spec);
  void signal_all(int sig);
  void reap(GroupResult& result);
  // Whether a process is left in any worker's process group.
  bool leftovers_alive() const;
  // Once every worker has exited: what is left in their process groups
  // gets SIGTERM, and SIGKILL after the grace period (at most 10 s; at once
  // when the workers were killed), so no process of the job outlives the
  // launcher.
  void end_leftovers(bool at_once);

  std::vector<std::string> argv_;
  std::vector<WorkerSpec> workers_;
  double grace_period_s_;
  OutputPump pump_;
  std::vector<int> pids_;  // by position in workers_; 0 once reaped
  std::vector<int> groups_;  // each worker's process group (its pid), kept after it is reaped
  std::vector<int> stdin_fds_;  // write ends of stdin pipes, by position; -1 if none
  int watch_fd_ = -1;
  std::function<std::string()> stop_check_;
  double stop_check_every_s_ = 1.0;
  std::function<bool(const WorkerExit&)> secondary_;
  double cause_wait_s_ = 0;
  std::optional<WorkerExit> secondary_failure_;  // the first, while waiting for a cause
  double cause_deadline_ = -1;
  bool stopping_ = false;  // SIGTERM/SIGKILL sent to the group
  double start_ = 0;
};

// Installs the launcher's signal handlers (self-pipe). Call once, before run().
// Also replaces an ignored SIGINT (a `cmd &` in a script), so the launcher
// always stops on it.
void install_launcher_signal_handlers();

// While no WorkerGroup runs (a c10d node waiting for the others): drains
// the signals received since the last call and returns the first of
// SIGINT, SIGTERM, SIGHUP or SIGQUIT, 0 when none came. Call after
// install_launcher_signal_handlers(); single-threaded, as run().
int take_stop_signal();

// Whether a stop signal `repeat`, arriving after a first one, has the
// launcher SIGKILL its workers at once ("stop now": a second Ctrl-C).
// Inside a Slurm job a repeated SIGTERM does not: Slurm sends it twice at a
// time limit or scancel (slurmstepd, and srun forwarding its
// own), and its KillWait SIGKILL is the escalation; the workers keep their
// grace period to save. Pure; thread-safe.
bool repeat_stops_now(int repeat, bool in_slurm_job);

// Tells every WorkerGroup of this process that it runs inside a Slurm job
// (SLURM_JOB_ID), for repeat_stops_now(). Call once, before run().
void set_launcher_in_slurm_job(bool in_slurm_job);

}  // namespace tandem::cli
