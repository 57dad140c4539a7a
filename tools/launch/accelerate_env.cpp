// accelerate 1.15's launch_command, as far as the workers' environment goes:
// _validate_launch_command fills the launch arguments from the config file,
// then prepare_simple_launcher_cmd_env, prepare_multi_gpu_env or
// prepare_deepspeed_cmd_env turns them into variables. Checked against
// accelerate itself by tests/launch/python/accelerate_env.py.

#include "launch/accelerate_env.h"

#include <cctype>
#include <optional>
#include <regex>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

// Python's str() of a float: the shortest repr, with ".0" on whole numbers.
std::string python_float(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
  return text;
}

// What PyYAML's safe_load makes of a plain scalar (YAML 1.1), printed as
// Python's str() prints it: yes/on/true -> True, 1.50 -> 1.5, ~ -> None.
std::string python_scalar(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;  // quoted: a string as written
  static const std::regex kTrue("yes|Yes|YES|true|True|TRUE|on|On|ON");
  static const std::regex kFalse("no|No|NO|false|False|FALSE|off|Off|OFF");
  static const std::regex kInt("[-+]?[0-9][0-9_]*");
  static const std::regex kFloat(R"([-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+][0-9]+)?)");
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
    return "None";
  }
  // PyYAML's bool resolver takes yes/no/on/off/true/false (not y/n).
  if (std::regex_match(text, kTrue)) return "True";
  if (std::regex_match(text, kFalse)) return "False";
  std::string digits;
  for (char c : text) {
    if (c != '_') digits += c;
  }
  if (std::regex_match(text, kInt)) {
    return digits[0] == '+' ? digits.substr(1) : digits;
  }
  if (std::regex_match(text, kFloat) && digits.find_first_of("0123456789") != std::string::npos) {
    return python_float(std::stod(digits));
  }
  return text;
}

// Python's str() of a loaded YAML value: lists as ['A', 'B'].
std::string python_str(const YAML::Node& node) {
  if (node.IsScalar()) return python_scalar(node);
  if (node.IsNull()) return "None";
  // What python_scalar prints for an int or a float.
  static const std::regex kNumber(R"([-+]?[0-9.]+(e[-+][0-9]+)?)");
  auto repr = [](const YAML::Node& item) {
    const std::string text = python_str(item);
    const bool is_string = item.IsScalar() && (item.Tag() == "!" || text == item.Scalar()) &&
                           text != "True" && text != "False" && text != "None" &&
                           !std::regex_match(text, kNumber);
    return is_string ? "'" + text + "'" : text;
  };
  std::string out = node.IsSequence() ? "[" : "{";
  bool first = true;
  for (const auto& item : node) {
    if (!first) out += ", ";
    first = false;
    out += node.IsSequence() ? repr(item) : repr(item.first) + ": " + repr(item.second);
  }
  return out + (node.IsSequence() ? "]" : "}");
}

// The value at `key` of `section` as str(), or nullopt when absent or null
// (argparse's None default: no variable).
std::optional<std::string> value_of(const YAML::Node& section, const std::string& key) {
  if (!section || !section.IsMap()) return std::nullopt;
  const YAML::Node node = section[key];
  if (!node || node.IsNull()) return std::nullopt;
  return python_str(node);
}

// fsdp_config's entries, each under its fsdp_-prefixed name, as Accelerate
// copies them onto its launch arguments.
std::map<std::string, std::string> fsdp_entries(const YAML::Node& section) {
  std::map<std::string, std::string> entries;
  if (!section || !section.IsMap()) return entries;
  for (const auto& item : section) {
    std::string key = item.first.Scalar();
    if (key.rfind("fsdp", 0) != 0) key = "fsdp_" + key;
    if (!item.second.IsNull()) entries[key] = python_str(item.second);
  }
  return entries;
}

