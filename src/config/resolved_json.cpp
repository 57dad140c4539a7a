// resolved_config_json(): the config as `tandem config check` prints it,
// with DeepSpeed's key names where DeepSpeed has them. Unknown values (a
// micro batch still "auto", a parameter the code will supply) are null.

#include <nlohmann/json.hpp>

#include "tandem/config/config.h"

namespace tandem {
namespace {

// The window the scaler will use: the file's, or the rule's own default.
int64_t effective_loss_scale_window(const LossScaleConfig& fp16) {
  return fp16.loss_scale_window.value_or(fp16.deepspeed_semantics ? 1000 : 2000);
}

using ResolvedJson = nlohmann::ordered_json;

template <typename T>
ResolvedJson or_null(const std::optional<T>& value) {
  return value ? ResolvedJson(*value) : ResolvedJson(nullptr);
}

ResolvedJson zero_json(const ZeroConfig& z) {
  ResolvedJson out;
  out["stage"] = z.stage;
  out["offload_optimizer"] = {{"device", to_string(z.offload_optimizer)},
                              {"pin_memory", z.offload_pin_memory}};
  out["offload_param"] = {{"device", to_string(z.offload_param)},
                          {"pin_memory", z.offload_param_pin_memory}};
  out["reduce_bucket_size"] = z.reduce_bucket_size;
  out["stage3_prefetch_bucket_size"] = z.stage3_prefetch_bucket_size;
  out["stage3_param_persistence_threshold"] = z.stage3_param_persistence_threshold;
  out["stage3_max_live_parameters"] = z.stage3_max_live_parameters;
  out["zero3_init"] = z.zero3_init;
  if (!z.auto_wrap_policy.empty()) {
    out["auto_wrap_policy"] = z.auto_wrap_policy;
    out["auto_wrap_min_num_params"] = z.auto_wrap_min_num_params;
    out["auto_wrap_layer_types"] = z.auto_wrap_layer_types;
  }
  out["allgather_bucket_size"] = z.allgather_bucket_size;
  out["reduce_scatter"] = z.reduce_scatter;
  out["overlap_comm"] = z.overlap_comm;
  out["stage3_gather_16bit_weights_on_model_save"] =
      or_null(z.gather_16bit_weights_on_model_save);
  // kHpzRanksPerHost (Accelerate's HYBRID_SHARD) prints as "ranks_per_host".
  if (z.hpz_partition_size == kHpzRanksPerHost) {
    out["zero_hpz_partition_size"] = "ranks_per_host";
  } else {
    out["zero_hpz_partition_size"] = z.hpz_partition_size;
  }
  return out;
}

ResolvedJson optimizer_json(const OptimizerConfig& o) {
  if (o.type.empty()) return nullptr;
  ResolvedJson params;
  params["lr"] = or_null(o.lr);
  const std::string& t = o.type;
  if (t == "SGD" || t == "RMSprop") params["momentum"] = or_null(o.momentum);
  if (t == "SGD") {
    params["dampening"] = or_null(o.dampening);
    params["nesterov"] = or_null(o.nesterov);
  }
  if (t == "Adam" || t == "AdamW" || t == "Lion" || t == "Lamb") {
    params["betas"] = ResolvedJson::array({or_null(o.beta1), or_null(o.beta2)});
  }
  if (t != "SGD" && t != "Lion") params["eps"] = or_null(o.eps);
  if (t == "Adagrad") {
    params["lr_decay"] = or_null(o.lr_decay);
    params["initial_accumulator_value"] = or_null(o.initial_accumulator_value);
  }
  if (t == "RMSprop") {
    params["alpha"] = or_null(o.alpha);
    params["centered"] = or_null(o.centered);
  }
  if (t == "Lamb") {
    params["bias_correction"] = or_null(o.bias_correction);
    params["eps_inside_sqrt"] = or_null(o.eps_inside_sqrt);
    params["max_coeff"] = or_null(o.max_coeff);
    params["min_coeff"] = or_null(o.min_coeff);
  }
  params["weight_decay"] = or_null(o.weight_decay);
  return {{"type", o.type}, {"params", params}};
}

ResolvedJson scheduler_json(const SchedulerConfig& s) {
  if (s.type.empty()) return nullptr;
  ResolvedJson params = ResolvedJson::object();
  for (const auto& [name, value] : s.params) {
    if (name == "cycle_momentum") params[name] = value != 0.0;
    else params[name] = value;
  }
  for (const auto& name : s.auto_params) params[name] = nullptr;
  if (!s.warmup_type.empty()) params["warmup_type"] = s.warmup_type;
  return {{"type", s.type}, {"params", params}};
}

}  // namespace

std::string resolved_config_json(const Config& c, int world_size) {
  ResolvedJson out;
  out["world_size"] = world_size;
  out["num_machines"] = c.num_machines;
  out["machine_rank"] = c.machine_rank;
  out["distributed_type"] = to_string(c.distributed_type);
  out["mixed_precision"] = to_string(c.mixed_precision);
  out["train_batch_size"] = or_null(c.train_batch_size);
  out["train_micro_batch_size_per_gpu"] = or_null(c.train_micro_batch_size_per_gpu);
  out["gradient_accumulation_steps"] = or_null(c.gradient_accumulation_steps);
  out["gradient_clipping"] = c.gradient_clipping;
  out["seed"] = or_null(c.seed);
  out["zero_optimization"] = zero_json(c.zero);
  out["optimizer"] = optimizer_json(c.optimizer);
  out["scheduler"] = scheduler_json(c.scheduler);
  out["fp16"] = {{"enabled", c.mixed_precision == MixedPrecision::kFp16},
                 {"loss_scale", c.fp16.loss_scale},
                 {"initial_scale_power", c.fp16.initial_scale_power},
                 {"loss_scale_window", effective_loss_scale_window(c.fp16)},
                 {"hysteresis", c.fp16.hysteresis},
                 {"consecutive_hysteresis", c.fp16.consecutive_hysteresis},
                 {"min_loss_scale", c.fp16.min_loss_scale},
                 {"deepspeed_semantics", c.fp16.deepspeed_semantics}};
  out["bf16"] = {{"enabled", c.mixed_precision == MixedPrecision::kBf16}};
  out["ddp"] = {{"bucket_cap_mb", c.ddp.bucket_cap_mb},
                {"first_bucket_cap_mb", c.ddp.first_bucket_cap_mb},
                {"find_unused_parameters", c.ddp.find_unused_parameters},
                {"broadcast_buffers", c.ddp.broadcast_buffers},
                {"comm_hook", c.ddp.comm_hook},
                {"cache_cpu_allocations", c.ddp.cache_cpu_allocations},
                {"static_graph", c.ddp.static_graph},
                {"powersgd",
                 {{"matrix_approximation_rank", c.ddp.powersgd.matrix_approximation_rank},
                  {"start_powerSGD_iter", c.ddp.powersgd.start_powerSGD_iter},
                  {"min_compression_rate", c.ddp.powersgd.min_compression_rate},
                  {"use_error_feedback", c.ddp.powersgd.use_error_feedback},
                  {"warm_start", c.ddp.powersgd.warm_start},
                  {"orthogonalization_epsilon", c.ddp.powersgd.orthogonalization_epsilon},
                  {"random_seed", c.ddp.powersgd.random_seed}}}};
  out["activation_checkpointing"] = {{"enabled", c.activation_checkpointing.enabled}};
  out["cuda_graph"] = {{"enabled", c.cuda_graph.enabled},
                       {"warmup_steps", c.cuda_graph.warmup_steps},
                       {"max_captures", c.cuda_graph.max_captures}};
  out["preemption"] = {{"enabled", c.preemption.enabled},
                       {"signals", c.preemption.signals},
                       {"checkpoint_dir", c.preemption.checkpoint_dir},
                       {"save", c.preemption.save},
                       {"requeue", c.preemption.requeue}};
  out["enable_cpu_affinity"] = c.enable_cpu_affinity;
  out["debug"] = c.debug;
  out["wall_clock_breakdown"] = c.wall_clock_breakdown;
  out["steps_per_print"] = or_null(c.steps_per_print);
  out["launch"] = {{"num_processes", or_null(c.num_processes)},
                   {"main_process_ip", c.main_process_ip.empty() ? ResolvedJson(nullptr)
                                                                 : ResolvedJson(c.main_process_ip)},
                   {"main_process_port", or_null(c.main_process_port)},
                   {"gpu_ids", c.gpu_ids},
                   {"use_cpu", c.use_cpu},
                   {"rdzv_backend", c.rdzv_backend}};
  out["source"] = {{"path", c.source_path.empty() ? ResolvedJson(nullptr) : ResolvedJson(c.source_path)},
                   {"format", to_string(c.format)}};
  out["warnings"] = c.warnings;
  out["auto"] = c.auto_keys;
  // A YAML string may hold any bytes (gpu_ids: "\xe9"); print those as
  // U+FFFD rather than throw nlohmann's type_error.
  return out.dump(2, ' ', false, ResolvedJson::error_handler_t::replace);
}

}  // namespace tandem
