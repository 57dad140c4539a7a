#pragma once
// Whether a --hostfile job's hosts answer ssh (`ssh HOST true`), asked by the
// head (host_fanout.h) at every start and restart (reachable(), which waits)
// and, while an elastic job runs without some of its hosts, in the
// background (RejoinProbe, which never waits).
//
// Every probe's ssh dies with the head, even when the head is SIGKILLed
// (PR_SET_PDEATHSIG), and a RejoinProbe kills those still running when it is
// destroyed: no probe outlives the job.

#include <sys/types.h>

#include <string>
#include <vector>

#include "launch/launch_options.h"

namespace tandem::cli {

// `ssh [--launcher-args] [-p PORT] OPTIONS HOST`: the user's options first,
// since ssh keeps the first value it reads for an option (a ConnectTimeout
// in --launcher-args beats `connect_timeout_s`). Pure.
std::vector<std::string> ssh_argv(const LaunchOptions& opts, const std::string& host,
                                  int connect_timeout_s = 10);

// Whether `host` answers ssh now (`ssh HOST true`, 5 s to connect). Blocks
// until that ssh exits; its error, if any, goes to this process's stderr.
bool reachable(const LaunchOptions& opts, const std::string& host);

// Probes hosts left out of a running job until one answers: each of them
// every `every_s` seconds (the first time `every_s` after construction, as
// the hosts were just probed), one probe per host at a time, with ssh's own
// error messages silenced. Single-threaded: call check() from one thread
// (WorkerGroup::stop_when's check). Owns the probes' processes.
class RejoinProbe {
 public:
  RejoinProbe(const LaunchOptions& opts, std::vector<std::string> hosts, double every_s);
  ~RejoinProbe();  // kills (SIGKILL) and reaps the probes still running

  RejoinProbe(const RejoinProbe&) = delete;
  RejoinProbe& operator=(const RejoinProbe&) = delete;

  // The first host, in the constructor's order, whose finished probe
  // answered; "" while none has. Collects finished probes and starts the
  // ones due; never waits for an ssh.
  std::string check();

 private:
  struct Probe {
    std::string host;
    pid_t pid = 0;  // the ssh in flight; 0 when none
    double last_start_s = 0;
  };

  LaunchOptions opts_;
  std::vector<Probe> probes_;
  double every_s_;
};

}  // namespace tandem::cli
