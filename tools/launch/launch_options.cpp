#include "launch/launch_options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <sstream>

#include <CLI/CLI.hpp>
#include <torch/cuda.h>

#include "launch/cpu_affinity.h"
#include "launch/rdzv_flags.h"

#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem::cli {
namespace {

// Options that take a value: needed to find where PROGRAM starts.
const std::set<std::string> kValueOptions = {
    "--nproc-per-node", "--nnodes",      "--node-rank",    "--master-addr",
    "--master-port",    "--max-restarts", "--log-dir",      "--tee",
    "--redirects",      "--include",      "--exclude",      "--grace-period",
    "--rdzv-endpoint",  "--rdzv-backend", "--rdzv-id",      "--monitor-interval",
    "--config-file",    "--mixed-precision", "--rdzv-timeout", "--rdzv-conf",
    // accelerate launch's and the deepspeed launcher's spellings
    "--num-processes",  "--num-machines",  "--num-nodes",    "--num-gpus",
    "--machine-rank",   "--main-process-ip", "--main-process-port", "--hostfile",
    "--launcher",       "--launcher-args",   "--ssh-port",     "--local-ranks-filter",
    "--gpu-ids",        "--zero-stage",      "--offload-optimizer-device",
    "--offload-param-device", "--gradient-accumulation-steps", "--gradient-clipping",
    "--bind-core-list", "--deepspeed-config-file"};

// "--nproc_per_node=4" -> "--nproc-per-node=4": underscores only in the name.
std::string normalize(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return arg;
  auto eq = arg.find('=');
  std::string name = arg.substr(0, eq);
  for (auto& c : name) {
    if (c == '_') c = '-';
  }
  return eq == std::string::npos ? name : name + arg.substr(eq);
}

// `text` as a whole int, all of it; nullopt otherwise.
std::optional<int> whole_number(const std::string& text) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || text.empty()) return std::nullopt;
  return value;
}

// "4", or torchrun's "MIN:MAX": returns MAX, and MIN in *min_nodes when it
// differs (an elastic job).
int parse_nnodes(const std::string& text, int* min_nodes) {
  auto number = [&](const std::string& part) {
    const std::optional<int> value = whole_number(part);
    TANDEM_CHECK_ARG(value.has_value(),
                     "--nnodes '{}' is not a number of nodes (write N, or MIN:MAX)", text);
    return *value;
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) return number(text);
  const int low = number(text.substr(0, colon));
  const int high = number(text.substr(colon + 1));
  TANDEM_CHECK_ARG(low >= 1 && low <= high, "--nnodes {}: MIN:MAX needs 1 <= MIN <= MAX", text);
  *min_nodes = low == high ? 0 : low;
  return high;
}

// "0,2" (--local-ranks-filter) or, with ranges, "1,3-5,7" (--bind_core_list):
// the numbers, each >= 0, in the order given.
std::vector<int> parse_number_list(const std::string& text, const std::string& flag,
                                   bool ranges) {
  std::vector<int> numbers;
  std::stringstream items(text);
  std::string item;
  auto number = [&](const std::string& part) {
    const std::optional<int> value = whole_number(part);
    TANDEM_CHECK_ARG(value.has_value() && *value >= 0,
                     "{} '{}': '{}' is not a number >= 0; write {}", flag, text, part,
                     ranges ? "a list such as 0,2-5,7" : "a list such as 0,1,2");
    return *value;
  };
  while (std::getline(items, item, ',')) {
    const auto dash = ranges ? item.find('-') : std::string::npos;
    if (dash == std::string::npos) {
      numbers.push_back(number(item));
      continue;
    }
    const int low = number(item.substr(0, dash));
    const int high = number(item.substr(dash + 1));
    TANDEM_CHECK_ARG(low <= high, "{} '{}': the range {} runs backwards", flag, text, item);
    for (int n = low; n <= high; ++n) numbers.push_back(n);
  }
  TANDEM_CHECK_ARG(!numbers.empty(), "{} is empty; give at least one number", flag);
  return numbers;
}

