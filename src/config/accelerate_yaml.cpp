// HF Accelerate's default_config.yaml (what `accelerate config` writes),
// with its deepspeed_config section and optional deepspeed_config_file, and
// its fsdp_config section (accelerate_fsdp.cpp).

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <sys/stat.h>

#include "config/readers.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem::config_detail {
namespace {

// Keys of tandem's own YAML: finding one here means someone wrote a tandem
// config with Accelerate's `distributed_type`, which makes it read as
// Accelerate's format.
std::string tandem_key_hint(const std::string& key) {
  static const std::set<std::string> tandem_keys = {
      "distributed", "zero_optimization", "optimizer", "scheduler", "ddp", "fp16", "bf16",
      "seed", "train_batch_size", "train_micro_batch_size_per_gpu",
      "gradient_accumulation_steps", "gradient_clipping", "steps_per_print",
      "wall_clock_breakdown"};
  if (!tandem_keys.count(key)) return "";
  return " in an Accelerate config (a YAML file with distributed_type or compute_environment "
         "is read as Accelerate's format; tandem's own YAML names the type `distributed:`, and "
         "Accelerate keeps DeepSpeed settings under deepspeed_config)";
}

std::string read_text_file(const Value& at, const std::string& path) {
  // Only plain files: a folder reads as nothing, and /dev/zero or a FIFO
  // would never end.
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    at.fail("\"" + path + "\" is not a regular file",
            "give the path of the DeepSpeed JSON file itself");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    at.fail("cannot read \"" + path + "\" (" + std::strerror(errno) + ")",
            "check the path; a relative path is taken from the folder of this YAML file, else "
            "from the working directory (as Accelerate reads it)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string join_dir(const std::string& dir, const std::string& file) {
  if (file.empty() || file[0] == '/' || dir.empty() || dir == ".") return file;
  return dir.back() == '/' ? dir + file : dir + "/" + file;
}

// The deepspeed_config_file to read. A relative path is taken from the
// YAML's folder first; Accelerate opens it from the working directory, so
// files written for `accelerate launch` (e.g. `configs/ds.json` named in
// `configs/accelerate.yaml`, launched from the project root) work too.
std::string find_deepspeed_file(const std::string& base_dir, const std::string& file) {
  const std::string next_to_yaml = join_dir(base_dir, file);
  if (!fs::exists(next_to_yaml) && fs::exists(file)) {
    return file;
  }
  return next_to_yaml;
}

// A bare word that PyYAML (YAML 1.1), and so Accelerate's loader, reads as
// a boolean: `distributed_type: NO` arrives there as False.
bool yaml11_boolean(const Value& v) {
  static const std::set<std::string> words = {"yes", "Yes", "YES", "no",  "No",   "NO",
                                              "true", "True", "TRUE", "false", "False", "FALSE",
                                              "on",  "On",  "ON",  "off", "Off",  "OFF"};
  return v.node().IsScalar() && !v.is_quoted() && words.count(v.node().Scalar()) > 0;
}

// distributed_type as Accelerate's loader takes it: DistributedType(value),
// so the exact capitals. An unquoted NO reaches `accelerate launch` as the
// boolean false, which matches none of its types, so it runs the file as NO
// (one process, the simple launcher); tandem does the same, and says so.
DistributedType read_accelerate_distributed_type(const Value& v, Config& config) {
  if (yaml11_boolean(v) && (v.node().Scalar() == "NO" || v.node().Scalar() == "No" ||
                            v.node().Scalar() == "no")) {
    config.warnings.push_back(fmt::format(
        "{}: distributed_type: an unquoted {} is the boolean false in YAML 1.1 (PyYAML, "
        "Accelerate's loader), which `accelerate launch` runs as NO; read as NO. Write it in "
        "quotes, distributed_type: 'NO', as `accelerate config` does",
        v.where(), v.node().Scalar()));
    return DistributedType::kNo;
  }
  DistributedType type = read_distributed_type(v);
  const std::string canonical = to_string(type);
  if (v.node().Scalar() != canonical) {
    v.fail("Accelerate's loader takes only the exact name, in capitals",
           "write " + canonical);
  }
  return type;
}

// Copies what a deepspeed_config_file says about training into `config`.
void merge_deepspeed_file(const Config& ds, Config& config) {
  config.train_batch_size = ds.train_batch_size;
  config.train_micro_batch_size_per_gpu = ds.train_micro_batch_size_per_gpu;
  config.gradient_accumulation_steps = ds.gradient_accumulation_steps;
  config.gradient_clipping = ds.gradient_clipping;
  config.fp16 = ds.fp16;
  bool zero3_init = config.zero.zero3_init;
  config.zero = ds.zero;
  config.zero.zero3_init = zero3_init;
  config.optimizer = ds.optimizer;
  config.scheduler = ds.scheduler;
  config.activation_checkpointing = ds.activation_checkpointing;
  // Accelerate replaces steps_per_print with infinity, which silences
  // DeepSpeed's progress line; tandem keeps what the file says.
  config.wall_clock_breakdown = ds.wall_clock_breakdown;
  config.steps_per_print = ds.steps_per_print;
  config.tensorboard = ds.tensorboard;
  config.csv_monitor = ds.csv_monitor;
  config.warnings.insert(config.warnings.end(), ds.warnings.begin(), ds.warnings.end());
  config.auto_keys.insert(ds.auto_keys.begin(), ds.auto_keys.end());
  config.key_locations.insert(ds.key_locations.begin(), ds.key_locations.end());
}

// Fails when the section and the JSON file both give a setting, differently.
void check_agrees(const Value& v, const std::string& mine, const Config* ds,
                  const std::string& ds_path, const std::string& theirs) {
  if (ds == nullptr || !ds->key_locations.count(ds_path) || mine == theirs) return;
  v.fail(mine + " disagrees with " + ds_path + " = " + theirs + " at " +
             ds->key_locations.at(ds_path),
         "give it in one place: remove it here or from the deepspeed_config_file (or make them "
         "equal)");
}

// The deepspeed_config section. Returns the JSON file's config, if any,
// for the mixed-precision check.
std::optional<Config> read_deepspeed_section(const Value& section, Config& config,
                                             const std::string& base_dir) {
  // Keys first, then the file they may refer to, then the keys on top: the
  // file may come last in the section.
  std::map<std::string, Value> keys;
  for_each_key(section, accelerate_deepspeed_section_keys(),
               [&](const std::string& key, const Value& v) {
    keys.emplace(key, v);
  });
  std::optional<Config> ds;
  auto file = keys.find("deepspeed_config_file");
  if (file != keys.end() && !file->second.is_null()) {
    std::string path = find_deepspeed_file(base_dir, file->second.as_string());
    ds = parse_deepspeed_text(read_text_file(file->second, path), path,
                              /*accelerate_file=*/true);
    if (!ds->key_locations.count("zero_optimization")) {
      // Accelerate's DeepSpeedPlugin: "Please specify the ZeRO optimization
      // config in the DeepSpeed config."
      file->second.fail("\"" + path + "\" has no zero_optimization block, which Accelerate "
                        "requires of a deepspeed_config_file",
                        "add \"zero_optimization\": {\"stage\": 0} (or the stage you want) to "
                        "the file");
    }
    merge_deepspeed_file(*ds, config);
  }
  const Config* json = ds ? &*ds : nullptr;
  ZeroConfig& zero = config.zero;
  for (const auto& [key, v] : keys) {
    if (key == "zero_stage") {
      int stage = static_cast<int>(v.as_int(0, 3, "set it to 0, 1, 2 or 3"));
      check_agrees(v, std::to_string(stage), json, "zero_optimization.stage",
                   std::to_string(zero.stage));
      zero.stage = stage;
      config.key_locations["zero_optimization.stage"] = v.where();
    } else if (key == "offload_optimizer_device" || key == "offload_param_device") {
      bool optimizer = key == "offload_optimizer_device";
      OffloadDevice& target = optimizer ? zero.offload_optimizer : zero.offload_param;
      OffloadDevice device = OffloadDevice::kNone;
      if (!v.is_null()) {
        if (v.node().IsScalar() && v.node().Scalar() == "nvme") {
          v.fail("NVMe offload is not supported by tandem", "use cpu or none");
        }
        device = v.as_choice({"none", "cpu"}) == "cpu" ? OffloadDevice::kCpu : OffloadDevice::kNone;
      }
      check_agrees(v, to_string(device), json,
                   optimizer ? "zero_optimization.offload_optimizer.device"
                             : "zero_optimization.offload_param.device",
                   to_string(target));
      target = device;
    } else if (key == "gradient_accumulation_steps") {
      if (v.is_auto() || v.is_null()) continue;
      int64_t steps = v.as_count();
      check_agrees(v, std::to_string(steps), json, "gradient_accumulation_steps",
                   config.gradient_accumulation_steps
                       ? std::to_string(*config.gradient_accumulation_steps)
                       : "auto");
      config.gradient_accumulation_steps = steps;
      config.key_locations["gradient_accumulation_steps"] = v.where();
    } else if (key == "gradient_clipping") {
      if (v.is_null()) continue;
      if (v.is_auto()) {
        // The program supplies it, unless the JSON file already gave one.
        if (!json || !json->key_locations.count("gradient_clipping")) {
          config.auto_keys.insert("gradient_clipping");
        }
        continue;
      }
      double clip = v.as_number(0.0, std::numeric_limits<double>::infinity());
      check_agrees(v, fmt::format("{}", clip), json, "gradient_clipping",
                   fmt::format("{}", config.gradient_clipping));
      config.gradient_clipping = clip;
      config.auto_keys.erase("gradient_clipping");  // fills the JSON's "auto"
    } else if (key == "deepspeed_hostfile" || key == "deepspeed_inclusion_filter" ||
               key == "deepspeed_exclusion_filter") {
      if (v.is_null()) continue;
      std::string text = v.as_string();
      if (text == "none") text.clear();  // what `accelerate config` writes for "no filter"
      (key == "deepspeed_hostfile"           ? config.deepspeed_hostfile
       : key == "deepspeed_inclusion_filter" ? config.deepspeed_inclusion_filter
                                             : config.deepspeed_exclusion_filter) = text;
    } else if (key == "deepspeed_multinode_launcher") {
      if (v.is_null()) continue;
      // Accelerate's choices; tandem launch fans out over ssh for pdsh and
      // refuses the MPI and Slurm ones (launch_options.cpp).
      config.deepspeed_multinode_launcher =
          v.as_choice({"pdsh", "standard", "openmpi", "mvapich", "mpich", "impi", "slurm", "nossh"});
    } else if (key == "zero3_init_flag") {
      zero.zero3_init = v.as_bool();
    } else if (key == "zero3_save_16bit_model") {
      // Accelerate sets stage3_gather_16bit_weights_on_model_save from it.
      const bool gather = v.as_bool();
      check_agrees(v, gather ? "true" : "false", json,
                   "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                   zero.gather_16bit_weights_on_model_save.value_or(false) ? "true" : "false");
      zero.gather_16bit_weights_on_model_save = gather;
    }
  }
  // Accelerate's DeepSpeed plugin starts from ZeRO stage 2 when nothing
  // names a stage. A deepspeed_config_file is what DeepSpeed trains with,
  // so without a stage there it runs DeepSpeed's default, 0.
  if (!keys.count("zero_stage") && !json) zero.stage = 2;
  return ds;
}

}  // namespace

const KeyTable& accelerate_deepspeed_section_keys() {
  static const KeyTable table{
      {"zero_stage", "offload_optimizer_device", "offload_param_device",
       "gradient_accumulation_steps", "gradient_clipping", "zero3_init_flag",
       "deepspeed_config_file", "deepspeed_hostfile", "deepspeed_exclusion_filter",
       "deepspeed_inclusion_filter", "deepspeed_multinode_launcher", "zero3_save_16bit_model"},
      {{"deepspeed_moe_layer_cls_names", "is not implemented: tandem has no mixture-of-experts "
                                         "layers to mark; ignored", {"null", ""}},
       {"seq_parallel_communication_data_type", "is not implemented: tandem has no sequence "
                                                "parallelism; ignored", {"null"}},
       {"offload_optimizer_nvme_path", "is not implemented: tandem offloads to CPU memory only; "
                                       "ignored", {"null", "none"}},
       {"offload_param_nvme_path", "is not implemented: tandem offloads to CPU memory only; "
                                   "ignored", {"null", "none"}}},
      {}};
  return table;
}

const KeyTable& accelerate_top_level_keys() {
  static const KeyTable table{
      {"compute_environment", "distributed_type", "num_processes", "num_machines",
       "machine_rank", "main_process_ip", "main_process_port", "mixed_precision", "gpu_ids",
       "use_cpu", "rdzv_backend", "deepspeed_config", "fp16", "tp_config",
       "parallelism_config", "debug", "enable_cpu_affinity", "fsdp_config"},
      {{"downcast_bf16", "applies to TPUs only: Accelerate turns it into XLA_DOWNCAST_BF16, "
                         "which makes torch_xla store float32 tensors as bfloat16; tandem does "
                         "not train on TPUs, and on CPUs and GPUs mixed_precision: bf16 is the "
                         "way to compute in bf16; ignored", {"no", "false"}},
       {"main_training_function", "does not apply to C++: tandem launch runs the program, which "
                                  "starts at main(); ignored", {"main"}},
       {"dynamo_backend", "asks for TorchDynamo, which LibTorch does not have; ignored",
        {"no", "null"}},
       {"dynamo_config", "asks for TorchDynamo, which LibTorch does not have; ignored",
        {"{}", "null"}},
       {"ipex_config", "asks for Intel's extension for PyTorch, which tandem does not use; "
                       "ignored", {"{}", "null", "false"}},
       {"mpirun_config", "is not used: tandem launch starts its own workers (under mpirun, start "
                         "the program directly: tandem reads OMPI_*); ignored", {"{}", "null", "1", "false"}},
       {"commands", "is not used: tandem launch runs the program on its command line; ignored",
        {"null", "[]"}},
       {"command_file", "is not used: tandem launch runs the program on its command line; "
                        "ignored", {"null", ""}},
       {"same_network", "changes nothing in tandem launch: every machine must reach "
                        "main_process_ip:main_process_port; ignored",
        // Both values are quiet: false is Accelerate's default (ClusterConfig,
        // `accelerate config default`) and true what its questionnaire
        // writes; either way tandem's nodes meet at one address.
        {"true", "false"}, check_bool}},
      {{"use_mps_device", "asks for Apple's MPS device, which tandem does not train on; "
                          "remove it or set it to false", {"false", "null"}},
       {"megatron_lm_config", "asks for Megatron-LM, which tandem does not run; remove the "
                              "section", {"{}", "null"}},
       {"fp8_config", "asks for FP8 training, which tandem does not do; remove the section and "
                      "use mixed_precision bf16 or fp16", {"{}", "null"}},
       {"tpu_*", "asks for TPUs, which tandem does not train on; remove the tpu_ keys",
        {"false", "null", "[]", "{}", ""}}}};
  return table;
}

void read_accelerate_document(const Value& root, Config& config, const std::string& base_dir) {
  std::optional<Value> type_value, section, fsdp_section, parallelism, precision, legacy_fp16;
  for_each_key(root, accelerate_top_level_keys(), [&](const std::string& key, const Value& v) {
    if (key == "mixed_precision" && yaml11_boolean(v)) {
      // PyYAML hands `accelerate launch` a bool, and it fails on .lower().
      v.fail("an unquoted " + v.node().Scalar() + " is a boolean in YAML 1.1, which "
                 "Accelerate's loader (PyYAML) follows, so `accelerate launch` fails on it",
             "write it in quotes, mixed_precision: 'no', as `accelerate config` does");
    }
    if (key == "num_processes" && v.node().IsScalar() && v.node().Scalar() == "-1") {
      // Accelerate's "not set" (its ClusterConfig default): the launch decides.
      config.key_locations.erase("num_processes");
    } else if (read_launch_key(key, v, config)) {
      if (key == "mixed_precision") precision = v;
    } else if (key == "compute_environment") {
      if (v.node().IsScalar() && v.node().Scalar() == "AMAZON_SAGEMAKER") {
        v.fail("SageMaker configs are not supported by tandem",
               "write a LOCAL_MACHINE config (`accelerate config` on the machine that trains)");
      }
      v.as_choice({"LOCAL_MACHINE"});
    } else if (key == "distributed_type") {
      type_value = v;
      config.distributed_type = read_accelerate_distributed_type(v, config);
    } else if (key == "deepspeed_config") {
      section = v;
    } else if (key == "fp16") {
      legacy_fp16 = v;  // Accelerate's old spelling of mixed_precision: fp16
    } else if (key == "tp_config" || key == "parallelism_config") {
      read_accelerate_parallelism(v, key);
      if (key == "parallelism_config") parallelism = v;
    } else if (key == "fsdp_config") {
      expect_map(v, "write its settings as `key: value` entries");
      fsdp_section = v;
    } else if (key == "debug") {
      config.debug = v.as_bool();
    } else if (key == "enable_cpu_affinity") {
      config.enable_cpu_affinity = v.as_bool();
    }
  }, tandem_key_hint);

  if (!type_value) {
    root.fail("distributed_type is missing",
              "add `distributed_type: NO`, MULTI_CPU, MULTI_GPU, DEEPSPEED or FSDP");
  }
  if (config.distributed_type == DistributedType::kNo) {
    // `accelerate launch` starts one process for NO whatever num_processes
    // says (templates such as TRL's single_gpu.yaml keep num_processes: 8).
    if (config.num_processes.value_or(1) > 1) {
      config.warnings.push_back(fmt::format(
          "{}: 'num_processes: {}' is ignored because distributed_type is NO, which runs one "
          "process (as `accelerate launch` does); set distributed_type to MULTI_GPU, MULTI_CPU "
          "or DEEPSPEED to run {} processes",
          location_of(config, "num_processes"), *config.num_processes, *config.num_processes));
    }
    config.num_processes = 1;
  }
  if (!precision && legacy_fp16 && legacy_fp16->as_bool()) {
    config.mixed_precision = MixedPrecision::kFp16;
  }

  if (config.distributed_type == DistributedType::kDeepSpeed) {
    // Accelerate's DeepSpeedPlugin leaves gradient_clipping "auto" and fills
    // it with 1.0, DeepSpeed's own default; a value in the section or the
    // file beats it.
    config.gradient_clipping = kDeepSpeedGradientClipping;
    MixedPrecision from_yaml = config.mixed_precision;
    std::optional<Config> ds = read_deepspeed_section(
        section ? *section : root.child("deepspeed_config"), config, base_dir);
    // The stronger setting wins: "no" here leaves the file's fp16/bf16 on.
    if (ds && ds->mixed_precision != MixedPrecision::kNo) {
      if (from_yaml != MixedPrecision::kNo && from_yaml != ds->mixed_precision) {
        (precision ? *precision : *legacy_fp16).fail(std::string(to_string(from_yaml)) + " disagrees with the "
                            "deepspeed_config_file, which enables " +
                            to_string(ds->mixed_precision),
                        "make them agree, or set mixed_precision to 'no' and let the file decide");
      }
      config.mixed_precision = ds->mixed_precision;
    }
  } else if (section && section->is_map() && section->node().size() > 0) {
    config.warnings.push_back(fmt::format(
        "{}: 'deepspeed_config' is ignored because distributed_type is {}, not DEEPSPEED",
        section->where(), to_string(config.distributed_type)));
  }
  if (config.distributed_type == DistributedType::kFsdp) {
    read_accelerate_fsdp(fsdp_section ? *fsdp_section : root.child("fsdp_config"),
                         parallelism ? *parallelism : root.child("parallelism_config"), config);
  } else {
    read_accelerate_data_parallel_sizes(parallelism ? *parallelism : root.child("parallelism_config"),
                                        config);
  }
  if (config.distributed_type != DistributedType::kFsdp && fsdp_section &&
      fsdp_section->is_map() && fsdp_section->node().size() > 0) {
    // As Accelerate, which reads fsdp_config for FSDP only.
    config.warnings.push_back(fmt::format(
        "{}: 'fsdp_config' is ignored because distributed_type is {}, not FSDP",
        fsdp_section->where(), to_string(config.distributed_type)));
  }
  check_launch_settings(config);
}

}  // namespace tandem::config_detail
