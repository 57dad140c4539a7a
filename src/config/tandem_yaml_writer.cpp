// to_tandem_yaml(): every setting of a Config as tandem YAML, in the order
// docs/config.md describes them. Doubles are written in their shortest
// exact form so that reading the text back gives the same Config.

#include <algorithm>
#include <sstream>

#include "tandem/config/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tandem {
namespace {

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      // Control characters (a NUL, a newline) as YAML escapes: raw, they
      // would end or fold the line and not read back the same.
      out += fmt::format("\\x{:02x}", byte);
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string flag(bool value) { return value ? "true" : "false"; }

template <typename T>
std::string or_auto(const std::optional<T>& value) {
  return value ? fmt::format("{}", *value) : "auto";
}

template <typename T>
std::string yaml_or_null(const std::optional<T>& value) {
  return value ? fmt::format("{}", *value) : "null";
}

class Writer {
 public:
  explicit Writer(const Config& config) : config_(config) {}

  void line(int indent, const std::string& key, const std::string& value) {
    out_ << std::string(static_cast<size_t>(indent) * 2, ' ') << key << ":";
    if (!value.empty()) out_ << " " << value;
    out_ << "\n";
  }
  void comment(const std::string& text) { out_ << "# " << text << "\n"; }
  // A size that may have been "auto" in the file it came from.
  std::string size(const std::string& path, int64_t value) const {
    return auto_or(path, fmt::format("{}", value));
  }
  // `value`, or "auto" where the file it came from said so.
  std::string auto_or(const std::string& path, const std::string& value) const {
    return config_.auto_keys.count(path) ? "auto" : value;
  }
  std::string text() const { return out_.str(); }

