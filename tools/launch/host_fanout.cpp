// `tandem launch --hostfile`: every host's launcher started over ssh
// (host_fanout.h).

#include "launch/host_fanout.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

// store_server.h declares connect_store() over c10d::Store.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "launch/hostfile.h"
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

// The job's environment for the hosts, as the text their launcher reads
// from stdin (one KEY=VALUE per line, an empty line last).
std::string job_environment(const std::string& token, const std::string& host) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = entry.substr(0, eq);
    if (forwarded(name)) env[name] = entry.substr(eq + 1);
  }
  read_env_files(env);
  env["TANDEM_STORE_TOKEN"] = token;
  env["TANDEM_HOST_NAME"] = host;
  std::string text;
  for (const auto& [name, value] : env) {
    if (value.find('\n') != std::string::npos) {
      std::fprintf(stderr, "tandem launch: not forwarding %s: its value spans lines\n",
                   name.c_str());
      continue;
    }
    text += name + "=" + value + "\n";
  }
  return text + "\n";
}

// The command each host's shell runs: its launcher, for node `node`.
std::string remote_command(const LaunchOptions& opts, const std::vector<SelectedHost>& hosts,
                           size_t node, const std::string& master, const std::string& self,
                           const std::string& cwd) {
  std::vector<std::string> args = {
      self, "launch", "--env-from-stdin", "--nnodes", std::to_string(hosts.size()),
      "--node-rank", std::to_string(node), "--nproc-per-node", std::to_string(hosts[node].pool),
      "--include", include_filter(hosts), "--master-addr", master, "--master-port",
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
  args.emplace_back("--");
  args.insert(args.end(), opts.program.begin(), opts.program.end());
  std::string command = "cd " + quote(cwd) + " && exec";
  for (const auto& arg : args) command += " " + quote(arg);
  return command;
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

}  // namespace

int run_hostfile_launch(const LaunchOptions& opts) {
  const std::vector<SelectedHost> hosts = select_hostfile_slots(
      read_hostfile(opts.hostfile), opts.include, opts.exclude,
      opts.nnodes_given ? std::optional<int>(opts.nnodes) : std::nullopt,
      opts.nproc_given ? std::optional<int>(opts.nproc_per_node) : std::nullopt, opts.hostfile);
  const std::string master = opts.master_addr_given ? opts.master_addr : hosts.front().name;
  const char* env_token = std::getenv("TANDEM_STORE_TOKEN");
  const std::string token =
      env_token != nullptr && *env_token ? env_token : random_store_token();
  char self_path[4096] = {0};
  const ssize_t length = ::readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
  TANDEM_CHECK(length > 0, "cannot read /proc/self/exe");
  char cwd_path[4096] = {0};
  TANDEM_CHECK(::getcwd(cwd_path, sizeof(cwd_path)) != nullptr,
               "tandem launch --hostfile: cannot read the working directory");
  const std::string cwd = cwd_path;

  int world = 0;
  for (const auto& host : hosts) world += static_cast<int>(host.slots.size());
  std::fprintf(stderr, "tandem launch: %zu host(s) from %s, %d process(es), store on %s:%d\n",
               hosts.size(), opts.hostfile.c_str(), world, master.c_str(), opts.master_port);

  std::vector<WorkerSpec> specs;
  for (size_t i = 0; i < hosts.size(); ++i) {
    WorkerSpec spec;
    spec.global_rank = static_cast<int>(i);  // the node: names the host in reports
    for (char** e = environ; *e != nullptr; ++e) spec.env.emplace_back(*e);  // ssh's own
    spec.argv = {"ssh"};
    for (auto& word : split_words(opts.launcher_args)) spec.argv.push_back(word);
    if (opts.ssh_port > 0) spec.argv.insert(spec.argv.end(), {"-p", std::to_string(opts.ssh_port)});
    // No password prompts; a host that stops answering is noticed in 15 s.
    spec.argv.insert(spec.argv.end(), {"-o", "BatchMode=yes", "-o", "ServerAliveInterval=5",
                                       "-o", "ServerAliveCountMax=3", hosts[i].name,
                                       remote_command(opts, hosts, i, master,
                                                      std::string(self_path, length), cwd)});
    spec.stdin_text = job_environment(token, hosts[i].name);
    spec.host = hosts[i].name;
    specs.push_back(std::move(spec));
  }
  WorkerGroup group({}, std::move(specs), opts.grace_period_s, opts.prefix_output);
  const GroupResult result = group.run();
  if (result.success) return 0;
  if (result.has_first_failure) {
    const WorkerExit& failed = result.first_failure;
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
    std::fprintf(stderr, "tandem launch: %s failed with exit code %d%s; stopped the other hosts\n",
                 who.c_str(), failed.exit_code,
                 failed.exit_code == 255 ? " (ssh could not reach the host, or lost it)" : "");
    return failed.exit_code;
  }
  std::fprintf(stderr, "tandem launch: stopped by signal %d; every host's workers stopped\n",
               result.launcher_signal);
  return 128 + result.launcher_signal;
}

}  // namespace tandem::cli
