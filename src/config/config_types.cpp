// Names of the config enums, and comparison of settings.

#include <cctype>

#include "config/did_you_mean.h"
#include "config/readers.h"
#include "tandem/config/config.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

std::string upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace

const char* to_string(MixedPrecision mode) {
  switch (mode) {
    case MixedPrecision::kNo: return "no";
    case MixedPrecision::kBf16: return "bf16";
    case MixedPrecision::kFp16: return "fp16";
  }
  return "?";
}

MixedPrecision parse_mixed_precision(const std::string& text) {
  std::string key = upper(text);
  if (key == "NO") return MixedPrecision::kNo;
  if (key == "BF16") return MixedPrecision::kBf16;
  if (key == "FP16") return MixedPrecision::kFp16;
  TANDEM_THROW(UsageError, "mixed precision '{}' is not valid; use \"no\", \"bf16\" or \"fp16\"",
               text);
}

const char* to_string(DistributedType type) {
  switch (type) {
    case DistributedType::kNo: return "NO";
    case DistributedType::kMultiCpu: return "MULTI_CPU";
    case DistributedType::kMultiGpu: return "MULTI_GPU";
    case DistributedType::kDeepSpeed: return "DEEPSPEED";
    case DistributedType::kFsdp: return "FSDP";
  }
  return "?";
}

DistributedType parse_distributed_type(const std::string& text) {
  config_detail::DistributedTypeLookup found = config_detail::lookup_distributed_type(text);
  if (!found.type) TANDEM_THROW(UsageError, "distributed_type: {}; {}", found.what, found.fix);
  return *found.type;
}

const char* to_string(OffloadDevice device) {
  return device == OffloadDevice::kCpu ? "cpu" : "none";
}

const char* to_string(ConfigFormat format) {
  switch (format) {
    case ConfigFormat::kDefaults: return "defaults";
    case ConfigFormat::kTandemYaml: return "tandem_yaml";
    case ConfigFormat::kAccelerateYaml: return "accelerate_yaml";
    case ConfigFormat::kDeepSpeedJson: return "deepspeed_json";
  }
  return "?";
}

namespace config_detail {

DistributedTypeLookup lookup_distributed_type(const std::string& text) {
  static const std::vector<std::pair<std::string, DistributedType>> supported = {
      {"NO", DistributedType::kNo},
      {"MULTI_CPU", DistributedType::kMultiCpu},
      {"MULTI_GPU", DistributedType::kMultiGpu},
      {"DEEPSPEED", DistributedType::kDeepSpeed},
      {"FSDP", DistributedType::kFsdp}};
  std::vector<std::string> names;
  for (const auto& entry : supported) {
    if (entry.first == upper(text)) return {entry.second, "", ""};
    names.push_back(entry.first);
  }
  const std::string key = upper(text);
  if (key == "TP" || key == "MEGATRON_LM") {
    return {std::nullopt,
            "Accelerate's " + key + " is not supported by tandem, which trains data parallel "
            "only (no tensor or pipeline parallelism)",
            "use DEEPSPEED with zero_stage 3 to shard a model that does not fit on one GPU, or "
            "MULTI_GPU"};
  }
  static const std::vector<std::string> other_devices = {
      "XLA", "TPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
      "MULTI_HPU", "MPS"};
  for (const auto& name : other_devices) {
    if (name == key) {
      return {std::nullopt,
              "Accelerate's " + name + " is not supported by tandem, which runs on CPUs and "
              "CUDA GPUs",
              "use " + join_alternatives(names)};
    }
  }
  std::string guess = closest_candidate(text, names);
  return {std::nullopt, "unknown distributed_type \"" + text + "\"",
          guess.empty() ? "use " + join_alternatives(names) : "did you mean " + guess + "?"};
}

}  // namespace config_detail

