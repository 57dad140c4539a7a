// DeepSpeed's optimizer and scheduler blocks: {"type": ..., "params": {...}}.

#include <cctype>
#include <map>
#include <set>

#include <fmt/format.h>

#include "config/did_you_mean.h"
#include "config/readers.h"
#include "tandem/core/error.h"

namespace tandem::config_detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The canonical name of a supported type, or a clear error: DeepSpeed's
// other optimizers and schedulers are named as such, typos get a guess.
std::string read_type(const Value& v, const std::vector<std::string>& supported,
                      const std::vector<std::string>& known_unsupported, const std::string& what,
                      const std::string& instead) {
  if (v.is_null()) {
    v.fail(what + " type is missing", "set \"type\" to " + join_alternatives(supported));
  }
  std::string text = v.as_string();
  for (const auto& name : supported) {
    if (lowercase(name) == lowercase(text)) return name;
  }
  for (const auto& name : known_unsupported) {
    if (lowercase(name) == lowercase(text)) {
      v.fail("DeepSpeed's " + what + " \"" + text + "\" is not available in tandem",
             "use " + join_alternatives(supported) + instead);
    }
  }
  std::string guess = closest_candidate(text, supported);
  v.fail("unknown " + what + " \"" + text + "\"",
         guess.empty() ? "use " + join_alternatives(supported) : "did you mean \"" + guess + "\"?");
}

std::optional<double> number_or_auto(const Value& v, double min, double max) {
  if (v.is_auto() || v.is_null()) return std::nullopt;
  return v.as_number(min, max);
}

void read_betas(const Value& v, OptimizerConfig& optimizer) {
  if (v.is_auto() || v.is_null()) return;
  std::vector<Value> betas = v.elements();
  if (betas.size() != 2) {
    v.fail(fmt::format("expected two betas [beta1, beta2], got a list of {}", betas.size()),
           "write it as [0.9, 0.999]");
  }
  optimizer.beta1 = number_or_auto(betas[0], 0.0, 1.0);
  optimizer.beta2 = number_or_auto(betas[1], 0.0, 1.0);
  for (int i = 0; i < 2; ++i) {
    // An average that never forgets: torch's optimizers refuse it too.
    if ((i == 0 ? optimizer.beta1 : optimizer.beta2) == 1.0) {
      betas[static_cast<size_t>(i)].fail(
          fmt::format("beta{} is 1; betas must be in [0, 1)", i + 1),
          "use a value below 1, such as 0.9 or 0.999");
    }
  }
}

}  // namespace

const KeyTable& optimizer_keys() {
  static const KeyTable table{
      {"type", "params"},
      {{"legacy_fusion", "is not implemented: tandem steps LibTorch's optimizers (fused "
                         "multi-tensor kernels on CUDA); ignored", {"false"}}},
      {}};
  return table;
}

const std::vector<std::string>& optimizer_types() {
  static const std::vector<std::string> types = {"Adam",    "AdamW", "SGD", "Adagrad",
                                                 "RMSprop", "Lion",  "Lamb"};
  return types;
}

