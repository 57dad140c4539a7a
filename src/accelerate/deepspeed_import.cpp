// import_deepspeed_checkpoint (tandem/accelerate/deepspeed_import.h): the
// folder read by checkpoint/deepspeed_checkpoint.h, written in the layout
// and meta.json schema that Checkpointer::save_state writes
// (checkpoint_contents.cpp), as one rank's whole tensors: the fragment
// reader reshards them to any world and strategy on load.

#include "tandem/accelerate/deepspeed_import.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <set>

#include <ATen/ATen.h>

#include "checkpoint/deepspeed_checkpoint.h"
#include "tandem/amp/loss_scaler.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/version.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;
using detail::DeepSpeedCheckpoint;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

const Json* config_optimizer_params(const DeepSpeedCheckpoint& ds) {
  if (!ds.ds_config.contains("optimizer")) return nullptr;
  const auto& opt = ds.ds_config["optimizer"];
  return opt.contains("params") && opt["params"].is_object() ? &opt["params"] : nullptr;
}

// The tandem optimizer type of the checkpoint's optimizer.
std::string optimizer_type(const DeepSpeedCheckpoint& ds, const std::string& requested) {
  static const std::set<std::string> known = {"Adam",    "AdamW", "SGD", "Adagrad",
                                              "RMSprop", "Lion",  "Lamb"};
  if (!requested.empty()) {
    TANDEM_CHECK_ARG(known.count(requested), "optimizer type '{}': use one of Adam, AdamW, SGD, "
                                             "Adagrad, RMSprop, Lion, Lamb",
                     requested);
    return requested;
  }
  const Json group = ds.param_groups.empty() ? Json::object() : Json(ds.param_groups[0]);
  // torch >= 2.8 records it in Adam's and AdamW's groups.
  auto decoupled = [&](bool fallback) {
    return group.contains("decoupled_weight_decay") && group["decoupled_weight_decay"].is_boolean()
               ? group["decoupled_weight_decay"].get<bool>()
               : fallback;
  };
  const auto& config = ds.ds_config;
  if (config.contains("optimizer") && config["optimizer"].contains("type")) {
    const std::string type = config["optimizer"]["type"].get<std::string>();
    const std::string t = lower(type);
    const Json* params = config_optimizer_params(ds);
    if (t == "adam" || t == "adamw") {
      const bool w_mode = params != nullptr && params->contains("adam_w_mode")
                              ? (*params)["adam_w_mode"].get<bool>()
                              : true;  // DeepSpeed's default for both
      return decoupled(t == "adamw" || w_mode) ? "AdamW" : "Adam";
    }
    if (t == "sgd") return "SGD";
    if (t == "adagrad") return "Adagrad";
    if (t == "rmsprop") return "RMSprop";
    if (t == "lion") return "Lion";
    if (t == "lamb") return "Lamb";
    TANDEM_THROW(UsageError,
                 "the checkpoint's optimizer is DeepSpeed's '{}', whose state tandem does not "
                 "checkpoint; tandem imports Adam, AdamW, SGD, Adagrad, RMSprop, Lion and Lamb",
                 type);
  }
  // A client optimizer: by the hyperparameters its groups hold.
  auto has = [&](const char* k) { return group.contains(k); };
  if (has("betas") && has("amsgrad")) return decoupled(false) ? "AdamW" : "Adam";
  if (has("nesterov") && has("dampening")) return "SGD";
  if (has("lr_decay") && has("initial_accumulator_value")) return "Adagrad";
  if (has("alpha") && has("centered")) return "RMSprop";
  TANDEM_THROW(UsageError,
               "cannot tell the checkpoint's optimizer type: ds_config names none and its param "
               "groups hold {}; pass it (--optimizer-type Adam|AdamW|SGD|Adagrad|RMSprop|Lion|"
               "Lamb)",
               group.dump());
}

