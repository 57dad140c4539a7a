// `tandem launch --hostfile`: every host's launcher started over ssh
// (host_fanout.h).

#include "launch/host_fanout.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>

// store_server.h declares connect_store() over c10d::Store.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "launch/hostfile.h"
#include "launch/ssh_probe.h"
#include "launch/worker_group.h"
#include "tandem/comm/store_server.h"
#include "tandem/core/error.h"

extern char** environ;

namespace tandem::cli {
namespace {

// Single-quoted for the remote shell.
std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

bool forwarded(const std::string& name) {
  static const char* const kPrefixes[] = {"TANDEM_", "NCCL_", "GLOO_", "TORCH_", "OMP_", "MKL_"};
  for (const char* prefix : kPrefixes) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return name == "PYTHONPATH" || name == "LD_LIBRARY_PATH";
}

// KEY=VALUE lines of DeepSpeed's .deepspeed_env and tandem's .tandem_env, in
// the home folder, then the working directory.
void read_env_files(std::map<std::string, std::string>& env) {
  std::vector<std::string> folders;
  if (const char* home = std::getenv("HOME")) folders.emplace_back(home);
  folders.emplace_back(".");
  for (const auto& folder : folders) {
    for (const char* name : {".deepspeed_env", ".tandem_env"}) {
      const std::string path = folder + "/" + name;
      std::ifstream in(path);
      std::string line;
      for (int number = 1; in && std::getline(in, line); ++number) {
        if (line.empty() || line[0] == '#') continue;
        const auto eq = line.find('=');
        TANDEM_CHECK_ARG(eq != std::string::npos && eq > 0,
                         "{} line {}: '{}' is not KEY=VALUE", path, number, line);
        env[line.substr(0, eq)] = line.substr(eq + 1);
      }
    }
  }
}

// The environment every host gets: the variables forwarded from here, then
// the env files' lines. Read once per job; a value spanning lines cannot
// travel as one KEY=VALUE line and is left out, with a warning.
std::map<std::string, std::string> forwarded_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = entry.substr(0, eq);
    if (forwarded(name)) env[name] = entry.substr(eq + 1);
  }
  read_env_files(env);
  for (auto it = env.begin(); it != env.end();) {
    if (it->second.find('\n') == std::string::npos) {
      ++it;
      continue;
    }
    std::fprintf(stderr, "tandem launch: not forwarding %s: its value spans lines\n",
                 it->first.c_str());
    it = env.erase(it);
  }
  return env;
}

// How each host runs PROGRAM and what its workers are told, as given here.
void append_program_flags(const LaunchOptions& opts, std::vector<std::string>& args) {
  auto list = [](const std::vector<int>& numbers) {
    std::string text;
    for (int n : numbers) text += (text.empty() ? "" : ",") + std::to_string(n);
    return text;
  };
  if (opts.no_python) args.emplace_back("--no-python");
  if (opts.c10d_store) args.emplace_back("--c10d-store");
  if (opts.module) args.emplace_back("--module");
  if (opts.run_path) args.emplace_back("--run-path");
  if (!opts.local_ranks_filter.empty()) {
    args.insert(args.end(), {"--local-ranks-filter", list(opts.local_ranks_filter)});
  }
  if (opts.bind_cores_to_rank) args.emplace_back("--bind-cores-to-rank");
  if (!opts.bind_core_list.empty()) {
    args.insert(args.end(), {"--bind-core-list", list(opts.bind_core_list)});
  }
  if (opts.use_deepspeed) args.emplace_back("--use-deepspeed");
  if (opts.multi_gpu) args.emplace_back("--multi-gpu");
  if (opts.zero_stage) args.insert(args.end(), {"--zero-stage", std::to_string(*opts.zero_stage)});
  if (!opts.offload_optimizer_device.empty()) {
    args.insert(args.end(), {"--offload-optimizer-device", opts.offload_optimizer_device});
  }
  if (!opts.offload_param_device.empty()) {
    args.insert(args.end(), {"--offload-param-device", opts.offload_param_device});
  }
  if (opts.gradient_accumulation_steps) {
    args.insert(args.end(), {"--gradient-accumulation-steps",
                             std::to_string(*opts.gradient_accumulation_steps)});
  }
  if (opts.gradient_clipping) {
    args.insert(args.end(), {"--gradient-clipping", fmt::format("{}", *opts.gradient_clipping)});
  }
}

