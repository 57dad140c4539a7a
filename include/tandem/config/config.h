#pragma once
// The training configuration: one typed model read from three file formats.
//
//   * tandem's own YAML (the format `tandem config` writes);
//   * HF Accelerate's default_config.yaml (`distributed_type: MULTI_GPU`, ...),
//     with its optional `deepspeed_config` section or `deepspeed_config_file`;
//   * a DeepSpeed JSON config (`train_batch_size`, `zero_optimization`, ...).
//
// Precedence, highest first: command-line flags, environment, config file,
// defaults; code overrides given to the Accelerator count as the highest.
// Values a file leaves as "auto" (as DeepSpeed allows) stay empty here and are
// filled in by resolve_config() or, later, by the Accelerator from code.
//
// Plain data: copyable, no hidden state, safe to share between threads once
// built. Nothing here reads the process environment except
// ConfigEnv::from_environment(), which a program calls once at start-up.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tandem {

enum class MixedPrecision { kNo, kBf16, kFp16 };

// "no", "bf16", "fp16".
const char* to_string(MixedPrecision mode);
// Accepts "no", "bf16", "fp16" (any case). Throws UsageError naming the
// accepted values otherwise.
MixedPrecision parse_mixed_precision(const std::string& text);

// Accelerate's distributed_type values that tandem runs. DEEPSPEED and FSDP
// both train with the ZeRO settings of ZeroConfig (an Accelerate file's
// fsdp_config maps onto them: docs/config.md, "FSDP"); the type itself only
// tells the launcher that the job wants one process per GPU.
enum class DistributedType { kNo, kMultiCpu, kMultiGpu, kDeepSpeed, kFsdp };
// "NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP".
const char* to_string(DistributedType type);
// Accepts those five names (any case). Throws UsageError naming them, and
// saying so for Accelerate types tandem does not run (XLA, TP, ...).
DistributedType parse_distributed_type(const std::string& text);

enum class OffloadDevice { kNone, kCpu };
// "none", "cpu".
const char* to_string(OffloadDevice device);

// Which file format a config came from.
enum class ConfigFormat { kDefaults, kTandemYaml, kAccelerateYaml, kDeepSpeedJson };
// "defaults", "tandem_yaml", "accelerate_yaml", "deepspeed_json".
const char* to_string(ConfigFormat format);

// DeepSpeed's fp16 block. Used by the loss scaler.
struct LossScaleConfig {
  double loss_scale = 0;  // 0: dynamic; > 0: static scale
  int initial_scale_power = 16;
  // Clean steps before the scale grows. Empty (not given, or null): 1000
  // under DeepSpeed's rule, torch's 2000 under GradScaler's.
  std::optional<int64_t> loss_scale_window;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
  // True when the values came from a DeepSpeed fp16 block: the scaler then
  // follows DeepSpeed's DynamicLossScaler instead of torch's GradScaler.
  bool deepspeed_semantics = false;
};

// DeepSpeed's zero_optimization block (stages 1-3: tandem::ZeroOptimizer):
// the keys tandem implements. The others warn (`tandem config keys`).
struct ZeroConfig {
  int stage = 0;  // 0: plain data parallel (DDP)
  OffloadDevice offload_optimizer = OffloadDevice::kNone;
  OffloadDevice offload_param = OffloadDevice::kNone;
  bool offload_pin_memory = true;        // offload_optimizer.pin_memory
  bool offload_param_pin_memory = true;  // offload_param.pin_memory
  int64_t reduce_bucket_size = 500'000'000;  // elements, as DeepSpeed counts
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;
  bool zero3_init = false;  // Accelerate's zero3_init_flag
  // Elements per all-gather of updated partitions (ZeroOptions).
  int64_t allgather_bucket_size = 500'000'000;
  // False: gradients are all-reduced, and each rank keeps its slice, instead
  // of being reduce-scattered (ZeroOptions::reduce_scatter).
  bool reduce_scatter = true;
  // False: gradient reductions start after backward instead of during it.
  // tandem's default is true at every stage (DeepSpeed's is false for
  // stages 1 and 2).
  bool overlap_comm = true;
  // stage3_gather_16bit_weights_on_model_save (Accelerate's
  // zero3_save_16bit_model): empty when not given. True: save_model under
  // ZeRO-3 writes the gathered weights in the 16-bit training dtype; false:
  // save_model under ZeRO-3 refuses, as Accelerate does.
  std::optional<bool> gather_16bit_weights_on_model_save;
  // HSDP (stages 2 and 3): shard inside groups of this many consecutive
  // ranks and replicate across the groups (DeepSpeed's
  // zero_hpz_partition_size). 1: off, plain ZeRO over the world;
  // kHpzRanksPerHost: the launcher's ranks per host (Accelerate's
  // fsdp_sharding_strategy HYBRID_SHARD and HYBRID_SHARD_ZERO2; tandem
  // YAML's `zero_hpz_partition_size: ranks_per_host`).
  int hpz_partition_size = 1;
  // Stage 3 units chosen by a policy besides the tandem::Sharded ones
  // (Accelerate's fsdp_auto_wrap_policy; ZeroOptions::auto_wrap): "" or
  // "NO_WRAP" (none), "SIZE_BASED_WRAP" (units of at least
  // auto_wrap_min_num_params parameters; 0, Accelerate's default, wraps
  // nothing) or "TRANSFORMER_BASED_WRAP" (modules whose type is named in
  // auto_wrap_layer_types, fsdp_transformer_layer_cls_to_wrap).
  std::string auto_wrap_policy;
  int64_t auto_wrap_min_num_params = 0;
  std::vector<std::string> auto_wrap_layer_types;
};
inline constexpr int kHpzRanksPerHost = 0;

