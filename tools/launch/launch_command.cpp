// `tandem launch`: torchrun's worker contract, DeepSpeed's host filters, and
// a supervisor that never leaves a job half-alive.

#include "launch/launch_command.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/cuda.h>

#include "tandem/comm/c10d_store_host.h"
#include "tandem/comm/store_server.h"
#include "launch/accelerate_env.h"
#include "launch/elastic_node.h"
#include "launch/failure_report.h"
#include "launch/host_fanout.h"
#include "launch/host_filter.h"
#include "launch/launch_options.h"
#include "launch/layout_check.h"
#include "launch/node_names.h"
#include "launch/python_store.h"
#include "launch/slurm_launch.h"
#include "launch/worker_group.h"
#include "launch/worker_plan.h"
#include "tandem/config/config.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/core/rank_env.h"
#include "tandem/core/slurm.h"


namespace tandem::cli {
namespace {

// Node 0 of a launch across several nodes, about to host the store on
// --master-addr: refuses an address that only this machine reaches, which
// would leave every other node waiting for the whole timeout. A loopback
// address written as one (127.0.0.1, ::1, localhost) says that every node
// runs on this machine, and is let through (tests run nodes that way); no
// address at all, or a name that happens to resolve to loopback (Debian's
// `127.0.1.1 HOSTNAME` line in /etc/hosts), is not. A --hostfile job's hosts
// are other machines, so there any loopback address is refused.
void check_store_address(const LaunchOptions& opts) {
  if (opts.nnodes <= 1 || !is_loopback_host(opts.master_addr)) return;
  const bool given = opts.master_addr_given || opts.master_addr_in_config;
  in6_addr scratch{};
  const bool written_as_loopback =
      opts.master_addr == "localhost" ||
      ::inet_pton(AF_INET, opts.master_addr.c_str(), &scratch) == 1 ||
      ::inet_pton(AF_INET6, opts.master_addr.c_str(), &scratch) == 1;
  if (given && written_as_loopback && !opts.env_from_stdin) {
    std::fprintf(stderr,
                 "tandem launch: the rendezvous store listens on %s, a loopback address: every "
                 "node of this job must run on this machine; for nodes on other machines, give "
                 "node 0's network address (--master-addr / main_process_ip)\n",
                 opts.master_addr.c_str());
    return;
  }
  TANDEM_CHECK_ARG(given,
                   "a launch across {} nodes needs node 0's network address for its rendezvous "
                   "store: give --master-addr (accelerate: --main_process_ip, or the config's "
                   "main_process_ip) on every node. Without it the store would listen on "
                   "127.0.0.1, which no other machine reaches (to run every node on this "
                   "machine, say --master-addr 127.0.0.1)",
                   opts.nnodes);
  const std::vector<std::string> addresses = resolved_addresses(opts.master_addr);
  const std::string address = addresses.empty() ? "" : addresses.front();
  TANDEM_THROW(UsageError,
               "the rendezvous store's address {}{} is a loopback address on node 0, which no "
               "other machine reaches: the other {} node(s) would wait for it until they time "
               "out. Give node 0's network address: --master-addr / main_process_ip{}, or fix "
               "/etc/hosts (Debian maps the host name to 127.0.1.1) so that {} names the "
               "address the other nodes reach",
               opts.master_addr,
               address.empty() || address == opts.master_addr
                   ? ""
                   : " (" + address + " on this machine)",
               opts.nnodes - 1, opts.env_from_stdin ? " (or the hostfile's first host)" : "",
               opts.master_addr);
}

// What to do about a store port in use, in the flags of this launch: a
// multi-node job cannot take a free port (every node must know it).
std::string port_in_use_advice(const LaunchOptions& opts) {
  if (opts.env_from_stdin) {
    return "pick another with the head's --master-port (every host of the --hostfile job uses "
           "it)";
  }
  if (opts.nnodes > 1 && opts.rdzv_endpoint_given) {
    return "pick another port in --rdzv-endpoint HOST:PORT, the same on every node";
  }
  if (opts.nnodes > 1) {
    return "pick another with --master-port (main_process_port), the same on every node";
  }
  return "pick another with --master-port (MASTER_PORT), or use --standalone / --master-port 0 "
         "to get a free one";
}

Plan plan_slots(const LaunchOptions& opts) {
  Plan plan;
  int pool = opts.nproc_per_node;
  if (!opts.nproc_given && (!opts.include.empty() || !opts.exclude.empty())) {
    pool = std::max<int>(1, static_cast<int>(torch::cuda::device_count()));
    if (!opts.include.empty()) {
      for (const auto& [host, slots] : parse_host_filter(opts.include, "--include")) {
        for (int s : slots) pool = std::max(pool, s + 1);
      }
    }
  }
  const std::optional<int> node_rank =
      opts.node_rank_given ? std::optional<int>(opts.node_rank) : std::nullopt;
  plan.layout =
      layout_nodes(pool, opts.nnodes, node_rank, opts.include, opts.exclude, node_names());
  plan.set_visible_devices = !opts.include.empty() || !opts.exclude.empty();
  plan.nodes = opts.nnodes;
  return plan;
}

// Prints why attempt `attempt` failed; returns the launcher's exit code
// when it must stop, 0 when the group is to be restarted.
int report_failure(const GroupResult& result, const LaunchOptions& opts,
                   const RunDirectory& run_dir, int attempt) {
  const std::string attempt_dir = run_dir.attempt_dir(attempt);
  if (result.launcher_signal != 0) {
    if (opts.env_from_stdin && result.launcher_signal == SIGHUP) {
      std::fprintf(stderr, "tandem launch: the --hostfile job's head stopped this host (or is "
                   "gone); stopped all %zu workers%s\n", result.exits.size(),
                   failure_before_signal(result, attempt_dir, run_dir.kept()).c_str());
    } else {
      std::fprintf(stderr, "tandem launch: received SIG%s; stopped all %zu workers%s\n",
                   sigabbrev_np(result.launcher_signal), result.exits.size(),
                   failure_before_signal(result, attempt_dir, run_dir.kept()).c_str());
    }
    return 128 + result.launcher_signal;
  }
  FailureReport report = make_failure_report(result, attempt_dir);
  const std::string logs =
      run_dir.kept() ? fmt::format("{}/rank_{}/", attempt_dir, report.root_cause.exit.global_rank)
                     : "";
  const std::string what = render_failure_report(report, logs);
  // A --hostfile job's host: its --max-restarts is the job's, which the
  // head spends by restarting every host; this launcher only reports.
  // Its status tells the head whether the failure started here: workers
  // that failed with communication errors only (CommError, SIGPIPE) usually
  // lost a peer on another host, whose launcher names the cause.
  if (opts.env_from_stdin) {
    std::fprintf(stderr, "tandem launch: job failed. %s\n", what.c_str());
    return is_consequence(report.root_cause) ? kHostCommErrorExitCode : 1;
  }
  if (attempt < opts.max_restarts) {
    std::fprintf(stderr,
                 "tandem launch: attempt %d failed. %s\ntandem launch: restarting all %zu "
                 "workers (restart %d of %d)\n",
                 attempt, what.c_str(), result.exits.size(), attempt + 1, opts.max_restarts);
    return 0;
  }
  if (opts.max_restarts > 0) {
    std::fprintf(stderr,
                 "tandem launch: job failed; the restart budget is exhausted (--max-restarts "
                 "%d, attempts 0 to %d all failed). %s\n",
                 opts.max_restarts, attempt, what.c_str());
  } else {
    std::fprintf(stderr, "tandem launch: job failed. %s\n", what.c_str());
  }
  return 1;
}

ConfigEnv workers_config_env(const LaunchOptions& opts) {
  ConfigEnv env = ConfigEnv::from_environment();
  if (opts.zero_stage) env.zero_stage = opts.zero_stage;
  auto device = [](const std::string& name) {
    return name == "cpu" ? OffloadDevice::kCpu : OffloadDevice::kNone;
  };
  if (!opts.offload_optimizer_device.empty()) {
    env.offload_optimizer = device(opts.offload_optimizer_device);
  }
  if (!opts.offload_param_device.empty()) env.offload_param = device(opts.offload_param_device);
  if (opts.gradient_accumulation_steps) {
    env.gradient_accumulation_steps = opts.gradient_accumulation_steps;
  }
  if (opts.gradient_clipping) env.gradient_clipping = opts.gradient_clipping;
  return env;
}

// Whether PROGRAM runs under Python: -m and --run-path say so; otherwise a
// .py file without the execute bit does (torchrun runs every script under
// its Python; an executable one keeps its own #! line here).
bool run_under_python(const LaunchOptions& opts) {
  if (opts.module || opts.run_path) return true;
  const std::string& exe = opts.program[0];
  return !opts.no_python && exe.size() > 3 && exe.compare(exe.size() - 3, 3, ".py") == 0 &&
         ::access(exe.c_str(), F_OK) == 0 && ::access(exe.c_str(), X_OK) != 0;
}

// A Python script built on HF Accelerate takes its training settings from
// the ACCELERATE_* variables, which only an Accelerate config gives
// (accelerate_env.h); a tandem YAML's reach tandem programs alone. Said, so
// that a bf16 config does not train in fp32 without a word.
void warn_python_misses_training_settings(const Config& config, const std::string& file) {
  std::vector<std::string> unseen;
  if (config.mixed_precision != MixedPrecision::kNo) {
    unseen.push_back(fmt::format("mixed_precision {}", to_string(config.mixed_precision)));
  }
  if (config.gradient_accumulation_steps.value_or(1) != 1) {
    unseen.push_back(
        fmt::format("gradient_accumulation_steps {}", *config.gradient_accumulation_steps));
  }
  if (config.zero.stage > 0) unseen.push_back(fmt::format("ZeRO stage {}", config.zero.stage));
  if (unseen.empty()) return;
  std::fprintf(stderr,
               "tandem launch: %s is a tandem YAML file; a Python program gets its launch "
               "settings (processes, ranks, addresses) but not %s: HF Accelerate reads those "
               "from ACCELERATE_* variables, which only an Accelerate config file sets. Give "
               "the script an Accelerate config (`accelerate config`), or set them in its "
               "code\n",
               file.c_str(), fmt::format("{}", fmt::join(unseen, ", ")).c_str());
}

}  // namespace

int run_launch_command(int argc, char** argv) {
  bool help = false;
  LaunchOptions opts = parse_launch_flags(argc, argv, &help);
  if (help) return 0;
  // A --hostfile job's host: the head sends the job's environment (the
  // store token among it) through stdin, never a command line.
  if (opts.env_from_stdin) read_environment_from_stdin();
  // Flags, then the Slurm step this launcher runs in, then the environment,
  // then the config file: a bad file or value stops here (exit 2), before
  // any worker starts.
  const std::optional<SlurmStep> slurm = SlurmStep::from_environment();
  set_launcher_in_slurm_job(std::getenv("SLURM_JOB_ID") != nullptr);
  // The store refuses launchers and workers of another step of the job
  // (StoreServerOptions::run_scope); the workers read the same step.
  const std::string run_scope = slurm ? slurm->name() : "";
  if (const std::string told = apply_slurm_step(slurm, opts, std::getenv("MASTER_PORT"));
      !told.empty()) {
    std::fprintf(stderr, "%s\n", told.c_str());
  }
  // What the workers will read: the environment, with the flags the launcher
  // exports on top (make_workers).
  ConfigEnv config_env = workers_config_env(opts);
  opts.config_file = choose_config_file(opts, config_env);
  std::optional<Config> config;
  if (!opts.config_file.empty()) {
    config = load_config_file(opts.config_file);
    // What the file asks for and tandem does otherwise, for every program
    // (a Python one has no Accelerator to say it); a tandem program's
    // Accelerator then leaves these out (TANDEM_CONFIG_WARNINGS_SHOWN). A
    // --hostfile job's head has said them for every host.
    for (const auto& warning : opts.env_from_stdin ? std::vector<std::string>{}
                                                   : config->warnings) {
      std::fprintf(stderr, "tandem launch: %s\n", warning.c_str());
    }
    ::setenv("TANDEM_CONFIG_WARNINGS_SHOWN", opts.config_file.c_str(), 1);
    apply_launch_config(*config, static_cast<int>(torch::cuda::device_count()), opts);
  }
  // What accelerate launch would tell a Python script, from the flags as given.
  opts.accelerate_env = accelerate_worker_env(
      config && config->format == ConfigFormat::kAccelerateYaml ? opts.config_file : "", opts);
  // MULTI_CPU with use_cpu false on a machine without CUDA: tandem starts
  // every process the file counts (accelerate launch would start one), and
  // Accelerate would run each of them alone (DistributedType.NO) unless it
  // is told the job is on CPUs.
  if (auto it = opts.accelerate_env.find("ACCELERATE_USE_CPU");
      it != opts.accelerate_env.end() && it->second == "False" && config &&
      config->distributed_type == DistributedType::kMultiCpu && torch::cuda::device_count() == 0) {
    it->second = "True";
  }
  default_zero_stage(config ? &*config : nullptr, opts);
  if (opts.zero_stage) config_env.zero_stage = opts.zero_stage;
  validate_launch_options(opts);
  // --keep-global-batch keeps the first attempt's accumulation x world.
  if (config_env.gradient_accumulation_steps) {
    opts.base_accumulation = *config_env.gradient_accumulation_steps;
  } else if (config && config->gradient_accumulation_steps) {
    opts.base_accumulation = *config->gradient_accumulation_steps;
  }
  if (!opts.hostfile.empty()) return run_hostfile_launch(opts);  // the head: no worker here
  const bool runs_under_python = run_under_python(opts);
  if (runs_under_python) {
    // torchrun's `python -u [-m] PROGRAM`, with its PYTHON_EXEC.
    const char* exec = std::getenv("PYTHON_EXEC");
    std::vector<std::string> interpreter{exec != nullptr && *exec != '\0' ? exec : "python3",
                                         "-u"};
    if (opts.module) interpreter.push_back("-m");
    opts.program.insert(opts.program.begin(), interpreter.begin(), interpreter.end());
  }
  const std::string& program = opts.program[0];
  // A name with a slash is a path (execvp does not search PATH for it).
  TANDEM_CHECK_ARG(!executable_path(program).empty(),
                   "program '{}' was not found or is not executable; {}", program,
                   program.find('/') != std::string::npos
                       ? "check the path (a relative one starts from the directory you launch "
                         "from) and that the file is executable (chmod +x)"
                       : fmt::format("it is not on PATH: give its path, such as ./{}, or put "
                                     "its directory on PATH",
                                     program));
  // Node 0's launcher hosts the rendezvous store itself. Binding it before
  // any worker starts makes a busy port a clear, immediate error, and lets
  // port 0 pick a free port without the bind-probe-release race. It is
  // tandem's own store (docs/security.md): on one node it listens on
  // loopback only, with a fresh random token; across nodes it listens on
  // --master-addr and every node's launcher must have the same
  // TANDEM_STORE_TOKEN. Workers inherit the token through the environment.
  const char* env_token = std::getenv("TANDEM_STORE_TOKEN");
  std::string store_token = env_token != nullptr ? env_token : "";
  if (const char* file = std::getenv("TANDEM_STORE_TOKEN_FILE");
      store_token.empty() && opts.nnodes > 1 && file != nullptr && *file != '\0') {
    store_token = store_token_from_file(file);
    ::setenv("TANDEM_STORE_TOKEN", store_token.c_str(), 1);
  }
  if (opts.nnodes == 1) {
    opts.master_addr = "127.0.0.1";
    if (store_token.empty()) {
      store_token = random_store_token();
      ::setenv("TANDEM_STORE_TOKEN", store_token.c_str(), 1);
    }
  } else {
    // A multi-node count read from a config nobody named on the command
    // line (the default one) is said, so that the user sees why.
    const std::string from_config =
        config && !opts.nnodes_given && opts.hostfile.empty()
            ? fmt::format(" (num_machines: {} in the config {})", opts.nnodes, opts.config_file)
            : std::string();
    TANDEM_CHECK_ARG(!store_token.empty(),
                     "a multi-node launch{} needs TANDEM_STORE_TOKEN, the rendezvous store's "
                     "shared secret, set to the same value for every node's `tandem launch`. "
                     "Make one with `export TANDEM_STORE_TOKEN=$(head -c 32 /dev/urandom | od "
                     "-An -tx1 | tr -d ' \\n')` and export that value on every node (under "
                     "Slurm: before srun, which passes it to every task), or set "
                     "TANDEM_STORE_TOKEN_FILE to a path on a file system every node shares",
                     from_config);
  }
  if (opts.monitor_interval_given && !rendezvous_at_store(opts)) {
    std::fprintf(stderr,
                 "tandem launch: --monitor-interval has no effect here: the launcher learns of "
                 "a worker's exit as it happens (it waits on the processes); it sets how often "
                 "nodes meeting at the store (--rdzv-backend c10d) look at it, and how often a "
                 "--hostfile head probes the hosts an elastic job runs without\n");
  }
  if (opts.rdzv_settings_given && !rendezvous_at_store(opts)) {
    std::fprintf(stderr,
                 "tandem launch: --rdzv-timeout and --rdzv-conf have no effect here: they set "
                 "how nodes meet at the store to agree on node ranks (--rdzv-backend c10d, "
                 "--nnodes above 1, no --node-rank); this launch gives each node its rank\n");
  }
  const bool python = opts.c10d_store || runs_under_python || is_python_program(opts.program);
  if (python && config && config->format == ConfigFormat::kTandemYaml && !opts.env_from_stdin) {
    warn_python_misses_training_settings(*config, opts.config_file);
  }
  std::unique_ptr<StoreServer> store;
  auto host_store = [&] {
    check_store_address(opts);
    StoreServerOptions store_options;
    store_options.host = opts.master_addr;
    store_options.port = opts.master_port;
    store_options.token = store_token;
    store_options.run_scope = run_scope;
    store_options.port_in_use_advice = port_in_use_advice(opts);
    store = std::make_unique<StoreServer>(store_options);
  };
  if (rendezvous_at_store(opts)) {
    TANDEM_CHECK_ARG(!python,
                     "--rdzv-backend c10d without --node-rank runs tandem programs only: a "
                     "Python program's torch.distributed meets at c10d's own store. Give each "
                     "node its --node-rank");
    // A signal stops the waits as it stops the workers (128+signal), even
    // one that a script's `cmd &` left ignored.
    install_launcher_signal_handlers();
    // The node whose address the endpoint names hosts the store and
    // coordinates the rounds (elastic_node.h), unless --rdzv-conf is_host
    // says otherwise.
    ElasticNode node;
    node.coordinator =
        opts.rdzv_is_host ? *opts.rdzv_is_host : names_this_node(opts.master_addr);
    bool joins_busy_port = false;
    if (node.coordinator) {
      try {
        host_store();
      } catch (const PortInUseError&) {
        // Every node of one machine takes itself for the endpoint's host:
        // the first to bind hosts the store and the others join it, as
        // torch's _create_tcp_store does. A port held by something else
        // then fails at the connection (no answer, or a token refused).
        if (opts.rdzv_is_host) throw;
        log_info("rendezvous store port {} on {} is in use, probably by another node of this "
                 "machine that hosts it: joining it as a client (--rdzv-conf is_host=true "
                 "makes this node host it or fail)",
                 opts.master_port, opts.master_addr);
        node.coordinator = false;
        joins_busy_port = true;
      }
    }
    std::chrono::milliseconds timeout(static_cast<int64_t>(opts.rdzv_timeout_s * 1000));
    // A store that holds the port listens already: one that does not
    // answer soon is not this job's.
    if (joins_busy_port) timeout = std::min(timeout, std::chrono::milliseconds(10000));
    c10::intrusive_ptr<c10d::Store> meeting;
    try {
      meeting = connect_rendezvous_store(opts.master_addr, opts.master_port, store_token, timeout,
                                         run_scope);
    } catch (const CommError& e) {
      if (!joins_busy_port) throw;
      TANDEM_THROW(CommError,
                   "cannot host the rendezvous store on {} port {}: the port is already in "
                   "use, and no store of this job answers there ({}); probably another job "
                   "holds it; {}",
                   opts.master_addr, opts.master_port, e.what(), port_in_use_advice(opts));
    } catch (const StoppedBySignal& stopped) {
      std::fprintf(stderr,
                   "tandem launch: received SIG%s while waiting for the rendezvous store at "
                   "%s:%d; stopped\n",
                   sigabbrev_np(stopped.signal), opts.master_addr.c_str(), opts.master_port);
      return 128 + stopped.signal;
    }
    // Connected: from now on a store that does not answer within the
    // keep-alive time is lost (a node cut off stops, rather than hangs).
    meeting->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(
        opts.rdzv_keep_alive_interval_s * opts.rdzv_keep_alive_attempts * 1000)));
    node.store = meeting.get();
    node.master_port = opts.master_port;
    node.slots = select_local_slots(opts.nproc_per_node, "", opts.exclude, node_names());
    node.set_visible_devices = !opts.exclude.empty();
    bool config_told = false;
    node.check_world = [&](int world_size) {
      if (!config) return;
      ConfigOverrides overrides;
      overrides.mixed_precision = opts.mixed_precision;
      resolve_config(*config, config_env, overrides, world_size);
      if (!config_told) {
        std::fprintf(stderr, "tandem launch: config %s (%s)\n", opts.config_file.c_str(),
                     to_string(config->format));
      }
      config_told = true;
    };
    return run_elastic_node(opts, node);
  }
  const Plan plan = plan_slots(opts);
  opts.node_rank = plan.layout.node_rank;  // --include or the rendezvous may number the nodes
  if (config) {
    // Workers resolve the config again; doing it once here turns a batch
    // triple that does not fit this world size into one clear error.
    ConfigOverrides overrides;
    overrides.mixed_precision = opts.mixed_precision;
    resolve_config(*config, config_env, overrides, plan.layout.world_size);
    std::fprintf(stderr, "tandem launch: config %s (%s)\n", opts.config_file.c_str(),
                 to_string(config->format));
  }

  std::unique_ptr<C10dStoreHost> python_store;
  if (python) {
    // torch.distributed speaks c10d's store protocol, not tandem's.
    if (opts.node_rank == 0) {
      check_store_address(opts);
      python_store = std::make_unique<C10dStoreHost>(opts.master_addr, opts.master_port,
                                                     std::chrono::minutes(30),
                                                     port_in_use_advice(opts));
    }
  } else if (opts.node_rank == 0 && !store) {
    host_store();
  }
  const int master_port =
      store ? store->port() : python_store ? python_store->port() : opts.master_port;
  if (!python && opts.nnodes > 1 && !opts.env_from_stdin) {
    // Static nodes compute their ranks alone: they agree on the job's size
    // before any worker starts, or every one of them refuses it
    // (layout_check.h). The wait for the others is the workers' rendezvous's.
    // A --hostfile job's hosts need no check: the head gave them one
    // --include, and a host waiting here would not see the head go.
    const char* limit = std::getenv("TANDEM_TIMEOUT_S");
    const int timeout_s = limit != nullptr && std::atoi(limit) > 0 ? std::atoi(limit) : 600;
    auto meeting = connect_store(opts.master_addr, master_port, store_token,
                                 std::chrono::seconds(timeout_s), run_scope);
    check_node_layouts(*meeting, plan.layout, opts.nnodes, /*hosts_store=*/store != nullptr);
  }

  // On a failure the whole group stops and, within --max-restarts, starts
  // again with the next TANDEM_RESTART_COUNT: the store stays up, and each
  // attempt rendezvouses under its own key prefix (rendezvous.cpp).
  const RunDirectory run_dir(opts.log_dir);
  // A --hostfile job's head restarts every host itself, numbering the
  // attempts: this launcher's first is the head's (TANDEM_RESTART_COUNT).
  int first_attempt = 0;
  if (const char* count = std::getenv("TANDEM_RESTART_COUNT"); opts.env_from_stdin && count) {
    first_attempt = std::max(0, std::atoi(count));
  }
  for (int attempt = first_attempt;; ++attempt) {
    if (python && opts.node_rank == 0 && attempt > first_attempt) {
      // torch.distributed keys its rendezvous by no attempt number and
      // expects a fresh store per restart, as torchrun's agent gives it.
      python_store.reset();
      python_store = std::make_unique<C10dStoreHost>(opts.master_addr, master_port);
    }
    WorkerGroup group(opts.program,
                      make_workers(opts, plan, master_port, /*agent_store=*/true, attempt,
                                   run_dir.attempt_dir(attempt)),
                      opts.grace_period_s, opts.prefix_output);
    if (opts.env_from_stdin) group.stop_when_closed(STDIN_FILENO);  // the head is gone
    GroupResult result = group.run();
    if (result.preempted && !result.has_first_failure) {
      std::fprintf(stderr,
                   "tandem launch: the workers stopped for preemption after saving a checkpoint "
                   "(exit code %d); not restarting\n",
                   kPreemptedExitCode);
      return kPreemptedExitCode;
    }
    if (result.success) return 0;
    if (int code = report_failure(result, opts, run_dir, attempt); code != 0) return code;
  }
}

}  // namespace tandem::cli
