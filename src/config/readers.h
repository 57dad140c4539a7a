#pragma once
// The readers of each format's schema, shared between formats: tandem YAML
// and Accelerate reuse DeepSpeed's zero_optimization, optimizer and
// scheduler blocks. Internal to the config layer.

#include <optional>
#include <string>
#include <vector>

#include "config/yaml_reader.h"
#include "tandem/config/config.h"

namespace tandem::config_detail {

// Who wrote a shared block: DeepSpeed's meaning, or tandem's own YAML.
enum class Dialect {
  kDeepSpeed,  // "Adam" means AdamW unless adam_w_mode is false, as in DeepSpeed
  kTandem,     // "Adam" means Adam; zero_optimization also takes zero3_init
};

// DeepSpeed's gradient_clipping when a config does not say (0.19.8's
// GRADIENT_CLIPPING_DEFAULT; also what Accelerate fills "auto" with).
inline constexpr double kDeepSpeedGradientClipping = 1.0;

// A DeepSpeed JSON document (its top-level object) into `config`.
// `accelerate_file`: the document is an Accelerate deepspeed_config_file,
// which Accelerate's DeepSpeedPlugin reads too, and refuses more of.
void read_deepspeed_document(const Value& root, Config& config, bool accelerate_file = false);
// DeepSpeed JSON text, e.g. an Accelerate deepspeed_config_file.
Config parse_deepspeed_text(const std::string& text, const std::string& name,
                            bool accelerate_file = false);

// Reads one of DeepSpeed's fp16 loss-scale keys (loss_scale,
// initial_scale_power, ...) into `scale`; false when `key` is not one.
bool read_loss_scale_key(const std::string& key, const Value& v, LossScaleConfig& scale);

void read_zero_optimization(const Value& block, Config& config, Dialect dialect);
// DeepSpeed's deprecated `"zero_optimization": true` (or false), which
// DeepSpeed still reads (read_zero_config_deprecated): whether `value` is one,
// and reading it as stage 1 (0) with the top-level `allgather_size` (null
// when absent) as the all-gather bucket, and a warning to write the block.
bool is_zero_optimization_flag(const Value& value);
void read_zero_optimization_flag(const Value& flag, const Value& allgather_size, Config& config);
// DeepSpeed's activation_checkpointing block: present (not null) turns it on;
// tandem YAML also takes `enabled`. Sub-keys tandem does not implement warn
// when set to true.
void read_activation_checkpointing(const Value& block, Config& config, Dialect dialect);
void read_optimizer(const Value& block, Config& config, Dialect dialect);
void read_scheduler(const Value& block, Config& config);

// An Accelerate config document; deepspeed_config_file is read relative
// to `base_dir`.
void read_accelerate_document(const Value& root, Config& config, const std::string& base_dir);

// An Accelerate fsdp_config section (distributed_type: FSDP) onto
// config.zero and config.activation_checkpointing (accelerate_fsdp.cpp;
// docs/config.md, "FSDP"). `parallelism` is the file's parallelism_config
// (null when absent): under FSDP2 its dp_replicate_size and dp_shard_size
// ask for HSDP.
void read_accelerate_fsdp(const Value& section, const Value& parallelism, Config& config);
// parallelism_config's dp_replicate_size / dp_shard_size under another
// distributed type: their product must be num_processes, and a shard size
// above 1 warns that it has no effect there (accelerate_fsdp.cpp).
void read_accelerate_data_parallel_sizes(const Value& parallelism, Config& config);

// Requests for model parallelism, which tandem does not do: Accelerate's
// parallelism_config and tp_config sections (`key` names the section), and
// DeepSpeed's tensor_parallel block and sequence_parallel_size (`key`). A
// tensor, context or sequence parallel size above 1 fails with a message
// saying what tandem does instead; sizes of 1 are accepted.
void read_accelerate_parallelism(const Value& section, const std::string& key);
void read_deepspeed_parallelism(const Value& value, const std::string& key);

// A tandem YAML document.
void read_tandem_document(const Value& root, Config& config);

// What a distributed_type text names: the type, or why it is not one.
struct DistributedTypeLookup {
  std::optional<DistributedType> type;
  std::string what;  // when empty `type`: "... is not supported by tandem"
  std::string fix;
};
DistributedTypeLookup lookup_distributed_type(const std::string& text);

// The DeepSpeed training keys tandem YAML reads alike: gradient_clipping
// ("auto" or a non-negative max norm), wall_clock_breakdown and
// steps_per_print (null or >= 1). Returns false for any other key.
bool read_shared_training_key(const std::string& key, const Value& value, Config& config);

// The launch keys Accelerate and tandem YAML share (num_processes,
// num_machines, machine_rank, main_process_ip, main_process_port, gpu_ids,
// use_cpu, rdzv_backend, mixed_precision). Returns false for
// any other key.
bool read_launch_key(const std::string& key, const Value& value, Config& config);
DistributedType read_distributed_type(const Value& value);
MixedPrecision read_mixed_precision(const Value& value);

// Checks shared by the formats with launch keys: machine_rank below
// num_machines, num_processes a multiple of num_machines. Errors point at
// the keys through Config::key_locations.
void check_launch_settings(const Config& config);

// "FILE:LINE:COL" where `path` was read, else the source name.
std::string location_of(const Config& config, const std::string& path);

// --- Key tables --------------------------------------------------------------
// The keys each reader accepts at one level of a file, exactly the tables it
// checks that level against. Static: each lives as long as the program.
// key_index.h lists them all, level by level.
const KeyTable& deepspeed_top_level_keys();
const KeyTable& deepspeed_fp16_keys();
const KeyTable& deepspeed_bf16_keys();  // also under the legacy name bfloat16
const KeyTable& deepspeed_torch_autocast_keys();
const KeyTable& deepspeed_monitor_keys();  // tensorboard and csv_monitor
// A tensorboard or csv_monitor block (DeepSpeed's keys; tandem YAML too).
void read_monitor(const Value& block, MonitorConfig& monitor);
const KeyTable& zero_optimization_keys(Dialect dialect);
// ZeroConfig::auto_wrap_policy from Accelerate's names (NO_WRAP reads as "").
std::string read_auto_wrap_policy(const Value& v);
// Layer type names from one comma-separated string, as Accelerate takes
// fsdp_transformer_layer_cls_to_wrap.
std::vector<std::string> read_layer_types(const Value& v);
const KeyTable& offload_keys(bool optimizer);  // offload_optimizer (true) or offload_param
const KeyTable& activation_checkpointing_keys(Dialect dialect);
const KeyTable& optimizer_keys();
// The optimizer and scheduler types tandem builds, in their canonical
// spelling; each selects its own params table.
const std::vector<std::string>& optimizer_types();
const KeyTable& optimizer_params_keys(const std::string& type);
const std::vector<std::string>& scheduler_types();
const KeyTable& scheduler_keys();
const KeyTable& scheduler_params_keys(const std::string& type);
const KeyTable& accelerate_top_level_keys();
const KeyTable& accelerate_deepspeed_section_keys();
const KeyTable& accelerate_fsdp_keys();  // fsdp_config, also its keys without fsdp_
const KeyTable& tandem_top_level_keys();
const KeyTable& tandem_fp16_keys();
const KeyTable& ddp_keys();
const KeyTable& cuda_graph_keys();
const KeyTable& preemption_keys();
const KeyTable& ddp_powersgd_keys();  // ddp.powersgd

}  // namespace tandem::config_detail
