// `tandem checkpoint`: what a checkpoint directory holds, and its weights as
// one safetensors file (DeepSpeed's zero_to_fp32, for any strategy).

#include "checkpoint/checkpoint_command.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <optional>

#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_parse.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/core/error.h"

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

int merge(const std::string& dir, const std::string& out, const std::string& tag,
          const std::string& dtype_text) {
  const at::ScalarType dtype = parse_dtype(dtype_text);
  CheckpointReader checkpoint(dir, tag);
  const auto& meta = checkpoint.meta();
  std::vector<SafetensorsSpec> specs;
  for (const char* kind : {"parameters", "buffers"}) {
    for (const auto& t : meta.at(kind)) {
      specs.push_back({t.at("name").get<std::string>(),
                       output_dtype(t.at("dtype").get<std::string>(), dtype),
                       t.at("shape").get<std::vector<int64_t>>()});
    }
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"checkpoint_tag", checkpoint.tag()},
      {"checkpoint_step", std::to_string(meta.value("step", int64_t{0}))}};
  const std::string tmp = out + ".tmp";
  SafetensorsStreamWriter writer(tmp, specs, metadata);
  std::size_t index = 0;
  for (const auto& t : meta.at("parameters")) {
    const auto& spec = specs[index++];
    // fp32 output comes from the fp32 masters when the run kept them: the
    // weights the optimizer really holds, as zero_to_fp32 gives.
    const bool from_master = spec.dtype == at::kFloat && checkpoint.has("master", spec.name);
    at::Tensor value =
        checkpoint.read_whole(from_master ? "master" : "model", spec.name, spec.shape);
    writer.write(spec.name, value.to(spec.dtype));
    (void)t;
  }
  for (const auto& t : meta.at("buffers")) {
    const auto& spec = specs[index++];
    std::optional<at::Tensor> value = checkpoint.read_rank_tensor(0, "buffer/" + spec.name);
    if (!value) {
      TANDEM_THROW(CheckpointError, "checkpoint '{}' lists buffer '{}' but rank 0's file lacks it",
                   checkpoint.path(), spec.name);
    }
    writer.write(spec.name, value->to(spec.dtype));
    (void)t;
  }
  const SafetensorsWriteResult written = writer.finish(/*sync=*/true);
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    TANDEM_THROW(CheckpointError, "cannot rename '{}' to '{}': {}", tmp, out,
                 std::strerror(errno));
  }
  std::printf("merged %s/%s (step %ld, %zu tensors) into %s: %.1f MB %s\n", dir.c_str(),
              checkpoint.tag().c_str(), static_cast<long>(meta.value("step", int64_t{0})),
              specs.size(), out.c_str(), static_cast<double>(written.bytes) / 1e6,
              dtype_text.c_str());
  return 0;
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
    row["strategy"] = stage > 0 ? fmt::format("zero{}", stage) : meta.value("strategy", "");
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

}  // namespace

int run_checkpoint_command(int argc, char** argv) {
  CLI::App app("Inspect tandem checkpoints, or merge one into a single safetensors file",
               "tandem checkpoint");
  app.require_subcommand(1);
  std::string dir, out, tag, dtype = "fp32";
  bool json = false;
  CLI::App* merge_cmd = app.add_subcommand(
      "merge",
      "write the consolidated weights of a checkpoint (any world size, DDP or ZeRO 1-3) as "
      "one safetensors file keyed by module path, like DeepSpeed's zero_to_fp32");
  merge_cmd->add_option("DIR", dir, "checkpoint directory (holds `latest` and tags)")->required();
  merge_cmd->add_option("OUT", out, "output .safetensors file")->required();
  merge_cmd->add_option("--tag", tag, "tag to merge (default: the one `latest` names)");
  merge_cmd->add_option("--dtype", dtype, "fp32 (default; from fp32 masters when saved), bf16, fp16");
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect", "list the tags: step, world size, strategy, dtype, sizes");
  inspect_cmd->add_option("DIR", dir, "checkpoint directory")->required();
  inspect_cmd->add_flag("--json", json, "machine-readable output");
  if (auto code = parse_cli(app, argc, argv)) return *code;
  if (merge_cmd->parsed()) return merge(dir, out, tag, dtype);
  return inspect(dir, json);
}

}  // namespace tandem::cli