namespace {

bool same(const LossScaleConfig& a, const LossScaleConfig& b) {
  return a.loss_scale == b.loss_scale && a.initial_scale_power == b.initial_scale_power &&
         a.loss_scale_window == b.loss_scale_window && a.hysteresis == b.hysteresis &&
         a.consecutive_hysteresis == b.consecutive_hysteresis &&
         a.min_loss_scale == b.min_loss_scale && a.deepspeed_semantics == b.deepspeed_semantics;
}

bool same(const ZeroConfig& a, const ZeroConfig& b) {
  return a.stage == b.stage && a.offload_optimizer == b.offload_optimizer &&
         a.offload_param == b.offload_param && a.offload_pin_memory == b.offload_pin_memory &&
         a.offload_param_pin_memory == b.offload_param_pin_memory &&
         a.reduce_bucket_size == b.reduce_bucket_size &&
         a.stage3_prefetch_bucket_size == b.stage3_prefetch_bucket_size &&
         a.stage3_param_persistence_threshold == b.stage3_param_persistence_threshold &&
         a.stage3_max_live_parameters == b.stage3_max_live_parameters &&
         a.zero3_init == b.zero3_init && a.allgather_bucket_size == b.allgather_bucket_size &&
         a.reduce_scatter == b.reduce_scatter && a.overlap_comm == b.overlap_comm &&
         a.gather_16bit_weights_on_model_save == b.gather_16bit_weights_on_model_save &&
         a.hpz_partition_size == b.hpz_partition_size &&
         a.auto_wrap_policy == b.auto_wrap_policy &&
         a.auto_wrap_min_num_params == b.auto_wrap_min_num_params &&
         a.auto_wrap_layer_types == b.auto_wrap_layer_types;
}

bool same(const OptimizerConfig& a, const OptimizerConfig& b) {
  return a.type == b.type && a.lr == b.lr && a.weight_decay == b.weight_decay && a.eps == b.eps &&
         a.momentum == b.momentum && a.dampening == b.dampening && a.nesterov == b.nesterov &&
         a.beta1 == b.beta1 && a.beta2 == b.beta2 &&
         a.lr_decay == b.lr_decay && a.initial_accumulator_value == b.initial_accumulator_value &&
         a.alpha == b.alpha && a.centered == b.centered &&
         a.bias_correction == b.bias_correction && a.eps_inside_sqrt == b.eps_inside_sqrt &&
         a.max_coeff == b.max_coeff && a.min_coeff == b.min_coeff;
}

bool same(const SchedulerConfig& a, const SchedulerConfig& b) {
  return a.type == b.type && a.params == b.params && a.auto_params == b.auto_params &&
         a.warmup_type == b.warmup_type;
}

bool same(const MonitorConfig& a, const MonitorConfig& b) {
  return a.enabled == b.enabled && a.output_path == b.output_path && a.job_name == b.job_name;
}

bool same(const PowerSGDConfig& a, const PowerSGDConfig& b) {
  return a.matrix_approximation_rank == b.matrix_approximation_rank &&
         a.start_powerSGD_iter == b.start_powerSGD_iter &&
         a.min_compression_rate == b.min_compression_rate &&
         a.use_error_feedback == b.use_error_feedback && a.warm_start == b.warm_start &&
         a.orthogonalization_epsilon == b.orthogonalization_epsilon &&
         a.random_seed == b.random_seed;
}

bool same(const DdpConfig& a, const DdpConfig& b) {
  return a.bucket_cap_mb == b.bucket_cap_mb && a.first_bucket_cap_mb == b.first_bucket_cap_mb &&
         a.find_unused_parameters == b.find_unused_parameters &&
         a.broadcast_buffers == b.broadcast_buffers && a.comm_hook == b.comm_hook &&
         a.cache_cpu_allocations == b.cache_cpu_allocations &&
         a.static_graph == b.static_graph &&
         // PowerSGD's settings matter (and are written) only when it is the hook.
         (a.comm_hook != "powersgd" || same(a.powersgd, b.powersgd));
}

}  // namespace

bool same_settings(const Config& a, const Config& b) {
  return a.distributed_type == b.distributed_type && a.num_processes == b.num_processes &&
         a.num_machines == b.num_machines && a.machine_rank == b.machine_rank &&
         a.main_process_ip == b.main_process_ip && a.main_process_port == b.main_process_port &&
         a.gpu_ids == b.gpu_ids && a.use_cpu == b.use_cpu && a.rdzv_backend == b.rdzv_backend &&
         a.mixed_precision == b.mixed_precision &&
         a.autocast_device_default == b.autocast_device_default &&
         a.train_batch_size == b.train_batch_size &&
         a.train_micro_batch_size_per_gpu == b.train_micro_batch_size_per_gpu &&
         a.gradient_accumulation_steps == b.gradient_accumulation_steps &&
         a.gradient_clipping == b.gradient_clipping && a.seed == b.seed && same(a.fp16, b.fp16) &&
         same(a.zero, b.zero) && same(a.optimizer, b.optimizer) &&
         same(a.scheduler, b.scheduler) && same(a.ddp, b.ddp) &&
         a.activation_checkpointing.enabled == b.activation_checkpointing.enabled &&
         a.cuda_graph.enabled == b.cuda_graph.enabled &&
         a.cuda_graph.warmup_steps == b.cuda_graph.warmup_steps &&
         a.cuda_graph.max_captures == b.cuda_graph.max_captures &&
         a.preemption.enabled == b.preemption.enabled &&
         a.preemption.signals == b.preemption.signals &&
         a.preemption.checkpoint_dir == b.preemption.checkpoint_dir &&
         a.preemption.save == b.preemption.save && a.preemption.requeue == b.preemption.requeue &&
         a.enable_cpu_affinity == b.enable_cpu_affinity && a.debug == b.debug &&
         a.wall_clock_breakdown == b.wall_clock_breakdown &&
         a.steps_per_print == b.steps_per_print && same(a.tensorboard, b.tensorboard) &&
         same(a.csv_monitor, b.csv_monitor);
}

}  // namespace tandem
