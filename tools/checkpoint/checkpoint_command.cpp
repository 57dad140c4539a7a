// `tandem checkpoint`: what a checkpoint directory holds, and its weights as
// one safetensors file (DeepSpeed's zero_to_fp32, for any strategy) or as a
// Hugging Face sharded set (--max-shard-size).

#include "checkpoint/checkpoint_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli_parse.h"
#include "tandem/accelerate/deepspeed_import.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/safetensors_set.h"
#include "tandem/checkpoint/torch_import.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem::cli {
namespace {

at::ScalarType parse_dtype(const std::string& text) {
  if (text == "fp32" || text == "float32") return at::kFloat;
  if (text == "bf16" || text == "bfloat16") return at::kBFloat16;
  if (text == "fp16" || text == "float16") return at::kHalf;
  TANDEM_THROW(UsageError, "--dtype '{}' is not one of fp32, bf16, fp16", text);
}

const std::map<std::string, at::ScalarType>& dtypes_by_name() {
  static const std::map<std::string, at::ScalarType> names = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  return names;
}

// Floating tensors take the requested dtype; integer buffers keep theirs.
at::ScalarType output_dtype(const std::string& saved, at::ScalarType requested) {
  const at::ScalarType type = dtypes_by_name().at(saved);
  return at::isFloatingType(type) ? requested : type;
}

// The merged tensors of a checkpoint: what to write, and each one's value,
// read from the shards one tensor at a time.
class MergeSource {
 public:
  MergeSource(const std::string& dir, const std::string& tag, at::ScalarType dtype)
      : checkpoint_(dir, tag) {
    const auto& meta = checkpoint_.meta();
    for (const char* kind : {"parameters", "buffers"}) {
      for (const auto& t : meta.at(kind)) {
        specs_.push_back({t.at("name").get<std::string>(),
                          output_dtype(t.at("dtype").get<std::string>(), dtype),
                          t.at("shape").get<std::vector<int64_t>>()});
      }
    }
    parameters_ = meta.at("parameters").size();
  }

  const CheckpointReader& checkpoint() const { return checkpoint_; }
  const std::vector<SafetensorsSpec>& specs() const { return specs_; }
  int64_t step() const { return checkpoint_.meta().value("step", int64_t{0}); }
  std::map<std::string, std::string> metadata() const {
    return {{"format", "pt"},
            {"checkpoint_tag", checkpoint_.tag()},
            {"checkpoint_step", std::to_string(step())}};
  }

  // Tensor `index` of specs(), in its output dtype.
  at::Tensor value(std::size_t index) const {
    const SafetensorsSpec& spec = specs_[index];
    if (index < parameters_) {
      // fp32 output comes from the fp32 masters when the run kept them: the
      // weights the optimizer really holds, as zero_to_fp32 gives.
      const bool from_master = spec.dtype == at::kFloat && checkpoint_.has("master", spec.name);
      return checkpoint_.read_whole(from_master ? "master" : "model", spec.name, spec.shape)
          .to(spec.dtype);
    }
    std::optional<at::Tensor> value = checkpoint_.read_main_tensor("buffer/" + spec.name);
    if (!value) {
      TANDEM_THROW(CheckpointError, "checkpoint '{}' lists buffer '{}' but rank 0's file lacks it",
                   checkpoint_.path(), spec.name);
    }
    return value->to(spec.dtype);
  }

 private:
  CheckpointReader checkpoint_;
  std::vector<SafetensorsSpec> specs_;
  std::size_t parameters_ = 0;
};

int merge_file(const MergeSource& source, const std::string& out, const std::string& dtype_text) {
  const std::string tmp = out + ".tmp";
  SafetensorsStreamWriter writer(tmp, source.specs(), source.metadata());
  for (std::size_t i = 0; i < source.specs().size(); ++i) {
    writer.write(source.specs()[i].name, source.value(i));
  }
  const SafetensorsWriteResult written = writer.finish(/*sync=*/true);
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    TANDEM_THROW(CheckpointError, "cannot rename '{}' to '{}': {}", tmp, out,
                 std::strerror(errno));
  }
  std::printf("merged %s (step %ld, %zu tensors) into %s: %.1f MB %s\n",
              source.checkpoint().path().c_str(), static_cast<long>(source.step()),
              source.specs().size(), out.c_str(), static_cast<double>(written.bytes) / 1e6,
              dtype_text.c_str());
  return 0;
}