// The command each host's shell runs: its launcher, for node `node`.
std::string remote_command(const LaunchOptions& opts, const std::vector<SelectedHost>& hosts,
                           size_t node, const std::string& master, const std::string& self,
                           const std::string& cwd) {
  std::vector<std::string> args = {
      self, "launch", "--env-from-stdin", "--nnodes", std::to_string(hosts.size()),
      "--node-rank", std::to_string(node), "--nproc-per-node", std::to_string(hosts[node].pool),
      "--include", include_filter(hosts), "--master-addr", master, "--master-port",
      // The job's budget, for the workers' TORCHELASTIC_MAX_RESTARTS: an
      // --env-from-stdin launcher never restarts its workers itself; the
      // head restarts every host.
      std::to_string(opts.master_port), "--max-restarts", std::to_string(opts.max_restarts),
      "--grace-period", std::to_string(opts.grace_period_s)};
  if (opts.mixed_precision) {
    args.insert(args.end(), {"--mixed-precision", to_string(*opts.mixed_precision)});
  }
  if (!opts.config_file.empty()) args.insert(args.end(), {"--config-file", opts.config_file});
  if (!opts.log_dir.empty()) {
    args.insert(args.end(), {"--log-dir", opts.log_dir, "--tee", std::to_string(opts.tee),
                             "--redirects", std::to_string(opts.redirects)});
  }
  if (!opts.prefix_output) args.emplace_back("--no-prefix");
  append_program_flags(opts, args);
  args.emplace_back("--");
  args.insert(args.end(), opts.program.begin(), opts.program.end());
  std::string command = "cd " + quote(cwd) + " && exec";
  for (const auto& arg : args) command += " " + quote(arg);
  return command;
}

struct Job {
  std::string self, cwd;
  std::map<std::string, std::string> env;  // forwarded_environment() and the store token
  std::string master;  // this attempt's first host, unless --master-addr
  std::optional<int64_t> accumulation;  // --keep-global-batch: this attempt's
};

// What host `host`'s launcher reads from stdin for attempt `attempt`: the
// job's environment and the host's own variables, one KEY=VALUE per line,
// an empty line last.
std::string stdin_text(const Job& job, const std::string& host, int attempt) {
  std::map<std::string, std::string> env = job.env;
  env["TANDEM_HOST_NAME"] = host;
  env["TANDEM_RESTART_COUNT"] = std::to_string(attempt);  // the hosts' first attempt number
  if (job.accumulation) {
    env["TANDEM_GRADIENT_ACCUMULATION_STEPS"] = std::to_string(*job.accumulation);
  }
  std::string text;
  for (const auto& [name, value] : env) text += name + "=" + value + "\n";
  return text + "\n";
}

// The ssh command that runs host `node`'s launcher for attempt `attempt`.
WorkerSpec host_spec(const LaunchOptions& opts, const std::vector<SelectedHost>& hosts,
                     size_t node, const Job& job, int attempt) {
  WorkerSpec spec;
  spec.global_rank = static_cast<int>(node);  // the node: names the host in reports
  for (char** e = environ; *e != nullptr; ++e) spec.env.emplace_back(*e);  // ssh's own
  spec.argv = ssh_argv(opts, hosts[node].name);
  spec.argv.push_back(remote_command(opts, hosts, node, job.master, job.self, job.cwd));
  spec.stdin_text = stdin_text(job, hosts[node].name, attempt);
  spec.host = hosts[node].name;
  return spec;
}