void add_fsdp(const YAML::Node& doc, std::map<std::string, std::string>& env) {
  const auto given = fsdp_entries(doc["fsdp_config"]);
  auto get = [&](const std::string& key) -> std::optional<std::string> {
    auto it = given.find(key);
    return it == given.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  env["ACCELERATE_USE_FSDP"] = "true";
  env["FSDP_VERSION"] = get("fsdp_version").value_or("1");
  env["FSDP_SHARDING_STRATEGY"] = get("fsdp_sharding_strategy").value_or("FULL_SHARD");
  env["FSDP_MIN_NUM_PARAMS"] = get("fsdp_min_num_params").value_or("100000000");
  // Lowercased, with launch's defaults when the file has no value.
  const std::vector<std::pair<std::string, std::string>> lowered = {
      {"reshard_after_forward", "true"},   {"offload_params", "false"},
      {"forward_prefetch", "false"},       {"use_orig_params", "true"},
      {"cpu_ram_efficient_loading", "true"}, {"sync_module_states", "true"},
      {"activation_checkpointing", "false"}, {"activation_checkpointing_offload", "false"}};
  for (const auto& [name, fallback] : lowered) {
    env["FSDP_" + upper(name)] = lower(get("fsdp_" + name).value_or(fallback));
  }
  // Only when given, as written.
  const std::vector<std::pair<std::string, std::string>> optional = {
      {"fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY"},
      {"fsdp_transformer_layer_cls_to_wrap", "FSDP_TRANSFORMER_CLS_TO_WRAP"},
      {"fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH"},
      {"fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE"},
      {"fsdp_ignored_modules", "FSDP_IGNORED_MODULES"}};
  for (const auto& [key, name] : optional) {
    if (auto value = get(key)) env[name] = *value;
  }
}

void add_dynamo(const YAML::Node& doc, std::map<std::string, std::string>& env) {
  const YAML::Node dynamo = doc["dynamo_config"];
  auto get = [&](const std::string& key) {
    // dynamo_config keys may omit the dynamo_ prefix; the legacy top-level
    // dynamo_backend is Accelerate's old spelling of the same.
    if (auto value = value_of(dynamo, "dynamo_" + key)) return value;
    if (auto value = value_of(dynamo, key)) return value;
    return key == "backend" ? value_of(doc, "dynamo_backend") : std::nullopt;
  };
  env["ACCELERATE_DYNAMO_BACKEND"] = upper(get("backend").value_or("NO"));
  env["ACCELERATE_DYNAMO_MODE"] = get("mode").value_or("default");
  env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] = get("use_fullgraph").value_or("False");
  env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = get("use_dynamic").value_or("False");
  env["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] =
      get("use_regional_compilation").value_or("False");
}

void add_parallelism(const YAML::Node& section, std::map<std::string, std::string>& env) {
  auto get = [&](const std::string& key, const std::string& fallback) {
    return value_of(section, "parallelism_config_" + key).value_or(fallback);
  };
  const std::string prefix = "PARALLELISM_CONFIG_";
  env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true";
  for (const auto& [key, fallback] :
       std::vector<std::pair<std::string, std::string>>{{"dp_replicate_size", "1"},
                                                        {"dp_shard_size", "1"},
                                                        {"tp_size", "1"},
                                                        {"cp_size", "1"},
                                                        {"cp_backend", "torch"},
                                                        {"sp_size", "1"},
                                                        {"sp_backend", "deepspeed"}}) {
    env[prefix + upper(key)] = get(key, fallback);
  }
  if (get("cp_size", "1") != "1") {
    env[prefix + "CP_COMM_STRATEGY"] = get("cp_comm_strategy", "allgather");
  }
  if (get("sp_size", "1") != "1") {
    env[prefix + "SP_SEQ_LENGTH"] = get("sp_seq_length", "None");
    env[prefix + "SP_SEQ_LENGTH_IS_VARIABLE"] = get("sp_seq_length_is_variable", "True");
    env[prefix + "SP_ATTN_IMPLEMENTATION"] = get("sp_attn_implementation", "sdpa");
  }
}

void add_deepspeed(const YAML::Node& doc, const LaunchOptions& opts, bool precision_from_file,
                   std::map<std::string, std::string>& env) {
  const YAML::Node ds = doc["deepspeed_config"];
  std::vector<std::string> fields;
  if (ds && ds.IsMap()) {
    for (const auto& item : ds) fields.push_back(item.first.Scalar());
  }
  if (precision_from_file) fields.emplace_back("mixed_precision");
  env["ACCELERATE_CONFIG_DS_FIELDS"] = lower(fmt::format("{}", fmt::join(fields, ",")));
  env["ACCELERATE_USE_DEEPSPEED"] = "true";
  // A flag beats the file's deepspeed_config entry.
  auto set = [&](const std::string& name, const std::string& key,
                 std::optional<std::string> flag, bool lowered) {
    std::optional<std::string> value = flag ? flag : value_of(ds, key);
    if (value) env[name] = lowered ? lower(*value) : *value;
  };
  auto text = [](const std::string& s) {
    return s.empty() ? std::nullopt : std::optional<std::string>(s);
  };
  set("ACCELERATE_DEEPSPEED_ZERO_STAGE", "zero_stage",
      opts.zero_stage ? std::optional<std::string>(std::to_string(*opts.zero_stage)) : std::nullopt,
      false);
  set("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "gradient_accumulation_steps",
      opts.gradient_accumulation_steps
          ? std::optional<std::string>(std::to_string(*opts.gradient_accumulation_steps))
          : std::nullopt,
      false);
  set("ACCELERATE_GRADIENT_CLIPPING", "gradient_clipping",
      opts.gradient_clipping ? std::optional<std::string>(python_float(*opts.gradient_clipping))
                             : std::nullopt,
      true);
  set("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "offload_optimizer_device",
      text(opts.offload_optimizer_device), true);
  set("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "offload_param_device",
      text(opts.offload_param_device), true);
  set("ACCELERATE_DEEPSPEED_ZERO3_INIT", "zero3_init_flag", std::nullopt, true);
  set("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "zero3_save_16bit_model", std::nullopt, true);
  set("ACCELERATE_DEEPSPEED_CONFIG_FILE", "deepspeed_config_file",
      text(opts.deepspeed_config_file), false);
  set("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", "deepspeed_moe_layer_cls_names", std::nullopt,
      false);
}

}  // namespace

std::map<std::string, std::string> accelerate_worker_env(const std::string& accelerate_yaml,
                                                         const LaunchOptions& opts) {
  std::map<std::string, std::string> env;
  if (accelerate_yaml.empty() && !opts.use_deepspeed) return env;
  YAML::Node doc;
  if (!accelerate_yaml.empty()) {
    try {
      doc = YAML::LoadFile(accelerate_yaml);
    } catch (const YAML::Exception& e) {
      TANDEM_THROW(UsageError, "{}: cannot read it as YAML: {}", accelerate_yaml, e.what());
    }
  }
  // The launcher path: a paradigm flag, else the file's distributed_type
  // (an unquoted NO loads as false).
  std::string type = "NO";
  if (auto given = value_of(doc, "distributed_type"); given && *given != "False") type = *given;
  const bool deepspeed = opts.use_deepspeed || (!opts.multi_gpu && type == "DEEPSPEED");
  const bool fsdp = !deepspeed && !opts.multi_gpu && type == "FSDP";
  const bool torchrun = !deepspeed && (fsdp || opts.multi_gpu || type.rfind("MULTI_", 0) == 0) &&
                        type != "MULTI_CPU";

  // --mixed-precision beats the file; "no" when neither says.
  const std::optional<std::string> file_precision = value_of(doc, "mixed_precision");
  env["ACCELERATE_MIXED_PRECISION"] =
      opts.mixed_precision ? to_string(*opts.mixed_precision) : lower(file_precision.value_or("no"));
  if (value_of(doc, "debug") == "True") env["ACCELERATE_DEBUG_MODE"] = "true";
  if (!deepspeed) add_dynamo(doc, env);
  if (deepspeed) {
    add_deepspeed(doc, opts, file_precision && !opts.mixed_precision, env);
  } else if (fsdp) {
    add_fsdp(doc, env);
  } else if (!torchrun) {
    env["ACCELERATE_USE_CPU"] = value_of(doc, "use_cpu") == "True" ? "True" : "False";
  }
  const YAML::Node parallelism = doc["parallelism_config"];
  const bool paradigm_flag = opts.use_deepspeed || opts.multi_gpu;
  if ((deepspeed || torchrun) && !paradigm_flag && parallelism && parallelism.IsMap() &&
      parallelism.size() > 0) {
    add_parallelism(parallelism, env);
  }
  return env;
}

}  // namespace tandem::cli
