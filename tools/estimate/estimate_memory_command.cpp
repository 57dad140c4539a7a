// `tandem estimate-memory`: model-state bytes per rank for DDP and ZeRO.

#include "estimate/estimate_memory_command.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "estimate/estimate_memory.h"
#include "cli_parse.h"
#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

constexpr const char* kFooter =
    "Bytes per parameter (Adam):   params  gradients  optimizer states\n"
    "  fp16 or bf16 mixed precision    2        2      12: fp32 master weights + 2 moments\n"
    "  fp32 (--mixed-precision no)     4        4       8: 2 moments (params are the master)\n"
    "Per rank, with P parameters over N ranks (a shard, P/N, is ceil(P/N) elements):\n"
    "  DDP     all replicated            fp16: 2P + 2P + 12P        fp32: 4P + 4P + 8P\n"
    "  ZeRO-1  optimizer states sharded  fp16: 2P + 2P + 12P/N      fp32: 4P + 4P + 8P/N\n"
    "  ZeRO-2  + gradients sharded       fp16: 2P + 2P/N + 12P/N    fp32: 4P + 4P/N + 8P/N\n"
    "  ZeRO-3  + parameters sharded      fp16: 2P/N + 2P/N + 12P/N  fp32: 4P/N + 4P/N + 8P/N\n"
    "\n"
    "--offload adds DeepSpeed's offload_optimizer (device cpu) for stages 1-3: the optimizer\n"
    "step runs on the host, which keeps per rank the fp32 gradient shard (4P/N) and fp32\n"
    "weights + moments (12P/N, in fp32 training too): 16P/N. The device keeps its parameters,\n"
    "and in stage 1, which does not shard gradients, its full gradients. Stage 3 with\n"
    "offload_param too (\"offload optimizer+param\") also moves the parameter shard to the\n"
    "host (+2P/N; +4P/N in fp32) and leaves no model states on the device.\n"
    "\n"
    "Not counted: activations, communication buckets, the layers ZeRO-3 gathers to compute,\n"
    "allocator fragmentation.\n"
    "\n"
    "Example (the ZeRO paper's 7.5B model on 64 GPUs: 120 / 31.4 / 16.6 / 1.9 GB):\n"
    "  tandem estimate-memory --params 7.5e9 --world-size 64 --mixed-precision fp16";