// DeepSpeed's `optimizer` block. Empty type: the program builds its own.
// Parameters given as "auto" (or absent) stay empty; the Accelerator fills
// them from the optimizer the code passes, or from torch's defaults.
struct OptimizerConfig {
  // canonical: "Adam", "AdamW", "SGD", "Adagrad", "RMSprop", "Lion", "Lamb"
  std::string type;
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<double> eps;
  std::optional<double> momentum;  // SGD, RMSprop
  std::optional<double> dampening;  // SGD
  std::optional<bool> nesterov;     // SGD
  std::optional<double> beta1;     // Adam, AdamW, Lion, Lamb
  std::optional<double> beta2;
  std::optional<double> lr_decay;                   // Adagrad
  std::optional<double> initial_accumulator_value;  // Adagrad
  std::optional<double> alpha;                      // RMSprop
  std::optional<bool> centered;                     // RMSprop
  std::optional<bool> bias_correction;              // Lamb
  std::optional<bool> eps_inside_sqrt;              // Lamb
  std::optional<double> max_coeff;                  // Lamb
  std::optional<double> min_coeff;                  // Lamb
};

// DeepSpeed's `scheduler` block: "WarmupLR", "WarmupDecayLR",
// "WarmupCosineLR" or "OneCycle", with DeepSpeed's parameter names.
struct SchedulerConfig {
  std::string type;  // empty: no scheduler from the config
  std::map<std::string, double> params;  // numeric parameters that were given
  std::set<std::string> auto_params;      // parameters given as "auto"
  std::string warmup_type;                // "log" or "linear"; empty: the default
};

// The PowerSGD hook's hyperparameters (tandem YAML `ddp.powersgd`; see
// PowerSGDOptions in tandem/parallel/powersgd_hook.h, same names and
// defaults), used when comm_hook is "powersgd".
struct PowerSGDConfig {
  int64_t matrix_approximation_rank = 1;
  int64_t start_powerSGD_iter = 1000;
  double min_compression_rate = 2.0;
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0.0;
  uint32_t random_seed = 0;
};

// tandem's own DDP settings (tandem YAML only; see DDPOptions).
struct DdpConfig {
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;
  std::string comm_hook = "none";  // "none", "fp16", "bf16", "powersgd"
  bool cache_cpu_allocations = false;  // DDPOptions::cache_cpu_allocations
  bool static_graph = false;           // DDPOptions::static_graph
  PowerSGDConfig powersgd;
};

// DeepSpeed's activation_checkpointing block. The block being present turns
// checkpointing on for the blocks the program marked with
// tandem::Checkpointed<Impl> (tandem/parallel/activation_checkpoint.h;
// apply_activation_checkpointing() does it). Its sub-keys are accepted, and
// those that would change something in DeepSpeed (partition_activations,
// cpu_checkpointing, contiguous_memory_optimization,
// synchronize_checkpoint_boundary, profile set to true) add a warning:
// tandem does not implement them.
struct ActivationCheckpointingConfig {
  bool enabled = false;
};

// tandem's cuda_graph block: capture whole training steps as CUDA graphs
// (Accelerator::train_step, tandem/accelerate/train_step.h).
struct CudaGraphConfig {
  bool enabled = false;
  // Optimizer steps run eagerly before the first capture; at least 1.
  int64_t warmup_steps = 3;
  // Distinct batch shapes captured at most; one more is refused.
  int64_t max_captures = 4;
};

