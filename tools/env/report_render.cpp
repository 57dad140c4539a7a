// Renders a SystemReport as aligned text (like ds_report) or JSON.

#include "env/system_probe.h"

#include <sstream>

#include <fmt/format.h>

#include "tandem/core/version.h"

namespace tandem::cli {

nlohmann::json to_json(const SystemReport& report) {
  using nlohmann::json;
  json devices = json::array();
  for (const auto& device : report.cuda_devices) {
    devices.push_back(
        {{"index", device.index},
         {"name", device.name},
         {"total_memory", device.total_memory < 0 ? json() : json(device.total_memory)}});
  }
  json flags = json::object();
  for (const auto& [flag, present] : report.cpu_flags) flags[flag] = present;
  json bf16;  // null when not probed
  if (report.cpu_bf16) {
    bf16 = {{"native", report.cpu_bf16->native},
            {"reason", report.cpu_bf16->reason},
            {"bf16_over_fp32_matmul_time", report.cpu_bf16->slowdown}};
  }
  json settings = json::object();
  for (const auto& [key, value] : report.torch_build_settings) settings[key] = value;
  const BlasInfo& blas = report.blas;
  const RankEnv& env = report.rank_env;
  auto or_null = [](const std::string& text) { return text.empty() ? json() : json(text); };
  return {
      {"versions",
       {{"tandem", report.tandem_version},
        {"libtorch", report.torch_version.empty() ? report.torch_built_against
                                                  : report.torch_version},
        {"libtorch_built_against", report.torch_built_against},
        {"libtorch_library", or_null(report.torch_library)},
        {"cuda", or_null(report.torch_cuda)},
        {"cudnn", or_null(report.torch_cudnn)},
        {"nccl", or_null(report.torch_nccl)},
        {"cxx_abi", report.cxx_abi},
        {"libtorch_cxx_abi", report.torch_cxx_abi},
        {"compiler", report.compiler},
        {"cxx_standard", report.cxx_standard},
        {"build_type", report.build_type}}},
      {"backends",
       {{"gloo", report.gloo},
        {"nccl", report.nccl},
        {"mpi", report.mpi},
        {"tandem_cuda_kernels", report.cuda_kernels}}},
      {"cuda",
       {{"available", report.cuda_available},
        {"device_count", report.cuda_device_count},
        {"devices", devices}}},
      {"libtorch", {{"cpu_capability", report.aten_cpu_capability}, {"build_settings", settings}}},
      {"platform",
       {{"os", or_null(report.os)},
        {"kernel", or_null(report.kernel)},
        {"libc", or_null(report.libc)},
        {"memory_bytes", report.memory_bytes < 0 ? json() : json(report.memory_bytes)}}},
      {"cpu",
       {{"model", report.cpu_model},
        {"logical_cpus", report.logical_cpus},
        {"usable_cpus", report.usable_cpus},
        {"flags", flags},
        {"bf16", bf16}}},
      {"threads",
       {{"intra_op", report.intra_op_threads},
        {"inter_op", report.inter_op_threads},
        {"omp_num_threads", or_null(report.omp_num_threads)}}},
      {"blas",
       {{"vendor", blas.vendor},
        {"variant", or_null(blas.variant)},
        {"library", or_null(blas.library)},
        {"mapped_libraries", blas.mapped_libraries},
        {"openblas_config", or_null(blas.openblas_config)},
        {"openblas_num_threads",
         blas.openblas_num_threads < 0 ? json() : json(blas.openblas_num_threads)},
        {"gemm_gflops", blas.gemm_gflops},
        {"warning", or_null(blas.warning)}}},
      {"rank_env",
       {{"error", or_null(report.rank_env_error)},
        {"source", to_string(env.source)},
        {"rank", env.rank},
        {"local_rank", env.local_rank},
        {"world_size", env.world_size},
        {"local_world_size", env.local_world_size},
        {"node_rank", env.node_rank},
        {"master_addr", env.master_addr},
        {"master_port", env.master_port},
        {"agent_store", env.agent_store},
        {"restart_count", env.restart_count},
        {"socket_ifname", or_null(env.socket_ifname)}}},
      {"config",
       {{"file", or_null(report.config_file)},
        {"source", report.config_source},
        {"searched", report.config_searched}}},
      {"warnings", report_warnings(report)},
  };
}

std::string to_text(const SystemReport& report) {
  constexpr size_t kKeyWidth = 28;
  std::string out;
  auto heading = [&out](const std::string& title) {
    out += "\n" + title + "\n" + std::string(title.size(), '-') + "\n";
  };
  auto line = [&out](const std::string& key, const std::string& value) {
    // "key ......... value"; an empty key continues the previous value.
    std::string lead =
        key.empty()
            ? std::string(kKeyWidth + 2, ' ')
            : key + " " + std::string(kKeyWidth - std::min(kKeyWidth - 1, key.size()), '.') + " ";
    out += "  " + lead + value + "\n";
  };
  auto yes_no = [](bool value) { return std::string(value ? "yes" : "no"); };
  auto or_text = [](const std::string& text, const char* fallback) {
    return text.empty() ? std::string(fallback) : text;
  };

  out += "tandem environment report\n=========================\n";
  heading("versions");
  line("tandem", report.tandem_version);
  line("libtorch", or_text(report.torch_version, "unknown"));
  line("libtorch built against", report.torch_built_against);
  line("libtorch library", or_text(report.torch_library, "unknown"));
  line("cuda (libtorch's)", or_text(report.torch_cuda, "none (CPU build)"));
  line("cudnn", or_text(report.torch_cudnn, "none"));
  line("nccl", or_text(report.torch_nccl, "none"));
  line("c++ abi (tandem/libtorch)", report.cxx_abi + " / " + report.torch_cxx_abi);
  line("compiler", report.compiler);
  line("c++ standard", report.cxx_standard);
  line("build type", report.build_type);

  heading("backends and devices");
  line("gloo", yes_no(report.gloo));
  line("nccl", yes_no(report.nccl));
  line("mpi", yes_no(report.mpi));
  line("tandem cuda kernels", yes_no(report.cuda_kernels));
  line("cuda available", yes_no(report.cuda_available));
  line("cuda devices", std::to_string(report.cuda_device_count));
  for (const auto& device : report.cuda_devices) {
    std::string memory =
        device.total_memory < 0 ? "" : " (" + std::to_string(device.total_memory >> 20) + " MiB)";
    line("cuda:" + std::to_string(device.index),
         or_text(device.name, "(name unavailable)") + memory);
  }

  heading("machine");
  line("os", or_text(report.os, "unknown"));
  line("kernel", or_text(report.kernel, "unknown"));
  line("c library", or_text(report.libc, "unknown"));
  line("memory", report.memory_bytes < 0
                     ? std::string("unknown")
                     : fmt::format("{:.1f} GiB", static_cast<double>(report.memory_bytes) /
                                                     (1024.0 * 1024 * 1024)));

  heading("cpu and libtorch build");
  line("cpu model", or_text(report.cpu_model, "unknown"));
  line("cpus (usable/logical)",
       std::to_string(report.usable_cpus) + "/" + std::to_string(report.logical_cpus));
  std::string present, missing;
  for (const auto& [flag, has] : report.cpu_flags) {
    std::string& list = has ? present : missing;
    list += (list.empty() ? "" : " ") + flag;
  }
  line("cpu flags present", or_text(present, "none"));
  line("cpu flags missing", or_text(missing, "none"));
  if (report.cpu_bf16) {
    const auto& bf16 = *report.cpu_bf16;
    line("bf16 matmul", fmt::format("{} ({}; {:.1f}x the fp32 time of 64x128 by 128x128)",
                                    bf16.native ? "native" : "emulated", bf16.reason,
                                    bf16.slowdown));
  }
  line("aten cpu capability", or_text(report.aten_cpu_capability, "unknown"));
  for (const auto& [key, value] : report.torch_build_settings) line(key, value);

  heading("blas and threads");
  const BlasInfo& blas = report.blas;
  line("blas in use", blas.vendor + (blas.variant.empty() ? "" : " (" + blas.variant + ")"));
  line("sgemm_ from", or_text(blas.library, "(not exported)"));
  for (size_t i = 0; i < blas.mapped_libraries.size(); ++i) {
    line(i == 0 ? "mapped blas/lapack" : "", blas.mapped_libraries[i]);
  }
  // OpenBLAS can be loaded only as a LAPACK dependency while another BLAS
  // serves sgemm_; say so, or its config line reads as the BLAS in use.
  std::string note = blas.vendor == "OpenBLAS" ? "" : " (loaded, not serving sgemm_)";
  if (!blas.openblas_config.empty()) line("openblas config", blas.openblas_config + note);
  if (blas.openblas_num_threads >= 0) {
    line("openblas threads", std::to_string(blas.openblas_num_threads));
  }
  line("sgemm 256x256", fmt::format("{:.1f} GFLOP/s", blas.gemm_gflops));
  line("intra-op threads", std::to_string(report.intra_op_threads));
  line("inter-op threads", std::to_string(report.inter_op_threads));
  line("OMP_NUM_THREADS", or_text(report.omp_num_threads, "(unset)"));

  heading("rank environment");
  const RankEnv& env = report.rank_env;
  if (!report.rank_env_error.empty()) {
    line("error", report.rank_env_error);
  } else {
    line("source", to_string(env.source));
    line("rank / world size", std::to_string(env.rank) + "/" + std::to_string(env.world_size));
    line("local rank / local world",
         std::to_string(env.local_rank) + "/" + std::to_string(env.local_world_size));
    line("node rank", std::to_string(env.node_rank));
    line("master", env.master_addr + ":" + std::to_string(env.master_port));
    line("agent store", yes_no(env.agent_store));
    line("restart count", std::to_string(env.restart_count));
    line("socket interface", or_text(env.socket_ifname, "(auto)"));
  }

  heading("config");
  line("config file", report.config_file.empty()
                          ? "none"
                          : report.config_file + " (" + report.config_source + ")");
  for (size_t i = 0; i < report.config_searched.size(); ++i) {
    line(i == 0 ? "searched" : "", report.config_searched[i]);
  }

  for (const auto& warning : report_warnings(report)) out += "\nWARNING: " + warning + "\n";
  return out;
}

}  // namespace tandem::cli
