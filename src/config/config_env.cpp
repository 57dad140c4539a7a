// ConfigEnv (the TANDEM_* variables that touch the config) and where the
// default config files live.

#include <cstdlib>
#include <sys/stat.h>

#include "config/numbers.h"
#include "core/text.h"
#include "tandem/config/config.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using VarMap = std::map<std::string, std::string>;

using detail::find_variable;

std::string get(const VarMap& vars, const char* name) {
  const std::string* value = find_variable(vars, name);
  return value ? *value : "";
}

bool is_file(const std::string& path) {
  struct stat info {};
  return !path.empty() && ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

// ($XDG_CACHE_HOME or $HOME/.cache), or "" when neither is set.
std::string cache_root(const ConfigEnv& env) {
  if (!env.xdg_cache_home.empty()) return env.xdg_cache_home;
  if (!env.home.empty()) return env.home + "/.cache";
  return "";
}

// TANDEM_OFFLOAD_*_DEVICE: none or cpu (accelerate's nvme is not offered).
std::optional<OffloadDevice> offload_variable(const VarMap& vars, const char* name) {
  const std::string* text = find_variable(vars, name);
  if (text == nullptr) return std::nullopt;
  if (*text == "none") return OffloadDevice::kNone;
  if (*text == "cpu") return OffloadDevice::kCpu;
  TANDEM_THROW(UsageError,
               "environment variable {}='{}' is not valid; set it to none or cpu (tandem "
               "offloads to CPU memory only), or unset it",
               name, *text);
}

}  // namespace

ConfigEnv ConfigEnv::from_map(const VarMap& vars) {
  ConfigEnv env;
  env.config_file = get(vars, "TANDEM_CONFIG_FILE");
  env.xdg_cache_home = get(vars, "XDG_CACHE_HOME");
  env.home = get(vars, "HOME");
  env.hf_home = get(vars, "HF_HOME");
  if (const std::string* text = find_variable(vars, "TANDEM_MIXED_PRECISION")) {
    std::string lowered = *text;
    for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lowered != "no" && lowered != "bf16" && lowered != "fp16") {
      TANDEM_THROW(UsageError,
                   "environment variable TANDEM_MIXED_PRECISION='{}' is not valid; set it to no, "
                   "bf16 or fp16, or unset it",
                   *text);
    }
    env.mixed_precision = parse_mixed_precision(lowered);
  }
  if (const std::string* text = find_variable(vars, "TANDEM_GRADIENT_ACCUMULATION_STEPS")) {
    std::optional<int64_t> steps = config_detail::parse_integer_text(*text);
    if (!steps || *steps < 1) {
      TANDEM_THROW(UsageError,
                   "environment variable TANDEM_GRADIENT_ACCUMULATION_STEPS='{}' is not a whole "
                   "number >= 1; fix or unset it",
                   *text);
    }
    env.gradient_accumulation_steps = steps;
  }
  if (const std::string* text = find_variable(vars, "TANDEM_SEED")) {
    std::optional<uint64_t> seed = config_detail::parse_unsigned_text(*text);
    if (!seed) {
      TANDEM_THROW(UsageError,
                   "environment variable TANDEM_SEED='{}' is not a whole number from 0 to "
                   "18446744073709551615; fix or unset it",
                   *text);
    }
    env.seed = seed;
  }
  if (const std::string* text = find_variable(vars, "TANDEM_ZERO_STAGE")) {
    std::optional<int64_t> stage = config_detail::parse_integer_text(*text);
    if (!stage || *stage < 0 || *stage > 3) {
      TANDEM_THROW(UsageError,
                   "environment variable TANDEM_ZERO_STAGE='{}' is not a ZeRO stage; set it to "
                   "0, 1, 2 or 3, or unset it",
                   *text);
    }
    env.zero_stage = static_cast<int>(*stage);
  }
  env.offload_optimizer = offload_variable(vars, "TANDEM_OFFLOAD_OPTIMIZER_DEVICE");
  env.offload_param = offload_variable(vars, "TANDEM_OFFLOAD_PARAM_DEVICE");
  if (const std::string* text = find_variable(vars, "TANDEM_GRADIENT_CLIPPING")) {
    std::optional<double> norm = config_detail::parse_double_text(*text);
    if (!norm || !(*norm >= 0) || *norm == std::numeric_limits<double>::infinity()) {
      TANDEM_THROW(UsageError,
                   "environment variable TANDEM_GRADIENT_CLIPPING='{}' is not a max gradient "
                   "norm; set it to 0 (no clipping) or a positive number, or unset it",
                   *text);
    }
    env.gradient_clipping = norm;
  }
  return env;
}

ConfigEnv ConfigEnv::from_environment() {
  VarMap vars;
  for (const char* name :
       {"TANDEM_CONFIG_FILE", "TANDEM_MIXED_PRECISION", "TANDEM_GRADIENT_ACCUMULATION_STEPS",
        "TANDEM_SEED", "TANDEM_ZERO_STAGE", "TANDEM_OFFLOAD_OPTIMIZER_DEVICE",
        "TANDEM_OFFLOAD_PARAM_DEVICE", "TANDEM_GRADIENT_CLIPPING", "XDG_CACHE_HOME", "HOME",
        "HF_HOME"}) {
    if (const char* value = std::getenv(name)) vars[name] = value;
  }
  return from_map(vars);
}

std::string default_config_path(const ConfigEnv& env) {
  std::string root = cache_root(env);
  return root.empty() ? "" : root + "/tandem/default_config.yaml";
}

std::vector<std::string> default_config_candidates(const ConfigEnv& env) {
  std::vector<std::string> candidates;
  if (std::string tandem_default = default_config_path(env); !tandem_default.empty()) {
    candidates.push_back(tandem_default);
  }
  // Accelerate: $HF_HOME/accelerate, else (cache root)/huggingface/accelerate.
  std::string hf_root = env.hf_home;
  if (hf_root.empty() && !cache_root(env).empty()) hf_root = cache_root(env) + "/huggingface";
  if (!hf_root.empty()) candidates.push_back(hf_root + "/accelerate/default_config.yaml");
  return candidates;
}

std::string find_default_config(const ConfigEnv& env) {
  for (const std::string& path : default_config_candidates(env)) {
    if (is_file(path)) return path;
  }
  return "";
}

std::string select_config_file(const std::string& flag_path, const ConfigEnv& env) {
  if (!flag_path.empty()) return flag_path;
  if (!env.config_file.empty()) return env.config_file;
  return find_default_config(env);
}

}  // namespace tandem