// torchrun's --nproc-per-node: a number, or auto (the GPUs, else the CPUs
// this process may use), gpu (the GPUs; an error without one) or cpu.
int parse_nproc_per_node(const std::string& text) {
  if (text == "cpu") return static_cast<int>(allowed_cpus().size());
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (text == "gpu") {
    TANDEM_CHECK_ARG(gpus > 0, "--nproc-per-node gpu: this machine has no CUDA GPU; give a "
                               "number, cpu or auto");
    return gpus;
  }
  if (text == "auto") return gpus > 0 ? gpus : static_cast<int>(allowed_cpus().size());
  const std::optional<int> value = whole_number(text);
  TANDEM_CHECK_ARG(value.has_value(),
                   "--nproc-per-node '{}' is not a number of processes, auto, gpu or cpu", text);
  return *value;
}

}  // namespace

void validate_launch_options(LaunchOptions& opts) {
  TANDEM_CHECK_ARG(!opts.program.empty(),
                   "missing PROGRAM: usage is `tandem launch [options] PROGRAM [ARGS...]`");
  TANDEM_CHECK_ARG(opts.nnodes >= 1, "--nnodes must be at least 1, got {}", opts.nnodes);
  if (opts.total_processes) {
    const int total = *opts.total_processes;
    TANDEM_CHECK_ARG(total >= opts.nnodes && total % opts.nnodes == 0,
                     "--num_processes {} counts the processes of all {} nodes (as accelerate "
                     "does) and must split evenly over them; make it a multiple of {}, or give "
                     "--nproc-per-node",
                     total, opts.nnodes, opts.nnodes);
    opts.nproc_per_node = total / opts.nnodes;
  }
  TANDEM_CHECK_ARG(opts.nproc_per_node >= 1, "--nproc-per-node must be at least 1, got {}",
                   opts.nproc_per_node);
  TANDEM_CHECK_ARG(opts.nnodes >= 1, "--nnodes must be at least 1, got {}", opts.nnodes);
  TANDEM_CHECK_ARG(opts.node_rank >= 0 && opts.node_rank < opts.nnodes,
                   "{} {} must be in [0, --nnodes={})", opts.node_rank_flag, opts.node_rank,
                   opts.nnodes);
  TANDEM_CHECK_ARG(opts.master_port >= 0 && opts.master_port <= 65535,
                   "--master-port {} is out of range 0-65535", opts.master_port);
  TANDEM_CHECK_ARG(opts.tee >= 0 && opts.tee <= 3 && opts.redirects >= 0 && opts.redirects <= 3,
                   "--tee and --redirects take 0 (none), 1 (stdout), 2 (stderr) or 3 (both), "
                   "got --tee {} --redirects {}",
                   opts.tee, opts.redirects);
  TANDEM_CHECK_ARG(opts.max_restarts >= 0, "--max-restarts must be 0 or more, got {}",
                   opts.max_restarts);
  TANDEM_CHECK_ARG(!opts.monitor_interval_given ||
                       (opts.monitor_interval_s > 0 && opts.monitor_interval_s <= 3600),
                   "--monitor-interval must be more than 0 and at most 3600 seconds, got {}",
                   opts.monitor_interval_s);
  TANDEM_CHECK_ARG(!(opts.module && opts.no_python),
                   "--module runs PROGRAM as `python -m PROGRAM`, and --no-python runs it "
                   "without Python; give one of them");
  TANDEM_CHECK_ARG(!(opts.run_path && (opts.no_python || opts.module)),
                   "--run-path runs PROGRAM as a Python file; drop --no-python and --module");
  for (int local : opts.local_ranks_filter) {
    TANDEM_CHECK_ARG(local < opts.nproc_per_node,
                     "--local-ranks-filter names local rank {}, but this node runs {} "
                     "processes (local ranks 0..{})",
                     local, opts.nproc_per_node, opts.nproc_per_node - 1);
  }
  if (opts.master_addr_given) {
    const std::string problem = host_address_problem(opts.master_addr);
    TANDEM_CHECK_ARG(problem.empty(), "--master-addr (--main_process_ip, --rdzv-endpoint): {}",
                     problem);
  }
  TANDEM_CHECK_ARG(!opts.zero_stage || (*opts.zero_stage >= 0 && *opts.zero_stage <= 3),
                   "--zero_stage {} is not a ZeRO stage; give 0, 1, 2 or 3", *opts.zero_stage);
  TANDEM_CHECK_ARG(!opts.gradient_accumulation_steps || *opts.gradient_accumulation_steps >= 1,
                   "--gradient_accumulation_steps must be at least 1, got {}",
                   *opts.gradient_accumulation_steps);
  TANDEM_CHECK_ARG(!opts.gradient_clipping || *opts.gradient_clipping >= 0,
                   "--gradient_clipping must be 0 (none) or a positive max norm, got {}",
                   *opts.gradient_clipping);
  TANDEM_CHECK_ARG(!opts.gpu_ids_given || (opts.include.empty() && opts.exclude.empty()),
                   "--gpu_ids and --include/--exclude both choose this node's GPUs; keep one");
  TANDEM_CHECK_ARG(opts.bind_core_list.empty() || opts.bind_cores_to_rank,
                   "--bind_core_list goes with --bind_cores_to_rank, which it restricts");
  TANDEM_CHECK_ARG(opts.grace_period_s >= 0 && opts.grace_period_s <= 600,
                   "--grace-period must be from 0 to 600 seconds, got {}", opts.grace_period_s);
  TANDEM_CHECK_ARG(opts.min_nodes == 0 || !opts.hostfile.empty() || rendezvous_at_store(opts),
                   "--nnodes {}:{} asks for an elastic job, which needs nodes that meet at the "
                   "store: --rdzv-backend c10d --rdzv-endpoint HOST:PORT without --node-rank "
                   "or --include, or --hostfile. Otherwise give --nnodes N",
                   opts.min_nodes, opts.nnodes);
  if (!opts.hostfile.empty()) {
    // --nnodes and --nproc-per-node pick hosts and slots of the file
    // (hostfile.h); the rest is the head's to set for every host.
    TANDEM_CHECK_ARG(opts.launcher == "ssh",
                     "--launcher {}: {}", opts.launcher,
                     opts.launcher == "pdsh"
                         ? "tandem starts one ssh per host itself, since each connection's "
                           "stdin carries the job's token and environment; use --launcher ssh "
                           "(the default) and give ssh options with --launcher-args"
                         : "not supported; --hostfile starts hosts over ssh. Under Slurm, "
                           "run one launcher per node without --hostfile (`srun "
                           "--ntasks-per-node=1 tandem launch ...`) or start the program "
                           "directly with srun; under mpirun, start the program directly: "
                           "tandem reads SLURM_* and OMPI_* (docs/slurm.md)");
    TANDEM_CHECK_ARG(!opts.standalone && !opts.node_rank_given && opts.rdzv_backend == "static" &&
                         !opts.env_from_stdin,
                     "--hostfile numbers the hosts itself, in the file's order: drop "
                     "--standalone, --node-rank/--machine-rank and --rdzv-backend");
    TANDEM_CHECK_ARG(opts.master_port > 0,
                     "--hostfile needs a fixed --master-port that every host knows, not 0");
    TANDEM_CHECK_ARG(!opts.gpu_ids_given,
                     "--gpu_ids goes with one machine: with --hostfile, each host's slots "
                     "(and --include/--exclude) choose its GPUs");
    TANDEM_CHECK_ARG(!opts.ssh_port_given || (opts.ssh_port >= 1 && opts.ssh_port <= 65535),
                     "--ssh-port must be from 1 to 65535, got {}", opts.ssh_port);
  } else {
    TANDEM_CHECK_ARG(opts.launcher == "ssh" && opts.launcher_args.empty() && !opts.ssh_port_given,
                     "--launcher, --launcher-args and --ssh-port go with --hostfile, which "
                     "starts the hosts over ssh; drop them, or give --hostfile");
    TANDEM_CHECK_ARG(!opts.keep_global_batch || rendezvous_at_store(opts),
                     "--keep-global-batch goes with jobs whose world size can change between "
                     "restarts: --hostfile, or --rdzv-backend c10d without --node-rank");
  }
  if ((opts.tee != 0 || opts.redirects != 0) && opts.log_dir.empty()) {
    TANDEM_THROW(UsageError, "--tee and --redirects write log files: add --log-dir DIR");
  }
  if (!opts.hostfile.empty()) return;
  if (opts.standalone) {
    TANDEM_CHECK_ARG(opts.nnodes == 1, "--standalone runs on one node; drop --nnodes {}",
                     opts.nnodes);
    opts.master_addr = "127.0.0.1";
    opts.master_port = 0;
  }
  TANDEM_CHECK_ARG(opts.rdzv_backend == "static" || opts.rdzv_backend == "c10d",
                   "--rdzv-backend {} is not supported: the nodes meet at tandem's own store. "
                   "Use c10d (the nodes agree on node ranks there) or static (each node gives "
                   "--node-rank)",
                   opts.rdzv_backend);
  if (opts.rdzv_backend == "c10d" && opts.rdzv_endpoint_given && !opts.master_port_given &&
      !opts.master_port_in_config) {
    // `--rdzv-endpoint HOST`: torchrun's c10d backend listens on 29400
    // (c10d_rendezvous_backend.py's DEFAULT_PORT), not on --master-port's 29500.
    opts.master_port = kC10dDefaultPort;
  }
  TANDEM_CHECK_ARG(opts.rdzv_timeout_s > 0, "--rdzv-timeout must be > 0 seconds, got {}",
                   opts.rdzv_timeout_s);
  TANDEM_CHECK_ARG(opts.rdzv_keep_alive_interval_s > 0,
                   "--rdzv-conf keep_alive_interval must be > 0 seconds, got {}",
                   opts.rdzv_keep_alive_interval_s);
  TANDEM_CHECK_ARG(opts.rdzv_last_call_s >= 0,
                   "--rdzv-conf last_call_timeout must be >= 0 seconds, got {}",
                   opts.rdzv_last_call_s);
  TANDEM_CHECK_ARG(opts.nnodes == 1 || opts.node_rank_given || !opts.include.empty() ||
                       opts.rdzv_backend == "c10d",
                   "--nnodes {} without --node-rank would make every node node 0. Give each "
                   "node its --node-rank, let the nodes agree on them with --rdzv-backend c10d "
                   "--rdzv-endpoint HOST:PORT, or name every node with --include "
                   "(host1:0,1@host2:0)",
                   opts.nnodes);
  TANDEM_CHECK_ARG(!(opts.nnodes > 1 && opts.master_port == 0),
                   "a multi-node job needs a fixed --master-port that every node knows; port 0 "
                   "only works with --nnodes 1");
  if ((opts.tee != 0 || opts.redirects != 0) && opts.log_dir.empty()) {
    TANDEM_THROW(UsageError, "--tee and --redirects write log files: add --log-dir DIR");
  }
  // Unlike torchrun, --log-dir alone already keeps every stream's file.
  if (!opts.log_dir.empty() && opts.tee == 0 && opts.redirects == 0) opts.tee = 3;
}

