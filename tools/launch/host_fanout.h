#pragma once
// `tandem launch --hostfile FILE`: one command starts a job on every host of
// a DeepSpeed hostfile, as the `deepspeed` launcher does with ssh.
//
// This launcher (the head) runs no worker itself. For each selected host
// (hostfile.h) it starts `ssh HOST 'cd CWD && exec TANDEM launch
// --env-from-stdin --nnodes N --node-rank I --include FILTER ... PROGRAM'`:
// the same tandem binary, working directory and program path on every host
// (a shared file system, or the same install). Through ssh's stdin, never a
// command line, it sends the job's environment: TANDEM_STORE_TOKEN (made
// here when unset), the variables it forwards (TANDEM_*, NCCL_*, GLOO_*,
// TORCH_*, OMP_*, MKL_*, PYTHONPATH, LD_LIBRARY_PATH; not PATH, not
// CUDA_VISIBLE_DEVICES), the lines of DeepSpeed's `.deepspeed_env` and
// tandem's `.tandem_env` (home, then the working directory, later files
// winning), and TANDEM_HOST_NAME, the hostfile's name for that host. Then
// stdin stays open: when it closes (the head exits, is killed, even with
// SIGKILL: each ssh dies with it), every host's launcher stops its workers.
//
// Output comes back labelled "[host:rankN]: ". The first host whose
// launcher fails (or whose ssh connection drops: ServerAliveInterval 5 s)
// stops all the others, unless its workers failed with communication errors
// only: then the head waits up to 3 s for a host that failed otherwise, and
// names that one; Ctrl-C does the same. Then, within --max-restarts
// (counted for the whole job), the head starts the job again on the hosts
// that answer `ssh HOST true` at that moment (a lost host is left out, one
// that answers again rejoins), with TANDEM_RESTART_COUNT the restart number
// on every host, provided at least MIN of `--nnodes MIN:MAX` (else all)
// answer; an elastic job (--nnodes MIN:MAX) starts that way too. While an
// elastic job runs without some of its hosts, the head probes them every
// --monitor-interval seconds (ssh_probe.h) and, when one answers, stops the
// job and starts it again the same way: a membership change, which
// --max-restarts does not count. Exit status: the failed host's, else 0.

#include "launch/launch_options.h"

namespace tandem::cli {

// The exit status of a host's launcher (--env-from-stdin) whose workers
// failed with communication errors only, the usual consequence of a failure
// on another host: the head then gives the other hosts a moment (3 s) to
// report the cause before it names this one. The head reports it as 1.
inline constexpr int kHostCommErrorExitCode = 3;

// Runs the --hostfile job of `opts`; returns the launcher's exit status.
// Throws UsageError for a bad hostfile or filter before starting anything.
int run_hostfile_launch(const LaunchOptions& opts);

// A host's side (`tandem launch --env-from-stdin`): reads the KEY=VALUE lines
// the head sends, up to an empty line or the end, and exports them. Throws
// UsageError for a line without '='.
void read_environment_from_stdin();

}  // namespace tandem::cli