// tandem's preemption block: on a signal (Slurm's `--signal` warning before
// a time limit, `scancel --signal`, a preemption's SIGTERM), every rank
// finishes its optimizer step, the ranks agree on the step through one
// collective, save a checkpoint there, the main process requeues the Slurm
// job where asked, and every process exits with kPreemptedExitCode
// (docs/slurm.md). Off by default.
struct PreemptionConfig {
  bool enabled = false;
  // The signals that start it, by name without "SIG": USR1, USR2, TERM,
  // INT, HUP. Default: USR1 (`sbatch --signal=B:USR1@60`) and TERM.
  std::vector<std::string> signals = {"USR1", "TERM"};
  // save_state()'s folder for the checkpoint; required while save is on.
  std::string checkpoint_dir;
  bool save = true;
  // Requeue the Slurm batch job (`scontrol requeue $SLURM_JOB_ID`) after
  // the save: "auto" in a Slurm batch job, "true" (refused outside Slurm),
  // "false".
  std::string requeue = "auto";
};

// The exit code of a process that stopped for preemption after its
// checkpoint was committed (EX_TEMPFAIL: try again later). `tandem launch`
// passes it on, and does not count it as a failure or restart on it.
inline constexpr int kPreemptedExitCode = 75;

// A DeepSpeed monitor block (tensorboard, csv_monitor): DeepSpeed's keys
// and defaults.
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;  // "": the working directory
  std::string job_name = "DeepSpeedJobName";
  // output_path/job_name, as DeepSpeed joins them (os.path.join).
  std::string dir() const {
    if (output_path.empty()) return job_name;
    return output_path.back() == '/' ? output_path + job_name : output_path + "/" + job_name;
  }
};

struct Config {
  ConfigFormat format = ConfigFormat::kDefaults;
  std::string source_path;  // the file read; empty for defaults

  // Where the job runs (Accelerate's launch keys).
  DistributedType distributed_type = DistributedType::kNo;
  std::optional<int> num_processes;  // total across machines, as Accelerate counts
  int num_machines = 1;
  int machine_rank = 0;
  std::string main_process_ip;          // empty: 127.0.0.1 / launcher default
  std::optional<int> main_process_port;
  std::string gpu_ids = "all";
  bool use_cpu = false;
  std::string rdzv_backend = "static";
  // Accelerate's multi-node DeepSpeed keys (deepspeed_config section): the
  // hostfile `tandem launch` fans out to, as with --hostfile, unless
  // deepspeed_multinode_launcher is `standard` (each machine runs its own
  // launcher); its --include / --exclude filters. Empty: not given.
  std::string deepspeed_hostfile;
  std::string deepspeed_inclusion_filter;
  std::string deepspeed_exclusion_filter;
  std::string deepspeed_multinode_launcher;

  // How it trains.
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  // DeepSpeed's torch_autocast without a dtype: torch.autocast's default for
  // the device, so mixed_precision (bf16, the CPU's) becomes fp16 when the
  // Accelerator trains on CUDA.
  bool autocast_device_default = false;
  // The batch triple; empty means "auto"/not given until resolve_config().
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  double gradient_clipping = 0;  // 0: no clipping
  std::optional<uint64_t> seed;
  LossScaleConfig fp16;
  ZeroConfig zero;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  DdpConfig ddp;
  ActivationCheckpointingConfig activation_checkpointing;
  CudaGraphConfig cuda_graph;
  PreemptionConfig preemption;
  // Accelerate's enable_cpu_affinity: `tandem launch` pins each local
  // worker to its own share of the launcher's CPUs.
  bool enable_cpu_affinity = false;
  // Accelerate's debug: `tandem launch` exports TANDEM_DEBUG=DETAIL, so that
  // every collective's fingerprint is checked.
  bool debug = false;
  // DeepSpeed's wall_clock_breakdown: the Accelerator times each optimizer
  // step's forward, backward, step and communication on every rank and
  // reports the averages (docs/accelerator.md, "Step time breakdown").
  bool wall_clock_breakdown = false;
  // DeepSpeed's steps_per_print (>= 1); empty when not given. Given, the
  // main process logs a progress line every this many optimizer steps. It
  // is also the breakdown's window: 10 steps when empty.
  std::optional<int64_t> steps_per_print;