namespace {

// A value CLI11 refused that came from a PET_* variable, not from a flag
// on the command line: throws UsageError naming the variable and the flag
// it stands for (CLI11 names the flag only). Returns otherwise.
void env_variable_error(const CLI::App& app, const std::vector<std::string>& own,
                        const CLI::ParseError& error) {
  const std::string what = error.what();
  for (const CLI::Option* option : app.get_options()) {
    const std::string& variable = option->get_envname();
    const char* value = variable.empty() ? nullptr : std::getenv(variable.c_str());
    if (value == nullptr || option->get_lnames().empty()) continue;
    const std::string flag = "--" + option->get_lnames().front();
    const bool on_command_line = std::any_of(own.begin(), own.end(), [&](const std::string& a) {
      return a == flag || a.rfind(flag + "=", 0) == 0;
    });
    if (on_command_line || what.find(flag) == std::string::npos ||
        what.find(value) == std::string::npos) {
      continue;
    }
    TANDEM_THROW(UsageError,
                 "the environment variable {}={} is not a valid {} (it stands for that flag, "
                 "as in torchrun): {}. Fix or unset {}, or give {} on the command line",
                 variable, value, flag, what, variable, flag);
  }
}

}  // namespace

LaunchOptions parse_launch_flags(int argc, char** argv, bool* help_printed) {
  *help_printed = false;
  std::vector<std::string> own;
  LaunchOptions opts;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = normalize(argv[i]);
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;
    const std::string name = arg.substr(0, arg.find('='));
    if (name == "--machine-rank" || name == "--node-rank") {
      const std::string raw = argv[i];
      opts.node_rank_flag = raw.substr(0, raw.find('='));  // as the user spelled it
    }
    own.push_back(arg);
    if (kValueOptions.count(arg) && i + 1 < argc) own.push_back(argv[++i]);
  }
  for (; i < argc; ++i) opts.program.emplace_back(argv[i]);

  CLI::App app{"Start a job of N processes per node (torchrun-compatible).", "tandem launch"};
  // As torchrun, each node option also reads PET_<NAME> (Kubeflow's
  // PyTorchJob sets PET_NNODES, PET_NODE_RANK, PET_RDZV_ENDPOINT, ... per
  // pod); a flag beats it.
  // Each with the names accelerate launch and the deepspeed launcher give it.
  std::string nproc_per_node;
  app.add_option("--nproc-per-node,--num-gpus", nproc_per_node,
                 "processes on this node: a number, or auto (one per GPU, else per CPU), gpu "
                 "or cpu (deepspeed: --num_gpus)")
      ->each([&](const std::string&) { opts.nproc_given = true; })
      ->envname("PET_NPROC_PER_NODE");
  std::optional<int> total_processes;
  app.add_option("--num-processes", total_processes,
                 "accelerate's spelling: processes over all nodes, divided by --nnodes");
  std::string nnodes;
  app.add_option("--nnodes,--num-machines,--num-nodes", nnodes,
                 "number of nodes (accelerate: --num_machines, deepspeed: --num_nodes); "
                 "N, or MIN:MAX for an elastic job (with --hostfile or --rdzv-backend c10d)")
      ->each([&](const std::string&) { opts.nnodes_given = true; })
      ->envname("PET_NNODES");
  app.add_option("--node-rank,--machine-rank", opts.node_rank,
                 "rank of this node, 0..nnodes-1 (accelerate: --machine_rank)")
      ->each([&](const std::string&) { opts.node_rank_given = true; })
      ->envname("PET_NODE_RANK");
  app.add_option("--master-addr,--main-process-ip", opts.master_addr,
                 "address of node 0 (accelerate: --main_process_ip)")
      ->each([&](const std::string&) { opts.master_addr_given = true; })
      ->envname("PET_MASTER_ADDR");
  app.add_option("--master-port,--main-process-port", opts.master_port,
                 "rendezvous port on node 0; 0 picks a free one (accelerate: --main_process_port)")
      ->each([&](const std::string&) { opts.master_port_given = true; })
      ->envname("PET_MASTER_PORT");
  app.add_flag("--multi-gpu", opts.multi_gpu,
               "accelerate's spelling: one process per slot, as tandem launch always runs");
  app.add_option("--hostfile", opts.hostfile,
                 "DeepSpeed hostfile ('HOST slots=N' lines): start every host's launcher from "
                 "here over ssh (docs/multinode.md)");
  app.add_option("--launcher", opts.launcher, "how --hostfile reaches the hosts: ssh (the only one)");
  app.add_option("--launcher-args", opts.launcher_args,
                 "options for ssh, e.g. \"-i KEY -o StrictHostKeyChecking=no\" (--hostfile)");
  app.add_option("--ssh-port", opts.ssh_port, "ssh port of every host (--hostfile)")
      ->each([&](const std::string&) { opts.ssh_port_given = true; });
  app.add_flag("--keep-global-batch", opts.keep_global_batch,
               "--hostfile restarts on fewer or more hosts scale gradient accumulation so that "
               "accumulation x world size stays the same");
  app.add_flag("--env-from-stdin", opts.env_from_stdin,
               "set by --hostfile's head on each host: read KEY=VALUE lines from stdin up to an "
               "empty line, and stop the workers when stdin closes");
  app.add_flag("--standalone", opts.standalone, "single node on a free local port");
  std::string rdzv_endpoint;
  std::string rdzv_conf;
  app.add_option("--rdzv-endpoint", rdzv_endpoint, "HOST:PORT, same as --master-addr/--master-port")
      ->envname("PET_RDZV_ENDPOINT");
  app.add_option("--rdzv-backend", opts.rdzv_backend,
                 "static (each node gives --node-rank) or c10d (without --node-rank the nodes "
                 "agree on node ranks at the store; the config's rdzv_backend when not given)")
      ->each([&](const std::string&) { opts.rdzv_backend_given = true; })
      ->envname("PET_RDZV_BACKEND");
  app.add_option("--rdzv-id", opts.rdzv_id, "job id the nodes meet under (c10d)")
      ->envname("PET_RDZV_ID");
  app.add_option("--rdzv-timeout", opts.rdzv_timeout_s,
                 "seconds a node waits for the others to arrive (c10d; default 600)")
      ->each([&](const std::string&) { opts.rdzv_settings_given = true; });
  app.add_option("--rdzv-conf", rdzv_conf,
                 "c10d rendezvous settings KEY=VALUE,...: join_timeout (as --rdzv-timeout), "
                 "last_call_timeout (seconds a round stays open for more nodes once MIN "
                 "joined; default 30), keep_alive_interval and keep_alive_max_attempt (a node "
                 "silent for their product, default 5 x 3 s, is lost)")
      ->envname("PET_RDZV_CONF");
  app.add_option("--monitor-interval", opts.monitor_interval_s,
                 "seconds between a c10d node's looks at the store for restarts and joining "
                 "nodes (default 0.5), or a --hostfile head's probes of the hosts an elastic "
                 "job runs without (default 5); no effect otherwise (warned)")
      ->each([&](const std::string&) { opts.monitor_interval_given = true; });
  app.add_option("--max-restarts", opts.max_restarts, "restart the whole group up to N times")
      ->envname("PET_MAX_RESTARTS");
  app.add_option("--log-dir", opts.log_dir, "write each rank's stdout/stderr under DIR");
  app.add_option("--tee", opts.tee, "streams copied to files and console: 1 out, 2 err, 3 both");
  app.add_option("--redirects", opts.redirects, "streams sent to files only: 1 out, 2 err, 3 both");
  app.add_option("--include", opts.include, "DeepSpeed filter: host:0,1@host2:2");
  app.add_option("--exclude", opts.exclude, "DeepSpeed filter: host:1");
  app.add_option("--grace-period", opts.grace_period_s,
                 "seconds between SIGTERM and SIGKILL (600 with the config's preemption block)")
      ->each([&](const std::string&) { opts.grace_period_given = true; });
  bool no_prefix = false;
  app.add_flag("--no-prefix", no_prefix, "do not prefix output lines with the rank");
  app.add_flag("--no-python", opts.no_python,
               "run PROGRAM as given; without it a .py file that is not executable runs under "
               "python3, as torchrun runs scripts under its Python");
  app.add_flag("--c10d-store", opts.c10d_store,
               "host a c10d TCPStore for torch.distributed workers (automatic when PROGRAM is "
               "python, a .py file or a file whose #! line runs Python); for Python started "
               "through a wrapper such as a shell script or uv run");
  app.add_flag("-m,--module", opts.module,
               "PROGRAM is a Python module, run as `python -m PROGRAM` (torchrun's and "
               "accelerate's -m, deepspeed's --module); $PYTHON_EXEC names the interpreter");
  app.add_flag("--run-path", opts.run_path,
               "PROGRAM is a Python file: run it under Python even when it is executable");
  std::string local_ranks_filter;
  app.add_option("--local-ranks-filter", local_ranks_filter,
                 "only these local ranks' output reaches the console, e.g. 0 or 0,2; "
                 "--log-dir still keeps every rank's");
  bool no_local_rank = false;
  app.add_flag("--no-local-rank", no_local_rank,
               "deepspeed's: do not pass --local_rank=N to PROGRAM; tandem never does "
               "(LOCAL_RANK is in the environment)");
  std::string bind_core_list;
  app.add_flag("--bind-cores-to-rank", opts.bind_cores_to_rank,
               "deepspeed's: pin each local worker to its own contiguous share of the CPUs, "
               "with OMP_NUM_THREADS set to the share's size");
  app.add_option("--bind-core-list", bind_core_list,
                 "the CPUs --bind-cores-to-rank shares out, e.g. 0-15 or 0,2,4-7 (default: "
                 "those the launcher may run on)");
  app.add_option("--gpu-ids", opts.visible_devices,
                 "accelerate's: GPUs to use, e.g. 0,1 (CUDA_VISIBLE_DEVICES for every worker; "
                 "without a process count, one process per id)")
      ->each([&](const std::string&) { opts.gpu_ids_given = true; });
  app.add_flag("--use-deepspeed", opts.use_deepspeed,
               "accelerate's: train with ZeRO (stage 2 unless --zero_stage or the config says)");
  app.add_option("--zero-stage", opts.zero_stage,
                 "accelerate's: ZeRO stage 0-3, exported as TANDEM_ZERO_STAGE (beats the config)");
  app.add_option("--offload-optimizer-device", opts.offload_optimizer_device,
                 "accelerate's: none or cpu, exported as TANDEM_OFFLOAD_OPTIMIZER_DEVICE")
      ->check(CLI::IsMember({"none", "cpu"}));
  app.add_option("--offload-param-device", opts.offload_param_device,
                 "accelerate's: none or cpu (stage 3), exported as TANDEM_OFFLOAD_PARAM_DEVICE")
      ->check(CLI::IsMember({"none", "cpu"}));
  app.add_option("--gradient-accumulation-steps", opts.gradient_accumulation_steps,
                 "accelerate's: exported as TANDEM_GRADIENT_ACCUMULATION_STEPS");
  app.add_option("--gradient-clipping", opts.gradient_clipping,
                 "accelerate's: max gradient norm (0: none), exported as "
                 "TANDEM_GRADIENT_CLIPPING");
  app.add_option("--deepspeed-config-file", opts.deepspeed_config_file,
                 "accelerate's: a DeepSpeed JSON, used as --config-file");
  std::string mixed_precision;
  app.add_option("--config-file", opts.config_file,
                 "tandem/Accelerate YAML or DeepSpeed JSON config; flags win over it (default: "
                 "$TANDEM_CONFIG_FILE, then the file `tandem config` writes, then Accelerate's)");
  app.add_option("--mixed-precision", mixed_precision,
                 "no, bf16 or fp16: exported to workers as TANDEM_MIXED_PRECISION");
  app.footer("Everything after PROGRAM is passed to it unchanged.");

  std::vector<std::string> reversed(own.rbegin(), own.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    std::printf("\nusage: tandem launch [options] PROGRAM [ARGS...]\n");
    *help_printed = true;
    return opts;
  } catch (const CLI::ParseError& e) {
    env_variable_error(app, own, e);
    TANDEM_THROW(UsageError, "{}. Run `tandem launch --help` for the options", e.what());
  }
  opts.prefix_output = !no_prefix;
  if (!nproc_per_node.empty()) opts.nproc_per_node = parse_nproc_per_node(nproc_per_node);
  if (!local_ranks_filter.empty()) {
    opts.local_ranks_filter =
        parse_number_list(local_ranks_filter, "--local-ranks-filter", /*ranges=*/false);
  }
  if (!bind_core_list.empty()) {
    opts.bind_core_list = parse_number_list(bind_core_list, "--bind-core-list", /*ranges=*/true);
  }
  if (opts.bind_cores_to_rank) opts.cpu_affinity = true;
  if (opts.gpu_ids_given) {
    if (opts.visible_devices == "all") opts.visible_devices.clear();
    // Without a count (flag or config), one process per listed GPU.
    if (!opts.visible_devices.empty() && !opts.nproc_given) {
      opts.nproc_per_node = 1 + static_cast<int>(std::count(opts.visible_devices.begin(),
                                                            opts.visible_devices.end(), ','));
    }
  }
  if (!opts.deepspeed_config_file.empty()) {
    TANDEM_CHECK_ARG(opts.config_file.empty(),
                     "--deepspeed_config_file and --config-file both given; keep one");
    opts.config_file = opts.deepspeed_config_file;
  }
  if (!nnodes.empty()) opts.nnodes = parse_nnodes(nnodes, &opts.min_nodes);
  if (total_processes) {
    TANDEM_CHECK_ARG(!opts.nproc_given,
                     "--num_processes (all nodes' processes, as accelerate counts) and "
                     "--nproc-per-node both given; keep one");
    // Divided by the nodes once a config file may have given their number
    // (validate_launch_options).
    opts.total_processes = *total_processes;
    opts.nproc_given = true;
  }
  if (!rdzv_endpoint.empty()) apply_rdzv_endpoint(rdzv_endpoint, opts);
  if (!rdzv_conf.empty()) {
    apply_rdzv_conf(rdzv_conf, opts);
    opts.rdzv_settings_given = true;
  }
  if (!mixed_precision.empty()) opts.mixed_precision = parse_mixed_precision(mixed_precision);
  return opts;
}

bool rendezvous_at_store(const LaunchOptions& opts) {
  return opts.rdzv_backend == "c10d" && opts.nnodes > 1 && !opts.node_rank_given &&
         opts.include.empty();
}

LaunchOptions parse_launch_options(int argc, char** argv, bool* help_printed) {
  LaunchOptions opts = parse_launch_flags(argc, argv, help_printed);
  if (!*help_printed) validate_launch_options(opts);
  return opts;
}

}  // namespace tandem::cli