// "1,234,567".
std::string with_commas(int64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Decimal units with one decimal ("31.4 GB"), so small models read as MB
// rather than 0.0 GB.
std::string human_bytes(int64_t bytes) {
  if (bytes < 1000) return std::to_string(bytes) + " B";
  const char* units[] = {"kB", "MB", "GB", "TB", "PB"};
  double value = static_cast<double>(bytes) / 1000;
  size_t unit = 0;
  while (value >= 1000 && unit + 1 < std::size(units)) {
    value /= 1000;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, units[unit]);
}

nlohmann::ordered_json bytes_json(const ModelStateBytes& bytes) {
  return {{"params", bytes.params},
          {"gradients", bytes.gradients},
          {"optimizer_states", bytes.optimizer_states}};
}

std::string to_json(const MemoryEstimateOptions& options, std::optional<int> gpus_per_node,
                    const std::vector<StrategyEstimate>& estimates) {
  nlohmann::ordered_json out;
  out["params"] = options.params;
  out["world_size"] = options.world_size;
  out["mixed_precision"] = to_string(options.mixed_precision);
  if (gpus_per_node) out["gpus_per_node"] = *gpus_per_node;
  out["optimizer"] = "adam";
  for (const auto& e : estimates) {
    nlohmann::ordered_json entry;
    entry["model_state_bytes"] = e.device.total();
    entry["host_bytes"] = e.host.total();
    if (gpus_per_node) entry["host_bytes_per_node"] = e.host.total() * *gpus_per_node;
    entry["device"] = bytes_json(e.device);
    entry["host"] = bytes_json(e.host);
    entry["device_formula"] = e.device_formula;
    entry["host_formula"] = e.host_formula;
    out[e.key] = entry;
  }
  return out.dump(2) + "\n";
}

std::string to_text(const MemoryEstimateOptions& options, std::optional<int> gpus_per_node,
                    const std::vector<StrategyEstimate>& estimates) {
  std::vector<std::vector<std::string>> table;
  // Only the offload variants put model states on the host, so the host
  // columns come with --offload.
  const bool host_columns = options.offload;
  const bool node_column = host_columns && gpus_per_node.has_value();
  std::vector<std::string> header = {"strategy", "device/rank"};
  if (host_columns) header.push_back("host/rank");
  if (node_column) header.push_back("host/node");
  const size_t number_columns = header.size();
  header.push_back("device formula");
  if (host_columns) header.push_back("host formula");
  table.push_back(header);
  for (const auto& e : estimates) {
    const bool on_host = e.host.total() > 0;
    std::vector<std::string> row = {e.label, human_bytes(e.device.total())};
    if (host_columns) row.push_back(on_host ? human_bytes(e.host.total()) : "-");
    if (node_column) row.push_back(on_host ? human_bytes(e.host.total() * *gpus_per_node) : "-");
    row.push_back(e.device_formula);
    if (host_columns) row.push_back(on_host ? e.host_formula : "-");
    table.push_back(row);
  }

  std::vector<size_t> widths(header.size(), 0);
  for (const auto& row : table) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  const bool mixed = options.mixed_precision != MixedPrecision::kNo;
  std::string out = fmt::format(
      "Model states per rank: P = {} parameters, N = {} ranks, {}, Adam\n\n",
      with_commas(options.params), options.world_size,
      mixed ? fmt::format("{} mixed precision", to_string(options.mixed_precision))
            : std::string("fp32"));
  for (const auto& row : table) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      // The strategy and the formulas read left to right; byte counts align right.
      const bool is_number = c > 0 && c < number_columns;
      if (c > 0) line += "  ";
      line += is_number ? fmt::format("{:>{}}", row[c], widths[c])
                        : fmt::format("{:<{}}", row[c], widths[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  out += fmt::format(
      "\nFormula terms are bytes per parameter: params + gradients + optimizer states ({}).\n"
      "P/N rounds up. GB = 10^9 bytes. Activations and working buffers come on top.\n",
      mixed ? "2 + 2 + 12" : "4 + 4 + 8");
  if (!options.offload) out += "Add --offload for DeepSpeed's CPU offload variants.\n";
  return out;
}

}  // namespace

int run_estimate_memory_command(int argc, char** argv) {
  CLI::App app{
      "Estimate the memory each rank needs for the model states (parameters, gradients and "
      "Adam optimizer state) under DDP and ZeRO stages 1, 2 and 3, with the ZeRO paper's "
      "formulas.",
      "tandem estimate-memory"};
  std::string params_text;
  int world_size = 1;
  std::string precision = "no";
  bool offload = false;
  std::optional<int> gpus_per_node;
  bool json = false;
  app.add_option("--params", params_text,
                 "number of parameters: 7.5e9, 7B, 1.3b, 125M, 13k or 1000000")
      ->required();
  app.add_option("--world-size", world_size, "number of ranks (GPUs) the states are sharded over")
      ->capture_default_str();
  app.add_option("--mixed-precision", precision,
                 "no (fp32), fp16 or bf16: 16 bytes per parameter either way, split differently")
      ->capture_default_str();
  app.add_flag("--offload", offload,
               "also show ZeRO with offload_optimizer (stages 1-3) and offload_param (stage 3) "
               "to the CPU, with the host memory they need");
  app.add_option("--gpus-per-node", gpus_per_node,
                 "ranks per node (a divisor of --world-size), with --offload only: also "
                 "show the host memory per node");
  app.add_flag("--json", json, "print one JSON object instead of the table");
  app.footer(kFooter);
  if (auto code = parse_cli(app, argc, argv)) return *code;

  MemoryEstimateOptions options;
  options.params = parse_param_count(params_text);
  TANDEM_CHECK_ARG(world_size >= 1, "--world-size must be at least 1, got {}", world_size);
  options.world_size = world_size;
  try {
    options.mixed_precision = parse_mixed_precision(precision);
  } catch (const UsageError&) {
    TANDEM_THROW(UsageError, "--mixed-precision: '{}' is not valid; use no (fp32), fp16 or bf16",
                 precision);
  }
  options.offload = offload;
  if (gpus_per_node) {
    TANDEM_CHECK_ARG(offload,
                     "--gpus-per-node only adds the host memory per node of the offload rows; "
                     "add --offload to see them, or drop --gpus-per-node");
    TANDEM_CHECK_ARG(*gpus_per_node >= 1 && *gpus_per_node <= world_size &&
                         world_size % *gpus_per_node == 0,
                     "--gpus-per-node {} does not split --world-size {} into whole nodes; give "
                     "a divisor of the world size (e.g. --world-size 64 --gpus-per-node 8)",
                     *gpus_per_node, world_size);
  }

  const auto estimates = estimate_model_states(options);
  const std::string out = json ? to_json(options, gpus_per_node, estimates)
                                : to_text(options, gpus_per_node, estimates);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace tandem::cli