bool is_empty_or_missing_directory(const std::string& path) {
  return !fs::exists(path) || fs::is_empty_directory(path);
}

// Hugging Face's sharded layout in `out_dir`: shards of at most `max_bytes`
// of tensor data plus the index (one shard: model.safetensors alone, as
// save_pretrained writes it). Everything is written into a sibling
// temporary directory that is renamed into place once complete, so a
// failed run leaves no files in `out_dir`.
int merge_sharded(const MergeSource& source, const std::string& out_dir, int64_t max_bytes,
                  const std::string& dtype_text) {
  if (!is_empty_or_missing_directory(out_dir)) {
    TANDEM_THROW(UsageError, "'{}' exists and is not an empty directory; merge writes a sharded "
                 "set only into a new or empty directory, so that a set is never mixed with "
                 "older files: remove it or give another path",
                 out_dir);
  }
  const auto& specs = source.specs();
  const SafetensorsSetPlan plan = plan_safetensors_set(specs, max_bytes);
  std::string parent = std::filesystem::path(out_dir).lexically_normal().parent_path().string();
  if (parent.empty()) parent = ".";
  const std::string tmp_dir = fmt::format("{}.tmp-merge-{}", out_dir, ::getpid());
  // Each file-system step fails as a CheckpointError naming the path.
  const auto check = [&](const std::error_code& ec, const char* what, const std::string& path) {
    if (ec) {
      TANDEM_THROW(CheckpointError, "merge into '{}' failed: {} '{}': {}", out_dir, what, path,
                   ec.message());
    }
  };
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  check(ec, "removing", tmp_dir);
  try {
    fs::create_directories(tmp_dir, ec);
    check(ec, "creating", tmp_dir);
    int64_t file_bytes = 0;
    for (std::size_t k = 0; k < plan.shards.size(); ++k) {
      std::vector<SafetensorsSpec> shard_specs;
      for (std::size_t i : plan.shards[k]) shard_specs.push_back(specs[i]);
      SafetensorsStreamWriter writer(tmp_dir + "/" + plan.files[k], shard_specs,
                                     source.metadata());
      for (std::size_t i : plan.shards[k]) {
        writer.write(specs[i].name, source.value(i));  // one tensor in memory at a time
      }
      file_bytes += writer.finish(/*sync=*/true).bytes;
    }
    if (plan.shards.size() > 1) {
      const std::string index = tmp_dir + "/" + kSafetensorsIndexName;
      std::FILE* f = std::fopen(index.c_str(), "w");
      const std::string text = safetensors_index_json(plan.weight_map, plan.total_size);
      if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size() ||
          std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0 || std::fclose(f) != 0) {
        TANDEM_THROW(CheckpointError, "writing '{}' failed: {}", index, std::strerror(errno));
      }
    }
    // rename(2) replaces an empty directory atomically.
    fs::rename(tmp_dir, out_dir, ec);
    check(ec, "renaming to", out_dir);
    if (int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY); fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
    std::printf("merged %s (step %ld, %zu tensors) into %s: %zu file(s)%s, %.1f MB %s\n",
                source.checkpoint().path().c_str(), static_cast<long>(source.step()),
                specs.size(), out_dir.c_str(), plan.shards.size(),
                plan.shards.size() > 1 ? " and model.safetensors.index.json" : "",
                static_cast<double>(file_bytes) / 1e6, dtype_text.c_str());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp_dir, ignored);
    throw;
  }
  return 0;
}

int merge(const std::string& dir, const std::string& out, const std::string& tag,
          const std::string& dtype_text, const std::string& max_shard_size) {
  const at::ScalarType dtype = parse_dtype(dtype_text);
  const int64_t max_bytes = max_shard_size.empty() ? 0 : parse_byte_size(max_shard_size);
  const MergeSource source(dir, tag, dtype);
  if (max_bytes == 0) return merge_file(source, out, dtype_text);
  return merge_sharded(source, out, max_bytes, dtype_text);
}