// The param groups in the schema optimizer_state.cpp reads for `type`: each
// value from the group, else ds_config's optimizer params, else torch's
// (or DeepSpeed's) default.
Json param_groups(const DeepSpeedCheckpoint& ds, const std::string& type) {
  const Json* params = config_optimizer_params(ds);
  Json defaults;
  if (type == "Adam" || type == "AdamW") {
    defaults = {{"lr", 1e-3}, {"betas", {0.9, 0.999}}, {"eps", 1e-8},
                {"weight_decay", type == "AdamW" ? 1e-2 : 0.0}, {"amsgrad", false}};
  } else if (type == "SGD") {
    defaults = {{"lr", 1e-3}, {"momentum", 0.0}, {"dampening", 0.0}, {"weight_decay", 0.0},
                {"nesterov", false}};
  } else if (type == "Adagrad") {
    defaults = {{"lr", 1e-2}, {"lr_decay", 0.0}, {"weight_decay", 0.0},
                {"initial_accumulator_value", 0.0}, {"eps", 1e-10}};
  } else if (type == "RMSprop") {
    defaults = {{"lr", 1e-2}, {"alpha", 0.99}, {"eps", 1e-8}, {"weight_decay", 0.0},
                {"momentum", 0.0}, {"centered", false}};
  } else if (type == "Lion") {
    defaults = {{"lr", 1e-4}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.0}};
  } else {
    defaults = {{"lr", 1e-3},         {"betas", {0.9, 0.999}},  {"eps", 1e-6},
                {"weight_decay", 0.0}, {"bias_correction", true}, {"eps_inside_sqrt", false},
                {"max_coeff", 10.0},  {"min_coeff", 0.01}};
  }
  Json out = Json::array();
  for (const auto& group : ds.param_groups) {
    if ((type == "Adam" || type == "AdamW") && group.contains("bias_correction") &&
        group["bias_correction"] == false) {
      TANDEM_THROW(UsageError, "the checkpoint's Adam runs without bias correction, which "
                               "torch::optim::Adam always applies; tandem cannot continue it");
    }
    Json g = Json::object();
    for (const auto& [key, fallback] : defaults.items()) {
      if (group.contains(key)) g[key] = group[key];
      else if (params != nullptr && params->contains(key)) g[key] = (*params)[key];
      else g[key] = fallback;
    }
    out.push_back(g);
  }
  return out;
}

// DeepSpeed's CPU Adagrad keeps torch's `sum` as exp_avg_sq; the others use
// torch's names.
std::string tandem_state_name(const std::string& type, const std::string& name) {
  return type == "Adagrad" && name == "exp_avg_sq" ? "sum" : name;
}

// The optimizer state names tandem keeps for `type`.
void check_state_names(const std::vector<std::string>& names, const std::string& type) {
  std::set<std::string> allowed;
  if (type == "Adam" || type == "AdamW") allowed = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  else if (type == "SGD") allowed = {"momentum_buffer"};
  else if (type == "Adagrad") allowed = {"sum"};
  else if (type == "RMSprop") allowed = {"square_avg", "momentum_buffer", "grad_avg"};
  else if (type == "Lion") allowed = {"exp_avg"};
  else allowed = {"exp_avg", "exp_avg_sq"};
  for (const auto& n : names) {
    TANDEM_CHECK_FILE(allowed.count(n), "the checkpoint's {} optimizer keeps state '{}', which "
                                   "tandem's {} does not have; it cannot be carried over",
                 type, n, type);
  }
}

