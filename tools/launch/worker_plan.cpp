// Each worker's environment: torchrun's contract (RANK, LOCAL_RANK, ...),
// tandem's own (TANDEM_RESTART_COUNT, TANDEM_ERROR_FILE), and the
// launcher's settings the workers read again (config file, precision).

#include "launch/worker_plan.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "launch/cpu_affinity.h"
#include "launch/failure_report.h"
#include "tandem/core/error.h"

extern char** environ;

namespace tandem::cli {
namespace {

void make_log_dirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      partial = path.substr(0, i);
      if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        TANDEM_THROW(UsageError, "cannot create log directory {}: {}", partial,
                     std::strerror(errno));
      }
    }
  }
}

}  // namespace

std::vector<WorkerSpec> make_workers(const LaunchOptions& opts, const Plan& plan, int master_port,
                                     bool agent_store, int attempt,
                                     const std::string& attempt_dir) {
  std::map<std::string, std::string> base;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) base[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  const int local_world = static_cast<int>(plan.layout.slots.size());
  if (local_world > 1 && !base.count("OMP_NUM_THREADS") && !opts.bind_cores_to_rank) {
    // torchrun's rule: N processes each with all cores' threads oversubscribe.
    if (attempt == 0) std::fprintf(stderr,
                 "tandem launch: setting OMP_NUM_THREADS=1 for each of the %d workers; set it "
                 "yourself to tune\n",
                 local_world);
    base["OMP_NUM_THREADS"] = "1";
  }
  std::string visible;
  for (int slot : plan.layout.slots) visible += (visible.empty() ? "" : ",") + std::to_string(slot);

  if (!opts.bind_core_list.empty()) {
    check_bind_core_list(opts.bind_core_list, allowed_cpus(), local_world);
  }
  const std::vector<int> launcher_cpus =
      !opts.bind_core_list.empty() ? opts.bind_core_list
      : opts.cpu_affinity          ? allowed_cpus()
                                   : std::vector<int>{};
  std::vector<WorkerSpec> workers;
  for (int local = 0; local < local_world; ++local) {
    auto env = base;
    const int rank = plan.layout.rank_offset + local;
    env["RANK"] = std::to_string(rank);
    env["LOCAL_RANK"] = std::to_string(local);
    env["WORLD_SIZE"] = std::to_string(plan.layout.world_size);
    env["LOCAL_WORLD_SIZE"] = std::to_string(local_world);
    env["GROUP_RANK"] = std::to_string(plan.layout.node_rank);
    env["GROUP_WORLD_SIZE"] = std::to_string(plan.nodes);
    env["ROLE_RANK"] = std::to_string(rank);
    env["ROLE_WORLD_SIZE"] = std::to_string(plan.layout.world_size);
    env["ROLE_NAME"] = "default";
    env["MASTER_ADDR"] = opts.master_addr;
    env["MASTER_PORT"] = std::to_string(master_port);
    env["TORCHELASTIC_USE_AGENT_STORE"] = agent_store ? "True" : "False";
    env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt);
    env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(opts.max_restarts);
    env["TORCHELASTIC_RUN_ID"] = opts.rdzv_id;  // torchrun's: --rdzv-id, "none" by default
    env["TANDEM_RESTART_COUNT"] = std::to_string(attempt);
    const std::string rank_dir = fmt::format("{}/rank_{}", attempt_dir, rank);
    make_log_dirs(rank_dir);
    env["TANDEM_ERROR_FILE"] = error_file_path(attempt_dir, rank);
    env["TORCHELASTIC_ERROR_FILE"] = env["TANDEM_ERROR_FILE"];
    if (plan.set_visible_devices) {
      env["CUDA_VISIBLE_DEVICES"] = visible;
    } else if (!opts.visible_devices.empty()) {
      env["CUDA_VISIBLE_DEVICES"] = opts.visible_devices;
    }
    // Workers read the same file and precision through ConfigEnv.
    if (!opts.config_file.empty()) env["TANDEM_CONFIG_FILE"] = opts.config_file;
    if (plan.accumulation) {
      env["TANDEM_GRADIENT_ACCUMULATION_STEPS"] = std::to_string(*plan.accumulation);
    }
    if (opts.mixed_precision) env["TANDEM_MIXED_PRECISION"] = to_string(*opts.mixed_precision);
    // A Python script on HF Accelerate sees what accelerate launch sets.
    for (const auto& [name, value] : opts.accelerate_env) env[name] = value;
    // accelerate launch's training flags, read back through ConfigEnv.
    if (opts.zero_stage) env["TANDEM_ZERO_STAGE"] = std::to_string(*opts.zero_stage);
    if (!opts.offload_optimizer_device.empty()) {
      env["TANDEM_OFFLOAD_OPTIMIZER_DEVICE"] = opts.offload_optimizer_device;
    }
    if (!opts.offload_param_device.empty()) {
      env["TANDEM_OFFLOAD_PARAM_DEVICE"] = opts.offload_param_device;
    }
    if (opts.gradient_accumulation_steps && !plan.accumulation) {
      env["TANDEM_GRADIENT_ACCUMULATION_STEPS"] = std::to_string(*opts.gradient_accumulation_steps);
    }
    if (opts.gradient_clipping) {
      env["TANDEM_GRADIENT_CLIPPING"] = fmt::format("{}", *opts.gradient_clipping);
    }
    // Accelerate's debug: the fingerprint of every collective is checked.
    if (opts.debug_detail && !base.count("TANDEM_DEBUG")) env["TANDEM_DEBUG"] = "DETAIL";

    WorkerSpec spec;
    spec.global_rank = rank;
    spec.local_rank = local;
    if (opts.cpu_affinity) spec.cpus = cpu_share(launcher_cpus, local, local_world);
    // deepspeed's --bind_cores_to_rank: one OpenMP thread per pinned CPU.
    if (opts.bind_cores_to_rank) env["OMP_NUM_THREADS"] = std::to_string(spec.cpus.size());
    for (const auto& [k, v] : env) spec.env.push_back(k + "=" + v);
    if (!opts.log_dir.empty()) {
      const bool out_file = (opts.tee | opts.redirects) & 1;
      const bool err_file = (opts.tee | opts.redirects) & 2;
      if (out_file) spec.stdout_sink.file_path = rank_dir + "/stdout.log";
      if (err_file) spec.stderr_sink.file_path = rank_dir + "/stderr.log";
      spec.stdout_sink.to_console = !(opts.redirects & 1);
      spec.stderr_sink.to_console = !(opts.redirects & 2);
    }
    // --local-ranks-filter: the others write their files only, as torchrun's.
    if (!opts.local_ranks_filter.empty() &&
        std::find(opts.local_ranks_filter.begin(), opts.local_ranks_filter.end(), local) ==
            opts.local_ranks_filter.end()) {
      spec.stdout_sink.to_console = false;
      spec.stderr_sink.to_console = false;
    }
    workers.push_back(std::move(spec));
  }
  return workers;
}

RunDirectory::RunDirectory(const std::string& log_dir) : path_(log_dir) {
  if (!path_.empty()) return;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tandem-launch-XXXXXX";
  TANDEM_CHECK(::mkdtemp(pattern.data()) != nullptr,
               "cannot create a directory for the workers' error files ({}): {}; set TMPDIR "
               "to a writable directory or pass --log-dir",
               pattern, std::strerror(errno));
  path_ = pattern;
  temporary_ = true;
}

RunDirectory::~RunDirectory() {
  if (!temporary_) return;
  ::nftw(path_.c_str(),
         [](const char* path, const struct stat*, int, FTW*) { return ::remove(path); }, 16,
         FTW_DEPTH | FTW_PHYS);
}

std::string RunDirectory::attempt_dir(int attempt) const {
  return fmt::format("{}/attempt_{}", path_, attempt);
}

}  // namespace tandem::cli