nlohmann::json describe_tag(const std::string& dir, const std::string& tag) {
  nlohmann::json row = {{"tag", tag}};
  try {
    const nlohmann::json meta = read_checkpoint_meta(dir + "/" + tag);
    int64_t bytes = 0;
    for (const auto& f : meta.at("files")) bytes += f.at("bytes").get<int64_t>();
    int64_t params = 0;
    std::map<std::string, int64_t> dtypes;
    for (const auto& p : meta.at("parameters")) {
      int64_t n = 1;
      for (int64_t d : p.at("shape").get<std::vector<int64_t>>()) n *= d;
      params += n;
      dtypes[p.at("dtype").get<std::string>()] += n;
    }
    std::string dtype;
    for (const auto& [name, n] : dtypes) dtype += (dtype.empty() ? "" : "+") + name;
    const int stage = meta.value("zero_stage", 0);
    row["step"] = meta.value("step", int64_t{0});
    row["world_size"] = meta.at("world_size");
    // HSDP: "hsdp3/2" is stage 3 sharded over groups of 2 ranks.
    row["strategy"] = meta.value("strategy", "") == "hsdp"
                          ? fmt::format("hsdp{}/{}", stage, meta.value("hpz_partition_size", 1))
                      : stage > 0 ? fmt::format("zero{}", stage)
                                  : meta.value("strategy", "");
    row["mixed_precision"] = meta.value("mixed_precision", "no");
    row["dtype"] = dtype;
    row["parameters"] = params;
    row["bytes"] = bytes;
    row["optimizer"] =
        meta.contains("optimizer") ? meta["optimizer"].value("type", "") : std::string("none");
  } catch (const std::exception& e) {
    row["error"] = e.what();
  }
  return row;
}

int inspect(const std::string& dir, bool json) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    TANDEM_THROW(UsageError, "'{}' is not a directory", dir);
  }
  std::optional<std::string> latest;
  std::string latest_error;
  try {
    latest = latest_checkpoint_tag(dir);
  } catch (const CheckpointError& e) {
    latest_error = e.what();
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& tag : checkpoint_tags(dir)) {
    nlohmann::json row = describe_tag(dir, tag);
    row["latest"] = latest && *latest == tag;
    rows.push_back(row);
  }
  if (json) {
    std::printf("%s\n", nlohmann::json{{"directory", dir},
                                       {"latest", latest ? nlohmann::json(*latest) : nullptr},
                                       {"tags", rows}}
                            .dump(1)
                            .c_str());
    return rows.empty() ? 1 : 0;
  }
  if (rows.empty()) {
    std::printf("%s: no committed checkpoints\n", dir.c_str());
    return 1;
  }
  std::printf("%-22s %8s %6s %-9s %-5s %-10s %14s %12s  %s\n", "tag", "step", "world",
              "strategy", "mp", "dtype", "parameters", "size", "optimizer");
  for (const auto& row : rows) {
    const std::string mark = row["latest"].get<bool>() ? "  <- latest" : "";
    if (row.contains("error")) {
      std::printf("%-22s CORRUPT: %s%s\n", row["tag"].get<std::string>().c_str(),
                  row["error"].get<std::string>().c_str(), mark.c_str());
      continue;
    }
    std::printf("%-22s %8ld %6d %-9s %-5s %-10s %14ld %9.1f MB  %s%s\n",
                row["tag"].get<std::string>().c_str(), static_cast<long>(row["step"].get<int64_t>()),
                row["world_size"].get<int>(), row["strategy"].get<std::string>().c_str(),
                row["mixed_precision"].get<std::string>().c_str(),
                row["dtype"].get<std::string>().c_str(),
                static_cast<long>(row["parameters"].get<int64_t>()),
                static_cast<double>(row["bytes"].get<int64_t>()) / 1e6,
                row["optimizer"].get<std::string>().c_str(), mark.c_str());
  }
  if (!latest_error.empty()) std::printf("latest: %s\n", latest_error.c_str());
  return 0;
}

int import_deepspeed(const std::string& source, const std::string& out, const std::string& tag,
                     const std::string& optimizer_type) {
  DeepSpeedImportOptions options;
  options.tag = tag;
  options.optimizer_type = optimizer_type;
  const DeepSpeedImportResult r = import_deepspeed_checkpoint(source, out, options);
  std::printf("imported DeepSpeed ZeRO-%d checkpoint %s/%s (%d ranks, step %ld): %ld parameters "
              "(%ld frozen), %s state [%s]%s, into %s/%s\n",
              r.zero_stage, source.c_str(), r.tag.c_str(), r.world_size,
              static_cast<long>(r.step), static_cast<long>(r.parameters),
              static_cast<long>(r.frozen), r.optimizer_type.c_str(),
              fmt::format("{}", fmt::join(r.optimizer_states, ", ")).c_str(),
              r.scheduler ? ", scheduler" : "", out.c_str(), r.tag.c_str());
  for (const auto& part : r.not_carried) {
    std::printf("not carried over: DeepSpeed's %s (tandem has no place for it)\n",
                part.c_str());
  }
  return 0;
}

}  // namespace

