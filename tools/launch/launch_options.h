#pragma once
// Options of `tandem launch`, spelled as torchrun spells them, and how a
// config file fills the ones no flag gave.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tandem/config/config.h"

namespace tandem::cli {

// The port of a c10d --rdzv-endpoint that names none: torchrun's.
constexpr int kC10dDefaultPort = 29400;

struct LaunchOptions {
  int nproc_per_node = 1;
  bool nproc_given = false;
  // accelerate's --num_processes: the processes of all nodes, divided by the
  // number of nodes (flags' or the config's) in validate_launch_options().
  std::optional<int> total_processes;
  int nnodes = 1;
  int min_nodes = 0;  // --nnodes MIN:MAX with MIN < MAX: an elastic job runs on no fewer nodes
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  // 0: the launcher picks a free port. 29500 (torchrun's --master-port),
  // or kC10dDefaultPort for a c10d --rdzv-endpoint without a port.
  int master_port = 29500;
  bool standalone = false;
  int max_restarts = 0;  // restarts of the whole group after a failure
  std::string log_dir;
  int tee = 0;        // 1 stdout, 2 stderr, 3 both: to files and console
  int redirects = 0;  // 1 stdout, 2 stderr, 3 both: to files only
  bool prefix_output = true;
  // --no-python: run PROGRAM itself; without it a .py file without the
  // execute bit runs as `python3 FILE` (torchrun runs it under its Python).
  bool no_python = false;
  // --c10d-store: node 0 hosts a c10d TCPStore for torch.distributed
  // workers, as for a PROGRAM it sees is Python (python_store.h), when a
  // wrapper it cannot see through starts Python.
  bool c10d_store = false;
  // -m/--module (torchrun, accelerate; deepspeed's --module): PROGRAM is a
  // Python module, run as `python -m PROGRAM`. --run-path (torchrun): PROGRAM
  // is a Python file, run under Python even when it is executable.
  bool module = false;
  bool run_path = false;
  // --local-ranks-filter 0,2: only these local ranks' output reaches the
  // console; every rank's log files are still written. Empty: all ranks.
  std::vector<int> local_ranks_filter;
  std::string include;  // DeepSpeed host filter, e.g. "host:0,1@host2:2"
  std::string exclude;
  double grace_period_s = 3.0;  // SIGTERM -> SIGKILL
  bool grace_period_given = false;
  std::vector<std::string> program;  // PROGRAM followed by its arguments
  // torchrun's rendezvous flags. "c10d" with several nodes and no node rank:
  // the launchers agree on node ranks through the store (node_rendezvous.h).
  std::string rdzv_backend = "static";
  std::string rdzv_id = "none";
  double rdzv_timeout_s = 600;  // how long a launcher waits for the other nodes
  double rdzv_last_call_s = 30;  // --rdzv-conf last_call_timeout: a round's wait for more nodes
  // --rdzv-conf keep_alive_interval and keep_alive_max_attempt: a node whose
  // heartbeat stops for their product is lost.
  double rdzv_keep_alive_interval_s = 5;
  int rdzv_keep_alive_attempts = 3;
  // --rdzv-conf is_host: whether this node hosts the c10d rendezvous store.
  // Unset: the node whose address --rdzv-endpoint names hosts it, and a
  // node that finds the port taken (another node of the same machine
  // hosts it) joins that store instead, as torchrun does.
  std::optional<bool> rdzv_is_host;
  // --monitor-interval: how often a c10d node looks at the store for
  // restarts and waiting nodes (default 0.5 s), and how often a --hostfile
  // head probes the hosts an elastic job runs without (default 5 s); the
  // workers' exits need no polling. Read it with monitor_interval().
  double monitor_interval_s = 0;
  bool monitor_interval_given = false;
  // --rdzv-timeout or --rdzv-conf given: they tune the nodes' meeting at
  // the store only (rendezvous_at_store()); elsewhere the launcher warns.
  bool rdzv_settings_given = false;
  // --hostfile: this launcher starts every host's launcher over ssh
  // (host_fanout.h). --launcher-args are ssh options, --ssh-port its port.
  std::string hostfile;
  std::string launcher = "ssh";
  std::string launcher_args;
  int ssh_port = 0;  // 0: ssh's own default
  bool ssh_port_given = false;
  // --keep-global-batch: a restart at another world size scales gradient
  // accumulation (TANDEM_GRADIENT_ACCUMULATION_STEPS) to keep
  // accumulation x world; base_accumulation is the first attempt's (from the
  // environment or the config file; set by the launcher).
  bool keep_global_batch = false;
  int64_t base_accumulation = 1;
  // Set by the head on each host's launcher: read KEY=VALUE lines from stdin
  // up to an empty line, export them, and stop when stdin closes.
  bool env_from_stdin = false;