Json scheduler_entries(const DeepSpeedCheckpoint& ds, const Json& groups) {
  Json out = Json::array();
  const Json& s = ds.lr_scheduler;
  if (s.is_null()) return out;
  TANDEM_CHECK_FILE(s.is_object(), "the checkpoint's lr_scheduler is {}, not a state_dict",
               s.dump());
  if (s.contains("last_batch_iteration")) {
    // DeepSpeed's schedulers (WarmupLR, WarmupDecayLR, WarmupCosineLR,
    // OneCycle, LRRangeTest), which tandem's mirror.
    const int64_t last = s["last_batch_iteration"].get<int64_t>();
    Json state = {{"last_batch_iteration", static_cast<double>(last)}};
    const std::string type = ds.ds_config.contains("scheduler")
                                 ? ds.ds_config["scheduler"].value("type", "")
                                 : "";
    if (type == "WarmupCosineLR") {
      // Its initial lrs are the optimizer's configured ones (not saved).
      const Json* params = config_optimizer_params(ds);
      for (std::size_t i = 0; i < groups.size(); ++i) {
        state["initial_lr." + std::to_string(i)] =
            params != nullptr && params->contains("lr") ? (*params)["lr"].get<double>()
                                                        : groups[i]["lr"].get<double>();
      }
    }
    out.push_back({{"steps", last + 1}, {"state", state}});
  } else if (s.contains("last_epoch")) {
    // A torch scheduler: tandem replays its step count.
    out.push_back({{"steps", s["last_epoch"].get<int64_t>()}});
  } else {
    TANDEM_THROW(CheckpointError, "the checkpoint's lr_scheduler state {} is neither "
                                  "DeepSpeed's nor torch's",
                 s.dump());
  }
  return out;
}

std::string mixed_precision(const DeepSpeedCheckpoint& ds) {
  auto enabled = [&](const char* key) {
    return ds.ds_config.contains(key) && ds.ds_config[key].is_object() &&
           ds.ds_config[key].value("enabled", false);
  };
  if (enabled("fp16") || ds.module_dtype == "F16") return "fp16";
  if (enabled("bf16") || ds.module_dtype == "BF16") return "bf16";
  return "no";
}

Json scaler_state(const DeepSpeedCheckpoint& ds, const std::string& precision) {
  Json out = {{"steps", static_cast<double>(ds.global_steps)},
              {"skipped_steps", static_cast<double>(ds.skipped_steps)},
              {"overflows_at_min_scale", 0.0},
              {"rule", 0.0}};
  if (precision != "fp16") {
    // bf16 and fp32 run unscaled: tandem's disabled scaler (a GradScaler
    // turned off) with GradScalerOptions' defaults.
    const GradScalerOptions defaults;
    out["scale"] = defaults.init_scale;
    out["growth_factor"] = defaults.growth_factor;
    out["backoff_factor"] = defaults.backoff_factor;
    out["growth_interval"] = static_cast<double>(defaults.growth_interval);
    out["growth_tracker"] = 0.0;
    return out;
  }
  const Json& s = ds.loss_scaler;
  const std::string cls = s.value("__class__", "");
  const double scale = s.value("cur_scale", 1.0);
  if (cls.size() >= 17 && cls.substr(cls.size() - 17) == "DynamicLossScaler") {
    out["rule"] = 3.0;
    out["scale"] = scale;
    out["cur_iter"] = s.value("cur_iter", 0.0);
    out["last_overflow_iter"] = s.value("last_overflow_iter", -1.0);
    out["cur_hysteresis"] = s.value("cur_hysteresis", 1.0);
  } else {
    out["rule"] = 1.0;
    out["scale"] = scale;
  }
  return out;
}

at::Tensor flat(const at::Tensor& t) { return t.contiguous().reshape({-1}); }

DeepSpeedImportResult import_folder(const std::string& source_dir, const std::string& out_dir,
                                    const DeepSpeedImportOptions& options);

}  // namespace

bool is_deepspeed_checkpoint(const std::string& path) {
  return detail::is_deepspeed_checkpoint(path);
}

DeepSpeedImportResult import_deepspeed_checkpoint(const std::string& source_dir,
                                                  const std::string& out_dir,
                                                  const DeepSpeedImportOptions& options) {
  try {
    return import_folder(source_dir, out_dir, options);
  } catch (const nlohmann::json::exception& e) {
    // A record of an unexpected type (a string where a number belongs...).
    TANDEM_THROW(CheckpointError,
                 "'{}' is not a DeepSpeed checkpoint tandem can read: a record has an "
                 "unexpected type ({}); nothing was written",
                 source_dir, e.what());
  }
}

