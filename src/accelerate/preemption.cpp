#include "accelerate/preemption.h"

#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "tandem/core/error.h"
#include "tandem/core/slurm.h"

extern char** environ;

namespace tandem::detail {
namespace {

// The first preemption signal this process received (0: none).
std::atomic<int> g_received{0};
std::atomic<bool> g_installed{false};

void on_signal(int sig) {
  int none = 0;
  g_received.compare_exchange_strong(none, sig);
}

}  // namespace

int signal_number(const std::string& name) {
  if (name == "USR1") return SIGUSR1;
  if (name == "USR2") return SIGUSR2;
  if (name == "TERM") return SIGTERM;
  if (name == "INT") return SIGINT;
  if (name == "HUP") return SIGHUP;
  TANDEM_THROW(UsageError, "preemption: '{}' is not a signal it can handle; use USR1, USR2, TERM, "
               "INT or HUP", name);
}

std::string Preemption::signal_name(int signal) {
  switch (signal) {
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
  }
  return fmt::format("signal {}", signal);
}

Preemption::Preemption(const PreemptionConfig& config, std::shared_ptr<ProcessGroup> group)
    : config_(config), group_(std::move(group)) {
  TANDEM_CHECK_ARG(!config_.save || !config_.checkpoint_dir.empty(),
                   "preemption: save is on but no checkpoint_dir is given; set "
                   "preemption.checkpoint_dir (or AcceleratorOptions::preemption->"
                   "checkpoint_dir) to the folder to save in, e.g. the one the program resumes "
                   "from");
  TANDEM_CHECK_ARG(config_.requeue != "true" || std::getenv("SLURM_JOB_ID") != nullptr,
                   "preemption: requeue is true, but this process runs outside a Slurm job (no "
                   "SLURM_JOB_ID): there is nothing to requeue. Use requeue: auto or false");
  TANDEM_CHECK_ARG(config_.requeue == "auto" || config_.requeue == "true" ||
                       config_.requeue == "false",
                   "preemption: requeue '{}' is not auto, true or false", config_.requeue);
  // Ranks as threads share the process: the first one installs.
  if (g_installed.exchange(true)) return;
  g_received = 0;
  for (const std::string& name : config_.signals) {
    const int sig = signal_number(name);
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    struct sigaction old {};
    ::sigaction(sig, &action, &old);
    previous_.emplace_back(sig, old);
  }
}

Preemption::~Preemption() {
  if (previous_.empty()) return;
  for (const auto& [sig, old] : previous_) ::sigaction(sig, &old, nullptr);
  g_installed = false;
}

int Preemption::poll() {
  const int seen = g_received.load();
  if (group_->world_size() == 1) return seen;
  // Signals are small positive numbers: the max of (64 - sig) picks the
  // lowest signal any rank saw, 0 when none did.
  at::Tensor flag = at::full({1}, seen == 0 ? 0 : 64 - seen, at::kInt);
  group_->all_reduce(flag, ReduceOp::kMax);
  const int agreed = flag.item<int>();
  return agreed == 0 ? 0 : 64 - agreed;
}

std::string Preemption::job_to_requeue(std::string* why_not) const {
  const char* job = std::getenv("SLURM_JOB_ID");
  if (config_.requeue == "false" || job == nullptr) return "";
  const std::string id = job;
  if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) return id;
  // Slurm refuses to requeue a job srun or salloc started ("Only batch jobs
  // are accepted"), and nobody can requeue it by hand either.
  std::string shown;
  if (FILE* pipe = ::popen(("scontrol show job -o " + id + " 2>/dev/null").c_str(), "r")) {
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) {
      shown.append(buffer, n);
    }
    ::pclose(pipe);
  }
  // Unknown (scontrol failed): try the requeue, which reports its failure.
  const std::optional<bool> batch = slurm_batch_flag(shown);
  if (!batch.has_value() || *batch) return id;
  if (why_not != nullptr) {
    *why_not = fmt::format(
        "Slurm job {} was started by srun or salloc, not sbatch, and Slurm requeues batch jobs "
        "only: start it again to resume{}, or submit it with `sbatch --requeue` to have it "
        "requeued",
        id, config_.save ? " from " + config_.checkpoint_dir : "");
  }
  return "";
}

std::string Preemption::requeue(const std::string& job) {
  if (job.empty()) return "";
  std::vector<std::string> args = {"scontrol", "requeue", job};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawnp(&pid, "scontrol", nullptr, nullptr, argv.data(), environ) != 0) {
    return fmt::format("could not run `scontrol requeue {}` ({}): requeue the job yourself", job,
                       std::strerror(errno));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return fmt::format("`scontrol requeue {}` failed (exit {}): requeue the job yourself", job,
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

}  // namespace tandem::detail