  // Which settings came from flags: a config file fills only the others.
  bool nnodes_given = false;
  bool node_rank_given = false;  // by --node-rank, or by a multi-machine config's machine_rank
  bool master_addr_given = false;
  bool master_addr_in_config = false;  // the config's main_process_ip set master_addr
  bool master_port_in_config = false;  // the config's main_process_port set master_port
  bool master_port_given = false;
  bool rdzv_endpoint_given = false;  // --rdzv-endpoint gave master_addr and master_port
  // How the user spelled the node rank's flag, for errors: --node-rank, or
  // accelerate's --machine_rank.
  std::string node_rank_flag = "--node-rank";
  bool rdzv_backend_given = false;
  std::string config_file;  // --config-file; absolute once chosen (choose_config_file)
  std::optional<MixedPrecision> mixed_precision;  // --mixed-precision
  // The config's gpu_ids, or accelerate's --gpu_ids (which beats it):
  // CUDA_VISIBLE_DEVICES for every worker. Empty: left as it is.
  std::string visible_devices;
  bool gpu_ids_given = false;
  // The config's enable_cpu_affinity: each local worker pinned to its own
  // share of the launcher's CPUs (cpu_affinity.h).
  bool cpu_affinity = false;
  // deepspeed's --bind_cores_to_rank: cpu_affinity, over --bind_core_list's
  // CPUs when given (else the launcher's), with OMP_NUM_THREADS set to each
  // worker's share of them.
  bool bind_cores_to_rank = false;
  std::vector<int> bind_core_list;
  // Training settings given as accelerate launch flags (--use_deepspeed,
  // --zero_stage, --offload_*_device, --gradient_accumulation_steps,
  // --gradient_clipping): exported to the workers as TANDEM_* variables,
  // which beat the config file (docs/config.md, "Environment").
  bool use_deepspeed = false;
  bool multi_gpu = false;  // accelerate's --multi_gpu (tandem runs one process per slot anyway)
  std::string deepspeed_config_file;  // accelerate's --deepspeed_config_file, also the config file
  std::optional<int> zero_stage;
  std::string offload_optimizer_device;  // "none" or "cpu"; empty: not given
  std::string offload_param_device;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<double> gradient_clipping;
  // The config's debug: TANDEM_DEBUG=DETAIL for every worker (unless the
  // launcher's environment sets TANDEM_DEBUG itself).
  bool debug_detail = false;
  // What `accelerate launch` would export for this config and these flags
  // (accelerate_env.h): set for every worker.
  std::map<std::string, std::string> accelerate_env;
};

// --monitor-interval when given, else `default_s` (the mode's default).
inline double monitor_interval(const LaunchOptions& opts, double default_s) {
  return opts.monitor_interval_given ? opts.monitor_interval_s : default_s;
}

// Parses argv (argv[0] is "launch"). Options may be written with dashes or
// underscores (--nproc-per-node, --nproc_per_node) and as "--opt value" or
// "--opt=value". Everything from the first non-option argument (or after
// "--") is the program and its arguments. Throws UsageError on a malformed
// flag; sets *help_printed (and returns defaults) after printing --help.
// Does not check how the settings fit together: validate_launch_options().
LaunchOptions parse_launch_flags(int argc, char** argv, bool* help_printed);

// The config file to use: select_config_file() (--config-file, else
// $TANDEM_CONFIG_FILE, else tandem's default, then Accelerate's), made
// absolute; "" when there is none. Reads the file system only.
std::string choose_config_file(const LaunchOptions& opts, const ConfigEnv& env);

// Whether the nodes of this launch meet at the store to agree on node
// ranks: --rdzv-backend c10d, several nodes, no node rank and no --include.
bool rendezvous_at_store(const LaunchOptions& opts);

// Fills from `config` every launch setting no flag gave: num_processes (the
// total over all machines, as Accelerate counts; divided by the number of
// machines), num_machines, machine_rank, main_process_ip/port, and gpu_ids
// (as CUDA_VISIBLE_DEVICES). A GPU config (MULTI_GPU, or DEEPSPEED without
// use_cpu) with no num_processes, or `auto`, runs one process per GPU: per
// listed gpu_id, else per `local_gpus`; MULTI_CPU with `num_processes: auto`
// one per CPU the launcher may use. --include/--exclude take the place
// of both num_processes and gpu_ids; --standalone of the machine settings.
// Throws UsageError, naming the file, when num_processes does not split
// evenly over the machines.
void apply_launch_config(const Config& config, int local_gpus, LaunchOptions& opts);

// accelerate launch --use_deepspeed without --zero_stage: the config's
// stage when it gives one, else Accelerate's default, 2.
void default_zero_stage(const Config* config, LaunchOptions& opts);

// Checks that the settings fit together (a program, ranks in range, ...)
// and applies --standalone and --log-dir's implied --tee. Throws UsageError.
void validate_launch_options(LaunchOptions& opts);

// parse_launch_flags() then validate_launch_options(), with no config file.
LaunchOptions parse_launch_options(int argc, char** argv, bool* help_printed);

}  // namespace tandem::cli