  // DeepSpeed's tensorboard and csv_monitor blocks: the main process writes
  // what Accelerator::log() logs, and DeepSpeed's Train/Samples/lr,
  // loss_scale and train_loss after every optimizer step, to
  // output_path/job_name (docs/accelerator.md, "Trackers").
  MonitorConfig tensorboard;
  MonitorConfig csv_monitor;

  // One line per recognised key that tandem does not implement yet, e.g.
  // "deepspeed.json: 'zero_optimization.round_robin_gradients' is accepted
  // but not implemented yet; it has no effect". Logged once by the caller.
  std::vector<std::string> warnings;

  // Provenance, not settings (same_settings() ignores these):
  // Keys a file gave as "auto" whose field has a plain default rather than
  // an optional (gradient_clipping, fp16.enabled, bf16.enabled,
  // zero_optimization.reduce_bucket_size, .stage3_prefetch_bucket_size,
  // .stage3_param_persistence_threshold). The default applies until code
  // supplies a value, as HF's Trainer does from its own arguments.
  std::set<std::string> auto_keys;
  // Where each key given a value was read, "FILE:LINE:COL", by key path
  // ("zero_optimization.stage"), so that checks made after parsing
  // (resolve_config) can point into the file.
  std::map<std::string, std::string> key_locations;
};

// key_locations' entry for the DeepSpeed block (fp16, bf16 or
// torch_autocast) that enabled mixed precision: "FILE:LINE:COL (path)".
// resolve_config refuses a TANDEM_MIXED_PRECISION or code override that
// names the other half type, as Accelerate does.
inline constexpr const char* kDeepSpeedPrecisionKey = "deepspeed.mixed_precision";

// Why `text` cannot name the main process's host (main_process_ip,
// --master-addr, the wizard's answer): empty when it is a host name, a dotted
// IPv4 address or an IPv6 address. Otherwise what is wrong and how to fix
// it: an address with a port pasted on ("10.0.0.1:29500"; the port is
// main_process_port), an IPv4 address with a part over 255, a name with
// characters no host name has. Says nothing of whether the host exists.
std::string host_address_problem(const std::string& text);

// True when `a` and `b` hold the same settings: every field except format,
// source_path, warnings, auto_keys and key_locations. Doubles compare
// exactly.
bool same_settings(const Config& a, const Config& b);

// Reads a config file, choosing the format from its content: JSON is
// DeepSpeed; YAML with `distributed_type` or `compute_environment` is
// Accelerate; other YAML is tandem's. (JSON with one of those two keys is
// an Accelerate config saved as JSON, and is read as Accelerate's.) An
// Accelerate file's deepspeed_config_file is read relative to the YAML's
// folder. Recognised keys tandem does not implement add a line to
// Config::warnings; keys meaningless to tandem (Accelerate's tpu_*, debug,
// ...) are accepted silently. Thread-safe (reads only `path`).
// Throws UsageError with "FILE:LINE:COL: key.path: what is wrong; how to fix"
// (with a did-you-mean for misspelled keys) for malformed text, wrong types,
// zero or negative sizes, fp16 and bf16 both enabled, and unknown keys.
Config load_config_file(const std::string& path);

// Same from text, `name` standing in for the path in messages; relative
// deepspeed_config_file paths are taken from `base_dir`.
Config parse_config_text(const std::string& text, const std::string& name,
                         const std::string& base_dir = ".");

// Values from the environment, read once (see docs/config.md).
struct ConfigEnv {
  std::string config_file;                             // TANDEM_CONFIG_FILE
  std::optional<MixedPrecision> mixed_precision;       // TANDEM_MIXED_PRECISION
  std::optional<int64_t> gradient_accumulation_steps;  // TANDEM_GRADIENT_ACCUMULATION_STEPS
  std::optional<uint64_t> seed;                        // TANDEM_SEED
  // accelerate launch's --zero_stage, --offload_optimizer_device,
  // --offload_param_device and --gradient_clipping, as `tandem launch`
  // exports them.
  std::optional<int> zero_stage;                        // TANDEM_ZERO_STAGE (0-3)
  std::optional<OffloadDevice> offload_optimizer;       // TANDEM_OFFLOAD_OPTIMIZER_DEVICE
  std::optional<OffloadDevice> offload_param;           // TANDEM_OFFLOAD_PARAM_DEVICE
  std::optional<double> gradient_clipping;              // TANDEM_GRADIENT_CLIPPING (>= 0)
  std::string xdg_cache_home;                          // XDG_CACHE_HOME
  std::string home;                                    // HOME
  std::string hf_home;                                 // HF_HOME (Accelerate's cache root)