 private:
  const Config& config_;
  std::ostringstream out_;
};

void write_launch(Writer& w, const Config& c) {
  w.comment("Where the job runs (the launcher's settings).");
  w.line(0, "distributed", to_string(c.distributed_type));
  w.line(0, "num_processes", or_auto(c.num_processes));
  w.line(0, "num_machines", fmt::format("{}", c.num_machines));
  w.line(0, "machine_rank", fmt::format("{}", c.machine_rank));
  w.line(0, "main_process_ip", c.main_process_ip.empty() ? "null" : quote(c.main_process_ip));
  w.line(0, "main_process_port", yaml_or_null(c.main_process_port));
  w.line(0, "gpu_ids", quote(c.gpu_ids));
  w.line(0, "use_cpu", flag(c.use_cpu));
  w.line(0, "rdzv_backend", quote(c.rdzv_backend));
  w.line(0, "enable_cpu_affinity", flag(c.enable_cpu_affinity));
  w.line(0, "debug", flag(c.debug));
}

void write_training(Writer& w, const Config& c) {
  w.comment("How it trains.");
  w.line(0, "mixed_precision", quote(to_string(c.mixed_precision)));
  w.line(0, "train_batch_size", or_auto(c.train_batch_size));
  w.line(0, "train_micro_batch_size_per_gpu", or_auto(c.train_micro_batch_size_per_gpu));
  w.line(0, "gradient_accumulation_steps", or_auto(c.gradient_accumulation_steps));
  w.line(0, "gradient_clipping", c.auto_keys.count("gradient_clipping")
                                     ? "auto"
                                     : fmt::format("{}", c.gradient_clipping));
  w.line(0, "seed", yaml_or_null(c.seed));
  w.line(0, "wall_clock_breakdown", flag(c.wall_clock_breakdown));
  w.line(0, "steps_per_print", yaml_or_null(c.steps_per_print));

  w.line(0, "fp16", "");
  w.line(1, "loss_scale", fmt::format("{}", c.fp16.loss_scale));
  w.line(1, "initial_scale_power", fmt::format("{}", c.fp16.initial_scale_power));
  w.line(1, "loss_scale_window", yaml_or_null(c.fp16.loss_scale_window));
  w.line(1, "hysteresis", fmt::format("{}", c.fp16.hysteresis));
  w.line(1, "consecutive_hysteresis", flag(c.fp16.consecutive_hysteresis));
  w.line(1, "min_loss_scale", fmt::format("{}", c.fp16.min_loss_scale));
  w.line(1, "deepspeed_semantics", flag(c.fp16.deepspeed_semantics));

  w.comment("Checkpoint the blocks the program marks (tandem::Checkpointed).");
  w.line(0, "activation_checkpointing", "");
  w.line(1, "enabled", flag(c.activation_checkpointing.enabled));

  w.comment("Capture whole training steps as CUDA graphs (Accelerator::train_step).");
  w.line(0, "cuda_graph", "");
  w.line(1, "enabled", flag(c.cuda_graph.enabled));
  w.line(1, "warmup_steps", fmt::format("{}", c.cuda_graph.warmup_steps));
  w.line(1, "max_captures", fmt::format("{}", c.cuda_graph.max_captures));

  w.comment("DeepSpeed's monitors: metrics under output_path/job_name (docs/config.md).");
  for (const auto& [name, monitor] : {std::pair<const char*, const MonitorConfig&>{
                                          "tensorboard", c.tensorboard},
                                      {"csv_monitor", c.csv_monitor}}) {
    w.line(0, name, "");
    w.line(1, "enabled", flag(monitor.enabled));
    w.line(1, "output_path", quote(monitor.output_path));
    w.line(1, "job_name", quote(monitor.job_name));
  }

  w.comment("On a signal, save a checkpoint at an agreed step and exit (docs/slurm.md).");
  w.line(0, "preemption", "");
  w.line(1, "enabled", flag(c.preemption.enabled));
  std::string signals;
  for (const auto& s : c.preemption.signals) signals += (signals.empty() ? "" : ", ") + s;
  w.line(1, "signals", "[" + signals + "]");
  w.line(1, "checkpoint_dir",
         c.preemption.checkpoint_dir.empty() ? "null" : quote(c.preemption.checkpoint_dir));
  w.line(1, "save", flag(c.preemption.save));
  w.line(1, "requeue", c.preemption.requeue);
}

void write_zero(Writer& w, const Config& c) {
  const ZeroConfig& z = c.zero;
  const std::string p = "zero_optimization.";
  w.line(0, "zero_optimization", "");
  w.line(1, "stage", fmt::format("{}", z.stage));
  w.line(1, "offload_optimizer", "");
  w.line(2, "device", to_string(z.offload_optimizer));
  w.line(2, "pin_memory", flag(z.offload_pin_memory));
  w.line(1, "offload_param", "");
  w.line(2, "device", to_string(z.offload_param));
  w.line(2, "pin_memory", flag(z.offload_param_pin_memory));
  w.line(1, "reduce_bucket_size", w.size(p + "reduce_bucket_size", z.reduce_bucket_size));
  // The stage-3 limits: below stage 3 they do nothing, and reading them
  // there warns, so they are written only where they were set.
  const ZeroConfig defaults;
  const auto limit = [&](const char* key, int64_t value, int64_t fallback) {
    if (z.stage >= 3 || value != fallback || c.auto_keys.count(p + key)) {
      w.line(1, key, w.size(p + key, value));
    }
  };
  limit("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size,
        defaults.stage3_prefetch_bucket_size);
  limit("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold,
        defaults.stage3_param_persistence_threshold);
  limit("stage3_max_live_parameters", z.stage3_max_live_parameters,
        defaults.stage3_max_live_parameters);
  w.line(1, "zero3_init", flag(z.zero3_init));
  // Stage-3 units by policy (Accelerate's fsdp_auto_wrap_policy), when set.
  if (!z.auto_wrap_policy.empty()) w.line(1, "auto_wrap_policy", z.auto_wrap_policy);
  if (z.auto_wrap_min_num_params != 0) {
    w.line(1, "auto_wrap_min_num_params", fmt::format("{}", z.auto_wrap_min_num_params));
  }
  if (!z.auto_wrap_layer_types.empty()) {
    w.line(1, "auto_wrap_layer_types",
           "\"" + fmt::format("{}", fmt::join(z.auto_wrap_layer_types, ",")) + "\"");
  }
  w.line(1, "allgather_bucket_size", fmt::format("{}", z.allgather_bucket_size));
  w.line(1, "reduce_scatter", flag(z.reduce_scatter));
  w.line(1, "overlap_comm", flag(z.overlap_comm));
  if (z.gather_16bit_weights_on_model_save) {
    w.line(1, "stage3_gather_16bit_weights_on_model_save",
           flag(*z.gather_16bit_weights_on_model_save));
  }
  // kHpzRanksPerHost (FSDP's HYBRID_SHARD) has no number: the launch decides.
  w.line(1, "zero_hpz_partition_size", z.hpz_partition_size == kHpzRanksPerHost
                                           ? std::string("ranks_per_host")
                                           : fmt::format("{}", z.hpz_partition_size));
}

// Only the parameters the type takes (the reader refuses the others).
void write_optimizer(Writer& w, const OptimizerConfig& o) {
  if (o.type.empty()) return;
  w.line(0, "optimizer", "");
  w.line(1, "type", o.type);
  w.line(1, "params", "");
  w.line(2, "lr", or_auto(o.lr));
  const std::string& t = o.type;
  if (t == "SGD" || t == "RMSprop") w.line(2, "momentum", or_auto(o.momentum));
  if (t == "Adam" || t == "AdamW" || t == "Lion" || t == "Lamb") {
    w.line(2, "betas", o.beta1 || o.beta2 ? "[" + or_auto(o.beta1) + ", " + or_auto(o.beta2) + "]"
                                           : "auto");
  }
  if (t != "SGD" && t != "Lion") w.line(2, "eps", or_auto(o.eps));
  if (t == "Adagrad") {
    w.line(2, "lr_decay", or_auto(o.lr_decay));
    w.line(2, "initial_accumulator_value", or_auto(o.initial_accumulator_value));
  }
  if (t == "RMSprop") w.line(2, "alpha", or_auto(o.alpha));
  if (t == "Lamb") {
    w.line(2, "max_coeff", or_auto(o.max_coeff));
    w.line(2, "min_coeff", or_auto(o.min_coeff));
  }
  // Switches: written when set (a switch has no "auto").
  if (o.dampening) w.line(2, "dampening", fmt::format("{}", *o.dampening));
  if (o.nesterov) w.line(2, "nesterov", flag(*o.nesterov));
  if (o.centered) w.line(2, "centered", flag(*o.centered));
  if (o.bias_correction) w.line(2, "bias_correction", flag(*o.bias_correction));
  if (o.eps_inside_sqrt) w.line(2, "eps_inside_sqrt", flag(*o.eps_inside_sqrt));
  w.line(2, "weight_decay", or_auto(o.weight_decay));
}

void write_scheduler(Writer& w, const SchedulerConfig& s) {
  if (s.type.empty()) return;
  w.line(0, "scheduler", "");
  w.line(1, "type", s.type);
  w.line(1, "params", s.params.empty() && s.auto_params.empty() && s.warmup_type.empty() ? "{}"
                                                                                          : "");
  for (const auto& [name, value] : s.params) {
    w.line(2, name, name == "cycle_momentum" ? flag(value != 0.0) : fmt::format("{}", value));
  }
  for (const auto& name : s.auto_params) w.line(2, name, "auto");
  if (!s.warmup_type.empty()) w.line(2, "warmup_type", s.warmup_type);
}

void write_ddp(Writer& w, const DdpConfig& d) {
  w.comment("tandem's DDP (used when zero_optimization.stage is 0).");
  w.line(0, "ddp", "");
  w.line(1, "bucket_cap_mb", fmt::format("{}", d.bucket_cap_mb));
  w.line(1, "first_bucket_cap_mb", fmt::format("{}", d.first_bucket_cap_mb));
  w.line(1, "find_unused_parameters", flag(d.find_unused_parameters));
  w.line(1, "broadcast_buffers", flag(d.broadcast_buffers));
  w.line(1, "comm_hook", quote(d.comm_hook));
  w.line(1, "cache_cpu_allocations", flag(d.cache_cpu_allocations));
  w.line(1, "static_graph", flag(d.static_graph));
  if (d.comm_hook != "powersgd") return;
  const PowerSGDConfig& p = d.powersgd;
  w.line(1, "powersgd", "");
  w.line(2, "matrix_approximation_rank", fmt::format("{}", p.matrix_approximation_rank));
  w.line(2, "start_powerSGD_iter", fmt::format("{}", p.start_powerSGD_iter));
  w.line(2, "min_compression_rate", fmt::format("{}", p.min_compression_rate));
  w.line(2, "use_error_feedback", flag(p.use_error_feedback));
  w.line(2, "warm_start", flag(p.warm_start));
  w.line(2, "orthogonalization_epsilon", fmt::format("{}", p.orthogonalization_epsilon));
  w.line(2, "random_seed", fmt::format("{}", p.random_seed));
}

}  // namespace

std::string to_tandem_yaml(const Config& config) {
  Writer w(config);
  w.comment("tandem config; docs/config.md describes every key.");
  w.comment("Precedence: command-line flags > TANDEM_* environment > this file > defaults.");
  write_launch(w, config);
  write_training(w, config);
  write_zero(w, config);
  write_optimizer(w, config.optimizer);
  write_scheduler(w, config.scheduler);
  write_ddp(w, config.ddp);
  return w.text();
}

}  // namespace tandem