// Says which host failed, with its ranks; returns the launcher's exit code.
int report_host_failure(const WorkerExit& failed, const std::vector<SelectedHost>& hosts) {
  const auto node = static_cast<size_t>(failed.global_rank);
  int first_rank = 0;
  for (size_t i = 0; i < node; ++i) first_rank += static_cast<int>(hosts[i].slots.size());
  const int last_rank = first_rank + static_cast<int>(hosts[node].slots.size()) - 1;
  const std::string who = fmt::format("host {} (node {}, ranks {}-{})", hosts[node].name, node,
                                      first_rank, last_rank);
  if (failed.signal != 0) {
    std::fprintf(stderr, "tandem launch: %s: ssh was killed by signal %d\n", who.c_str(),
                 failed.signal);
    return 128 + failed.signal;
  }
  if (failed.exit_code == kHostCommErrorExitCode) {
    std::fprintf(stderr,
                 "tandem launch: %s failed with exit code 1 (its workers lost their peers: "
                 "communication errors only, and no other host reported a cause within 3 s; "
                 "look at the network between the hosts); stopped the other hosts\n",
                 who.c_str());
    return 1;
  }
  std::fprintf(stderr, "tandem launch: %s failed with exit code %d%s; stopped the other hosts\n",
               who.c_str(), failed.exit_code,
               failed.exit_code == 255 ? " (ssh could not reach the host, or lost it)" : "");
  return failed.exit_code;
}

}  // namespace