  static ConfigEnv from_environment();
  // Throws UsageError naming the variable when a value is malformed.
  static ConfigEnv from_map(const std::map<std::string, std::string>& vars);
};

// Settings that beat the file and the environment: the launcher's flags, or
// the Accelerator's code overrides.
struct ConfigOverrides {
  std::optional<MixedPrecision> mixed_precision;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  // Where train_micro_batch_size_per_gpu came from, for messages ("the data
  // loader's batch size"); empty: "code override".
  std::string train_micro_batch_size_source;
  std::optional<double> gradient_clipping;
  std::optional<int> zero_stage;
  std::optional<uint64_t> seed;
  std::optional<bool> wall_clock_breakdown;
  std::optional<int64_t> steps_per_print;  // >= 1
  std::optional<CudaGraphConfig> cuda_graph;
  std::optional<PreemptionConfig> preemption;
};

// Applies env then overrides on top of `file` (precedence as above), fills
// defaults, and infers the batch triple for `world_size` when two of the
// three are known (train = micro * accumulation * world). With one known,
// accumulation defaults to 1 (DeepSpeed's rule) and the third follows;
// with only accumulation or nothing known, accumulation defaults to 1 and
// the rest stays empty until the program supplies the micro batch.
// num_processes becomes `world_size`: the launch's world is the real one.
// Throws UsageError printing all four numbers when the triple is
// inconsistent, and for other contradictions: fp16 with use_cpu (the
// Accelerator refuses fp16 on the CPU), naming where each came from.
Config resolve_config(Config file, const ConfigEnv& env, const ConfigOverrides& overrides,
                      int world_size);

// The zero_optimization sizes Accelerate fills from the model's hidden size
// h when a file gives them as "auto": reduce_bucket_size h*h,
// stage3_prefetch_bucket_size int(0.9*h*h), stage3_param_persistence_threshold
// 10*h (accelerate's Accelerator._prepare_deepspeed).
struct HiddenSizeAutoSizes {
  int64_t reduce_bucket_size = 0;
  int64_t stage3_prefetch_bucket_size = 0;
  int64_t stage3_param_persistence_threshold = 0;
};
// Throws UsageError unless hidden_size >= 1 and h*h fits in 63 bits.
HiddenSizeAutoSizes hidden_size_auto_sizes(int64_t hidden_size);
// The three keys, "zero_optimization.reduce_bucket_size", ...
const std::vector<std::string>& hidden_size_auto_keys();
// Sets each of those keys that `config.auto_keys` holds to its
// hidden_size_auto_sizes() value and removes it from auto_keys; returns the
// keys it filled.
std::vector<std::string> fill_hidden_size_auto(Config& config, int64_t hidden_size);

// The resolved config as JSON (what `tandem config check` prints), with keys
// world_size, num_machines, machine_rank, mixed_precision ("no"/"bf16"/"fp16"),
// train_batch_size, train_micro_batch_size_per_gpu,
// gradient_accumulation_steps, zero_optimization.stage, and the rest.
std::string resolved_config_json(const Config& config, int world_size);

// tandem YAML for `config`, as `tandem config` and `tandem config default`
// write it; load_config_file() reads it back to an equal Config.
std::string to_tandem_yaml(const Config& config);

// $XDG_CACHE_HOME/tandem/default_config.yaml, or ~/.cache/tandem/... .
// Empty when neither XDG_CACHE_HOME nor HOME is set.
std::string default_config_path(const ConfigEnv& env);
// The config file a launcher should use when none is given: tandem's
// default if it exists, else Accelerate's
// ($XDG_CACHE_HOME or ~/.cache)/huggingface/accelerate/default_config.yaml;
// empty when neither exists. Like Accelerate, $HF_HOME/accelerate/ replaces
// the huggingface folder when HF_HOME is set.
std::string find_default_config(const ConfigEnv& env);
// The files find_default_config() looks for, in its order: tandem's
// default_config_path(), then Accelerate's; a path that cannot be formed
// (neither XDG_CACHE_HOME nor HOME set) is left out. For reports such as
// `tandem env`.
std::vector<std::string> default_config_candidates(const ConfigEnv& env);

// The config file to load: `flag_path` (a --config_file flag) when given,
// else TANDEM_CONFIG_FILE, else find_default_config(); empty for none.
// A path given by the flag or the variable is returned even if it does not
// exist, so that load_config_file() reports it.
std::string select_config_file(const std::string& flag_path, const ConfigEnv& env);

}  // namespace tandem