const KeyTable& optimizer_params_keys(const std::string& type) {
  // torch.optim's implementation switches, which DeepSpeed passes through.
  const std::string implementation =
      "picks torch.optim's implementation: tandem steps prepared Adam/AdamW with PyTorch's fused "
      "kernels on CUDA and its own loop on the CPU; ignored";
  // torch.optim's maximize: gradient ascent, which tandem's optimizers do not
  // do; false is the default, true would train the wrong objective.
  const KeyNote maximize{"maximize", "false is torch.optim's default", {"false"},
                         [](const Value& v) {
                           if (v.as_bool()) {
                             v.fail("gradient ascent is not implemented: tandem's optimizers "
                                    "minimize",
                                    "remove it, or negate the loss");
                           }
                         }};
  const KeyNote differentiable{"differentiable",
                               "is not implemented: tandem's optimizer steps are not "
                               "differentiated through; ignored",
                               {"false"}};
  // DeepSpeed refuses it ("max_grad_norm is not supported as an optimizer
  // parameter") rather than clip twice.
  const std::vector<KeyNote> refused = {
      {"max_grad_norm", "DeepSpeed refuses it as an optimizer parameter; clip with "
                        "gradient_clipping at the config's top level instead"}};
  static const KeyTable adam_params{
      {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"},
      // Each would train something else than the file asks for: refused
      // when set away from the default (DeepSpeed's FusedAdam and CPU Adam
      // refuse amsgrad too; both apply bias_correction false).
      {{"amsgrad", "false is the default", {"false"},
        [](const Value& v) {
          if (v.as_bool()) {
            v.fail("is not implemented: tandem's Adam keeps no max of the second moments "
                   "(DeepSpeed's FusedAdam and CPU Adam refuse it too)",
                   "remove amsgrad, or set it to false");
          }
        }},
       {"bias_correction", "true is the default", {"true"},
        [](const Value& v) {
          if (!v.as_bool()) {
            v.fail("false is not implemented: tandem's Adam always corrects the moments' bias, "
                   "so it would train differently from DeepSpeed's",
                   "remove bias_correction, or set it to true");
          }
        }},
       {"fused", implementation, {"null"}},
       {"foreach", implementation, {"null"}},
       maximize,
       differentiable,
       {"decoupled_weight_decay", "false is torch.optim.Adam's default", {"false"},
        [](const Value& v) {
          if (v.as_bool()) {
            v.fail("true turns torch's Adam into AdamW, which tandem spells as the type",
                   "write \"type\": \"AdamW\" and remove decoupled_weight_decay");
          }
        }},
       {"capturable", "is torch.optim's CUDA-graph switch: tandem captures whole steps with "
                      "cuda_graph (docs/cuda_graphs.md) instead; ignored", {"false"}},
       {"fp32_optimizer_states", "false is not implemented: tandem keeps fp32 optimizer "
                                 "state; ignored", {"true"}},
       {"set_grad_none", "false is not implemented: tandem's zero_grad sets gradients to "
                         "None; ignored", {"true"}}},
      refused};
  static const KeyTable sgd_params{
      {"lr", "momentum", "weight_decay", "dampening", "nesterov"},
      {{"fused", implementation, {"null"}},
       {"foreach", implementation, {"null"}},
       maximize,
       differentiable},
      refused};
  static const KeyTable adagrad_params{
      {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"},
      {{"fused", implementation, {"null"}},
       {"foreach", implementation, {"null"}},
       maximize,
       differentiable,
       // DeepSpeedCPUAdagrad's (optimizer offload), which has no AMSGrad.
       {"amsgrad", "is not implemented for Adagrad (DeepSpeed's CPU Adagrad ignores it too); "
                   "ignored", {"false"}},
       {"fp32_optimizer_states", "false is not implemented: tandem keeps fp32 optimizer "
                                 "state; ignored", {"true"}}},
      refused};
  static const KeyTable rmsprop_params{
      {"lr", "alpha", "eps", "weight_decay", "momentum", "centered"},
      {{"foreach", implementation, {"null"}},
       maximize,
       differentiable,
       {"capturable", "is torch.optim's CUDA-graph switch: tandem captures whole steps with "
                      "cuda_graph (docs/cuda_graphs.md) instead; ignored", {"false"}}},
      refused};
  static const KeyTable lion_params{
      {"lr", "betas", "weight_decay"},
      {{"set_grad_none", "false is not implemented: tandem's zero_grad sets gradients to "
                         "None; ignored", {"true"}},
       {"fp32_optimizer_states", "false is not implemented: tandem keeps fp32 optimizer "
                                 "state; ignored", {"true"}}},
      refused};
  static const KeyTable lamb_params{
      {"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "max_coeff",
       "min_coeff"},
      {{"amsgrad", "is not implemented (DeepSpeed's FusedLamb refuses true); ignored", {"false"},
        [](const Value& v) {
          if (v.as_bool()) {
            v.fail("Lamb has no AMSGrad variant (DeepSpeed's FusedLamb raises on it)",
                   "remove amsgrad");
          }
        }}},
      refused};
  if (type == "SGD") return sgd_params;
  if (type == "Adagrad") return adagrad_params;
  if (type == "RMSprop") return rmsprop_params;
  if (type == "Lion") return lion_params;
  if (type == "Lamb") return lamb_params;
  return adam_params;
}

void read_optimizer(const Value& block, Config& config, Dialect dialect) {
  expect_map(block, "write it as {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}");
  if (block.is_null()) return;
  OptimizerConfig& optimizer = config.optimizer;
  optimizer = OptimizerConfig{};
  // The type decides which params are valid, so read it before the params
  // whatever their order in the file.
  optimizer.type = read_type(block.child("type"), optimizer_types(),
                             {"OneBitAdam", "ZeroOneAdam", "OneBitLamb", "MuAdam", "MuAdamW",
                              "MuSGD", "Muon", "CPUAdam", "FusedAdam"},
                             "optimizer",
                             ", or remove the optimizer block and pass your own optimizer to the "
                             "Accelerator");
  bool adam_w_mode = true;  // DeepSpeed's ADAM_W_MODE_DEFAULT
  std::string nesterov_at;   // where the file says so, for the checks below
  std::string min_coeff_at;
  for_each_key(block, optimizer_keys(), [&](const std::string& key, const Value& params) {
    if (key != "params") return;
    for_each_key(params, optimizer_params_keys(optimizer.type),
                 [&](const std::string& name, const Value& v) {
      if (name == "lr") optimizer.lr = number_or_auto(v, 0.0, kInf);
      if (name == "weight_decay") optimizer.weight_decay = number_or_auto(v, 0.0, kInf);
      if (name == "momentum") optimizer.momentum = number_or_auto(v, 0.0, 1.0);
      if (name == "dampening") optimizer.dampening = number_or_auto(v, 0.0, 1.0);
      if (name == "nesterov") {
        optimizer.nesterov = v.as_bool();
        nesterov_at = v.where();
      }
      if (name == "lr_decay") optimizer.lr_decay = number_or_auto(v, 0.0, kInf);
      if (name == "initial_accumulator_value") {
        optimizer.initial_accumulator_value = number_or_auto(v, 0.0, kInf);
      }
      if (name == "alpha") optimizer.alpha = number_or_auto(v, 0.0, 1.0);
      if (name == "centered") optimizer.centered = v.as_bool();
      if (name == "bias_correction" && optimizer.type == "Lamb") {
        optimizer.bias_correction = v.as_bool();
      }
      if (name == "eps_inside_sqrt") optimizer.eps_inside_sqrt = v.as_bool();
      if (name == "max_coeff") optimizer.max_coeff = number_or_auto(v, 0.0, kInf);
      if (name == "min_coeff") {
        optimizer.min_coeff = number_or_auto(v, 0.0, kInf);
        min_coeff_at = v.where();
      }
      if (name == "betas") read_betas(v, optimizer);
      if (name == "eps") {
        optimizer.eps = number_or_auto(v, 0.0, kInf);
        if (optimizer.eps && *optimizer.eps == 0.0) {
          v.fail("expected a number > 0, got 0", "set it to a small positive number like 1e-8");
        }
      }
      if (name == "adam_w_mode") {
        adam_w_mode = v.as_bool();
        // In tandem YAML `type` alone says Adam or AdamW: a flag that says
        // otherwise would be ignored, so it is refused.
        if (dialect == Dialect::kTandem && adam_w_mode != (optimizer.type == "AdamW")) {
          v.fail(std::string("adam_w_mode ") + (adam_w_mode ? "true" : "false") +
                     " disagrees with type " + optimizer.type + ", which alone says Adam or "
                     "AdamW in tandem YAML",
                 "remove adam_w_mode, and write type: " +
                     std::string(adam_w_mode ? "AdamW" : "Adam"));
        }
      }
      // Torch's Adam or DeepSpeed's fused one: the same math. tandem steps
      // LibTorch's (PyTorch's fused kernels on CUDA, its CPU Adam under
      // offload) either way.
      if (name == "torch_adam") (void)v.as_bool();
    }, [&optimizer](const std::string&) {
      return " for " + (optimizer.type == "Adam" || optimizer.type == "AdamW"
                            ? std::string("Adam/AdamW")
                            : optimizer.type);
    });
  });
  // Checks across keys, in any order in the file (torch.optim.SGD's and
  // DeepSpeed's FusedLamb's own rules), so the mistake shows on reading.
  if (optimizer.nesterov.value_or(false) &&
      (optimizer.momentum.value_or(0.0) <= 0.0 || optimizer.dampening.value_or(0.0) != 0.0)) {
    TANDEM_THROW(UsageError,
                 "{}: optimizer.params.nesterov is true, but Nesterov momentum needs a momentum "
                 "> 0 and dampening 0 (momentum {}, dampening {}); set momentum (e.g. 0.9) and "
                 "remove dampening, or set nesterov to false",
                 nesterov_at, optimizer.momentum.value_or(0.0), optimizer.dampening.value_or(0.0));
  }
  if (optimizer.min_coeff && optimizer.max_coeff && *optimizer.min_coeff > *optimizer.max_coeff) {
    TANDEM_THROW(UsageError,
                 "{}: optimizer.params.min_coeff {} is above max_coeff {}: Lamb clamps its trust "
                 "ratio to [min_coeff, max_coeff]; make min_coeff <= max_coeff",
                 min_coeff_at, *optimizer.min_coeff, *optimizer.max_coeff);
  }
  // DeepSpeed runs "Adam" with decoupled weight decay (AdamW) unless
  // adam_w_mode is false; keep that meaning for DeepSpeed configs.
  if (dialect == Dialect::kDeepSpeed && optimizer.type == "Adam" && adam_w_mode) {
    optimizer.type = "AdamW";
  }
}

const KeyTable& scheduler_keys() {
  static const KeyTable table{{"type", "params"}, {}, {}};
  return table;
}

const std::vector<std::string>& scheduler_types() {
  static const std::vector<std::string> types = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                                 "OneCycle"};
  return types;
}

const KeyTable& scheduler_params_keys(const std::string& type) {
  static const std::map<std::string, KeyTable> tables = [] {
    const std::map<std::string, std::vector<std::string>> params_of = {
        {"WarmupLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"}},
        {"WarmupDecayLR",
         {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"}},
        {"WarmupCosineLR",
         {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
          "warmup_type"}},
        {"OneCycle",
         {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
          "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
          "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom",
          "decay_mom_rate"}}};
    std::map<std::string, KeyTable> by_type;
    for (const auto& [name, params] : params_of) {
      // Every type takes DeepSpeed's resume position too.
      std::vector<std::string> keys = params;
      keys.push_back("last_batch_iteration");
      by_type.emplace(name, KeyTable{keys, {}, {}});
    }
    return by_type;
  }();
  return tables.at(type);
}

void read_scheduler(const Value& block, Config& config) {
  expect_map(block, "write it as {\"type\": \"WarmupLR\", \"params\": {...}}");
  if (block.is_null()) return;
  SchedulerConfig& scheduler = config.scheduler;
  scheduler = SchedulerConfig{};
  scheduler.type = read_type(block.child("type"), scheduler_types(), {"LRRangeTest"}, "scheduler",
                             ", or remove the scheduler block and build one in code");

  // The whole-number parameters and their minimum.
  static const std::map<std::string, int64_t> counts = {
      // total_num_steps and cycle_second_step_size may be 0, as in DeepSpeed.
      {"warmup_num_steps", 1},        {"total_num_steps", 0},
      {"cycle_first_step_size", 1},   {"cycle_second_step_size", 0},
      {"cycle_first_stair_count", 0}, {"cycle_second_stair_count", 0},
      {"decay_step_size", 0},         {"last_batch_iteration", -1}};
  // Fractions of the learning rate or momentum.
  static const std::set<std::string> ratios = {"warmup_min_ratio", "cos_min_ratio",
                                               "cycle_min_mom", "cycle_max_mom"};

  for_each_key(block, scheduler_keys(), [&](const std::string& key, const Value& params) {
    if (key != "params") return;
    for_each_key(params, scheduler_params_keys(scheduler.type),
                 [&](const std::string& name, const Value& v) {
      if (name == "warmup_type") {
        scheduler.warmup_type = v.as_choice({"log", "linear"});
        return;
      }
      if (v.is_auto()) {
        scheduler.auto_params.insert(name);
        return;
      }
      if (name == "cycle_momentum") {
        scheduler.params[name] = v.as_bool() ? 1.0 : 0.0;
      } else if (counts.count(name)) {
        scheduler.params[name] = static_cast<double>(v.as_int(counts.at(name)));
      } else if (ratios.count(name)) {
        scheduler.params[name] = v.as_number(0.0, 1.0);
      } else {
        scheduler.params[name] = v.as_number(0.0, kInf);
      }
    }, [&](const std::string&) { return " for " + scheduler.type; });
  });
}

}  // namespace tandem::config_detail