namespace {

DeepSpeedImportResult import_folder(const std::string& source_dir, const std::string& out_dir,
                                    const DeepSpeedImportOptions& options) {
  const DeepSpeedCheckpoint ds = detail::read_deepspeed_checkpoint(source_dir, options.tag);
  DeepSpeedImportResult result;
  result.tag = ds.tag;
  result.zero_stage = ds.zero_stage;
  result.world_size = ds.world_size;
  result.step = ds.global_steps;
  result.not_carried = ds.not_carried;
  result.optimizer_type = optimizer_type(ds, options.optimizer_type);
  const std::string& type = result.optimizer_type;
  const std::string precision = mixed_precision(ds);

  std::vector<std::string> state_names;
  Json params = Json::array();
  Json param_steps = Json::object();
  CheckpointTensors tensors;
  for (const auto& p : ds.parameters) {
    const bool trainable = p.group >= 0;
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"dtype", safetensors_dtype_name(p.value.scalar_type())},
                      {"trainable", trainable}});
    tensors.emplace_back(fragment_key("model", p.name, 0), flat(p.value));
    ++result.parameters;
    if (!trainable) {
      ++result.frozen;
      continue;
    }
    if (p.value.scalar_type() != at::kFloat) {
      tensors.emplace_back(fragment_key("master", p.name, 0), flat(p.master));
    }
    for (const auto& [saved_name, t] : p.state) {
      const std::string name = tandem_state_name(type, saved_name);
      if (std::find(state_names.begin(), state_names.end(), name) == state_names.end()) {
        state_names.push_back(name);
      }
      tensors.emplace_back(fragment_key("optim/" + name, p.name, 0), flat(t));
    }
    // An optimizer without a step count (torch's SGD) records none, as
    // tandem's own checkpoints of it do: its state then resumes by the
    // real steps taken.
    if (ds.optimizer_step > 0) param_steps[p.name] = ds.optimizer_step;
  }
  check_state_names(state_names, type);
  result.optimizer_states = state_names;
  Json buffers = Json::array();
  for (const auto& [name, b] : ds.buffers) {
    buffers.push_back({{"name", name}, {"shape", b.sizes().vec()}, {"dtype", safetensors_dtype_name(b.scalar_type())}});
    tensors.emplace_back("buffer/" + name, b.contiguous());
  }

  const Json groups = param_groups(ds, type);
  Json optimizer = {{"type", type},
                    {"param_groups", groups},
                    {"real_steps", ds.global_steps - ds.skipped_steps},
                    {"state_names", state_names},
                    {"step", ds.optimizer_step},
                    {"param_steps", param_steps}};
  Json meta;
  meta["step"] = ds.global_steps;
  meta["strategy"] = "zero";
  meta["zero_stage"] = ds.zero_stage;
  meta["hpz_partition_size"] = 1;
  meta["mixed_precision"] = precision;
  meta["tandem_version"] = version();
  meta["created_unix"] = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  meta["parameters"] = params;
  meta["buffers"] = buffers;
  meta["models"] = Json::array({{{"prefix", ""},
                                 {"strategy", "zero"},
                                 {"zero_stage", ds.zero_stage},
                                 {"hpz_partition_size", 1}}});
  meta["optimizer"] = optimizer;
  meta["optimizers"] = Json::array({optimizer});
  meta["schedulers"] = scheduler_entries(ds, groups);
  result.scheduler = !meta["schedulers"].empty();
  meta["scaler"] = scaler_state(ds, precision);
  meta["gradient_state"] = {{"optimizer_steps", ds.global_steps}};
  meta["client_state"] = Json(ds.client_state);
  meta["custom_checkpoints"] = Json::array();
  meta["rng_states"] = false;  // DeepSpeed keeps none
  meta["imported_from"] = {{"format", "deepspeed"},
                           {"path", source_dir},
                           {"tag", ds.tag},
                           {"zero_stage", ds.zero_stage},
                           {"world_size", ds.world_size},
                           {"global_samples", ds.global_samples},
                           {"ds_version", ds.ds_version},
                           {"shared_params", ds.shared},
                           {"not_carried", ds.not_carried}};
  commit_checkpoint(
      *ProcessGroup::local(), out_dir, ds.tag, [&] { return tensors; }, nlohmann::json(meta));
  return result;
}

}  // namespace

}  // namespace tandem