int run_hostfile_launch(const LaunchOptions& opts) {
  const std::vector<SelectedHost> all = select_hostfile_slots(
      read_hostfile(opts.hostfile), opts.include, opts.exclude,
      opts.nnodes_given ? std::optional<int>(opts.nnodes) : std::nullopt,
      opts.nproc_given ? std::optional<int>(opts.nproc_per_node) : std::nullopt, opts.hostfile);
  const size_t min_hosts = opts.min_nodes > 0 ? static_cast<size_t>(opts.min_nodes) : all.size();
  if (opts.monitor_interval_given && opts.min_nodes == 0) {
    std::fprintf(stderr, "tandem launch: --monitor-interval has no effect without --nnodes "
                 "MIN:MAX: a job that needs every host never runs without one to probe\n");
  }
  Job job;
  job.env = forwarded_environment();
  const char* env_token = std::getenv("TANDEM_STORE_TOKEN");
  job.env["TANDEM_STORE_TOKEN"] =
      env_token != nullptr && *env_token ? env_token : random_store_token();
  char self_path[4096] = {0};
  const ssize_t length = ::readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
  TANDEM_CHECK(length > 0, "cannot read /proc/self/exe");
  job.self.assign(self_path, static_cast<size_t>(length));
  char cwd_path[4096] = {0};
  TANDEM_CHECK(::getcwd(cwd_path, sizeof(cwd_path)) != nullptr,
               "tandem launch --hostfile: cannot read the working directory");
  job.cwd = cwd_path;

  // Every attempt runs on the hosts that answer. --max-restarts counts the
  // restarts that failures cause, for the whole job; a restart that takes a
  // host back (a membership change, as torchrun's agent restarts its
  // workers for a node waiting to join) is not one of them.
  int first_world = 0;
  int failures = 0;
  for (int attempt = 0;; ++attempt) {
    std::vector<SelectedHost> hosts;
    std::vector<std::string> left_out;
    // A fixed job starts on every host (a missing one fails it at once); an
    // elastic one, and every restart, on those that answer.
    const bool probe = attempt > 0 || opts.min_nodes > 0;
    for (const auto& host : all) {
      if (!probe || reachable(opts, host.name)) {
        hosts.push_back(host);
      } else {
        left_out.push_back(host.name);
        std::fprintf(stderr, "tandem launch: host %s does not answer ssh; leaving it out\n",
                     host.name.c_str());
      }
    }
    if (hosts.size() < min_hosts) {
      std::fprintf(stderr,
                   "tandem launch: %zu of %zu hosts answer, fewer than the %zu --nnodes asks "
                   "for; giving up\n",
                   hosts.size(), all.size(), min_hosts);
      return 1;
    }
    job.master = opts.master_addr_given ? opts.master_addr : hosts.front().name;
    int world = 0;
    for (const auto& host : hosts) world += static_cast<int>(host.slots.size());
    if (attempt == 0) first_world = world;
    if (opts.keep_global_batch) {
      // accumulation x world as on the first attempt (the per-rank batch is
      // the program's and stays).
      const int64_t total = opts.base_accumulation * first_world;
      if (total % world != 0) {
        std::fprintf(stderr,
                     "tandem launch: --keep-global-batch: %lld accumulation step(s) x %d "
                     "ranks = %lld micro-batches per step do not split over the %d ranks "
                     "left; stopping\n",
                     static_cast<long long>(opts.base_accumulation), first_world,
                     static_cast<long long>(total), world);
        return 1;
      }
      job.accumulation = total / world;
      if (attempt > 0) {
        std::fprintf(stderr, "tandem launch: --keep-global-batch: gradient accumulation %lld "
                     "on %d ranks (%lld on %d)\n", static_cast<long long>(*job.accumulation),
                     world, static_cast<long long>(opts.base_accumulation), first_world);
      }
    }
    std::fprintf(stderr,
                 "tandem launch: %zu host(s) from %s, %d process(es), store on %s:%d%s\n",
                 hosts.size(), opts.hostfile.c_str(), world, job.master.c_str(),
                 opts.master_port,
                 attempt > 0 ? fmt::format(" (restart {})", attempt).c_str() : "");
    std::vector<WorkerSpec> specs;
    for (size_t i = 0; i < hosts.size(); ++i) specs.push_back(host_spec(opts, hosts, i, job, attempt));
    WorkerGroup group({}, std::move(specs), opts.grace_period_s, opts.prefix_output);
    // A host whose workers only lost their peers names no cause; the host
    // whose worker failed first may take a moment longer to stop its own.
    group.wait_for_cause(
        [](const WorkerExit& exit) {
          return exit.signal == 0 && exit.exit_code == kHostCommErrorExitCode;
        },
        3.0);
    // Without some of its hosts, an elastic job probes them as it runs and,
    // when one answers, stops to start again with it. The check runs in the
    // group's loop, so the probes run in the background (ssh_probe.h).
    std::optional<RejoinProbe> rejoin;
    if (!left_out.empty()) {
      rejoin.emplace(opts, left_out, monitor_interval(opts, 5.0));
      group.stop_when(
          [&rejoin]() -> std::string {
            const std::string host = rejoin->check();
            if (host.empty()) return host;
            std::fprintf(stderr,
                         "tandem launch: host %s answers again; restarting the job to take it "
                         "in (a membership change, not counted against --max-restarts)\n",
                         host.c_str());
            return "host " + host + " answers again";
          },
          std::min(monitor_interval(opts, 5.0), 0.5));
    }
    const GroupResult result = group.run();
    rejoin.reset();  // kills the probes still running
    if (result.success) return 0;
    if (!result.stop_reason.empty() && result.launcher_signal == 0) {
      bool finished = true;
      for (const auto& exit : result.exits) finished = finished && !exit.failed();
      if (!finished) continue;
      // Every host ended on its own before the stop reached it.
      std::fprintf(stderr, "tandem launch: the job finished as it was being stopped; "
                   "not restarting it\n");
      return 0;
    }
    if (!result.has_first_failure) {
      std::fprintf(stderr, "tandem launch: stopped by signal %d; every host's workers stopped\n",
                   result.launcher_signal);
      return 128 + result.launcher_signal;
    }
    const int code = report_host_failure(result.first_failure, hosts);
    if (failures >= opts.max_restarts) {
      if (opts.max_restarts > 0) {
        std::fprintf(stderr,
                     "tandem launch: the restart budget is spent (--max-restarts %d)\n",
                     opts.max_restarts);
      }
      return code;
    }
    ++failures;
    std::fprintf(stderr, "tandem launch: restarting the job after a failure (%d of "
                 "--max-restarts %d)\n", failures, opts.max_restarts);
  }
}

void read_environment_from_stdin() {
  std::string line;
  char c = 0;
  for (;;) {
    const ssize_t got = ::read(STDIN_FILENO, &c, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0 || c == '\n') {
      if (line.empty()) return;
      const auto eq = line.find('=');
      TANDEM_CHECK_ARG(eq != std::string::npos && eq > 0,
                       "--env-from-stdin: '{}' is not KEY=VALUE", line);
      ::setenv(line.substr(0, eq).c_str(), line.substr(eq + 1).c_str(), 1);
      line.clear();
      if (got <= 0) return;
      continue;
    }
    line += c;
  }
}

}  // namespace tandem::cli