int run_checkpoint_command(int argc, char** argv) {
  CLI::App app("Inspect tandem checkpoints, merge one into a single safetensors file, or "
               "import a torch.save file",
               "tandem checkpoint");
  app.require_subcommand(1);
  std::string dir, out, tag, dtype = "fp32", max_shard_size;
  bool json = false;
  CLI::App* merge_cmd = app.add_subcommand(
      "merge",
      "write the consolidated weights of a checkpoint (any world size, DDP or ZeRO 1-3) as "
      "one safetensors file keyed by module path, like DeepSpeed's zero_to_fp32, or with "
      "--max-shard-size as a Hugging Face sharded set in a directory");
  merge_cmd->add_option("DIR", dir, "checkpoint directory (holds `latest` and tags)")->required();
  merge_cmd->add_option("OUT", out,
                        "output .safetensors file; with --max-shard-size, a new or empty "
                        "output directory")
      ->required();
  merge_cmd->add_option("--max-shard-size", max_shard_size,
                        "write model-0000k-of-0000n.safetensors files of at most this much "
                        "tensor data each, plus model.safetensors.index.json (\"2GB\", "
                        "\"500MB\", \"1GiB\"; a larger tensor gets a file of its own)");
  merge_cmd->add_option("--tag", tag, "tag to merge (default: the one `latest` names)");
  merge_cmd->add_option("--dtype", dtype, "fp32 (default; from fp32 masters when saved), bf16, fp16");
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect", "list the tags: step, world size, strategy, dtype, sizes");
  inspect_cmd->add_option("DIR", dir, "checkpoint directory")->required();
  inspect_cmd->add_flag("--json", json, "machine-readable output");
  std::string source, optimizer_type;
  CLI::App* import_cmd = app.add_subcommand(
      "import",
      "bring a Python checkpoint over, with weights-only semantics (nothing in it is "
      "executed): a DeepSpeed ZeRO checkpoint folder becomes a tandem checkpoint that "
      "load_state resumes from at any world size (weights, optimizer state, step, scheduler, "
      "client state); a torch.save file (a state_dict, pytorch_model.bin, any dict of "
      "tensors) becomes one safetensors file for load_model / load_safetensors");
  import_cmd->add_option("SRC", source,
                         "a DeepSpeed checkpoint folder (holds `latest` and global_step* "
                         "tags), or a torch.save file (.pt, .pth, .bin)")
      ->required();
  import_cmd->add_option("OUT", out,
                         "for a DeepSpeed folder: the tandem checkpoint directory to write "
                         "(the same tag, and `latest`); for a file: the output .safetensors")
      ->required();
  import_cmd->add_option("--tag", tag,
                         "DeepSpeed folder only: the tag to import (default: the one `latest` "
                         "names)");
  import_cmd->add_option("--optimizer-type", optimizer_type,
                         "DeepSpeed folder only: Adam, AdamW, SGD, Adagrad, RMSprop, Lion or "
                         "Lamb, when ds_config does not say (a client optimizer)");
  if (auto code = parse_cli(app, argc, argv)) return *code;
  if (merge_cmd->parsed()) return merge(dir, out, tag, dtype, max_shard_size);
  if (import_cmd->parsed()) {
    if (is_deepspeed_checkpoint(source)) return import_deepspeed(source, out, tag, optimizer_type);
    if (!tag.empty() || !optimizer_type.empty()) {
      std::fprintf(stderr,
                   "tandem checkpoint import: --tag and --optimizer-type apply to a DeepSpeed "
                   "checkpoint folder, and '%s' is not one; drop them to import a torch.save "
                   "file\n",
                   source.c_str());
      return 2;
    }
    const TorchImportResult r = import_torch_save(source, out);
    std::printf("imported %s: %ld tensors (%.1f MB) and %ld other values into %s\n",
                source.c_str(), static_cast<long>(r.tensors),
                static_cast<double>(r.tensor_bytes) / 1e6, static_cast<long>(r.other_values),
                out.c_str());
    return 0;
  }
  return inspect(dir, json);
}

}  // namespace tandem::cli
