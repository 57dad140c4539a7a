#pragma once
// Helpers shared by the safetensors tests: a scratch directory, raw file
// bytes, and tensors from a closed-form formula that the Python interop
// script (safetensors_interop.py) computes the same way.

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "support/scratch_dir.h"
#include "support/subprocess.h"

namespace tandem::testing {

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file from a header text (space-padded to 8 bytes) and data.
inline std::string safetensors_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

// The test formula: bool i % 3 == 0; float8 e8m0 2^(i % 16 - 8) (it holds
// only powers of two); other floating i / 4 - 3 (exact in F64 to BF16, and
// rounded the same way by Python's torch in the float8 types); unsigned
// (7i + 3) % 200; signed (7i + 3) % 200 - 100.
inline at::Tensor formula_tensor(at::ScalarType dtype, at::IntArrayRef shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const at::Tensor i = at::arange(n, at::TensorOptions().dtype(at::kDouble));
  at::Tensor v;
  if (dtype == at::kBool) {
    v = at::remainder(i, 3).eq(0);
  } else if (dtype == at::kFloat8_e8m0fnu) {
    v = at::exp2(at::remainder(i, 16) - 8);
  } else if (at::isFloatingType(dtype)) {
    v = i * 0.25 - 3.0;
  } else if (dtype == at::kByte || c10::isBarebonesUnsignedType(dtype)) {
    v = at::remainder(i * 7 + 3, 200);
  } else {
    v = at::remainder(i * 7 + 3, 200) - 100;
  }
  return v.to(dtype).reshape(shape);
}

struct FormulaSpec {
  const char* name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

// Every dtype, a 0-d and an empty tensor.
inline std::vector<FormulaSpec> formula_specs() {
  return {{"f64", at::kDouble, {2, 3}},    {"f32", at::kFloat, {4, 5, 6}},
          {"f16", at::kHalf, {3, 8}},      {"bf16", at::kBFloat16, {24}},
          {"i64", at::kLong, {5}},         {"i32", at::kInt, {2, 2}},
          {"i16", at::kShort, {7}},        {"i8", at::kChar, {9}},
          {"u8", at::kByte, {10}},         {"bool", at::kBool, {11}},
          {"u64", at::kUInt64, {3}},       {"u32", at::kUInt32, {2, 3}},
          {"u16", at::kUInt16, {5}},       {"f8_e4m3", at::kFloat8_e4m3fn, {4, 6}},
          {"f8_e5m2", at::kFloat8_e5m2, {25}},
          {"f8_e4m3fnuz", at::kFloat8_e4m3fnuz, {7}},
          {"f8_e5m2fnuz", at::kFloat8_e5m2fnuz, {2, 4}},
          {"f8_e8m0", at::kFloat8_e8m0fnu, {20}},
          {"scalar", at::kFloat, {}},      {"empty", at::kFloat, {0, 3}}};
}

// Runs tests/checkpoint/`script` with `args` under the peer Python
// (TANDEM_PEER_PYTHON); its exit code, stdout+stderr in `output`.
inline int run_peer_script(const std::string& script_name, const std::string& args,
                           std::string& output) {
  const std::string here = __FILE__;
  const std::string script = here.substr(0, here.rfind('/')) + "/" + script_name;
  return run_shell_capture(std::string(TANDEM_PEER_PYTHON) + " " + script + " " + args + " 2>&1",
                           output);
}

// deepspeed_resume_reference.py's run at ZeRO `stage` on `world` ranks,
// `variant` "" (AdamW from the config), "bf16" or "sgd" (the program's own
// torch.optim.SGD with momentum): a folder with ds/ (DeepSpeed's
// checkpoint), data.safetensors and continued.safetensors. The first call
// for a world size makes every run the tests use at that size in one
// torchrun launch (ZeRO 1, 2, 3, bf16 ZeRO-2 and SGD ZeRO-2 on 2 ranks;
// ZeRO 2 and 3 on 3): importing torch and DeepSpeed in each rank is most of
// a run's CPU time. The folders are shared by the tests of one process and
// removed at exit. Null when the launch failed, its output then in `output`.
inline const ScratchDir* deepspeed_reference_run(int stage, std::string& output, int world = 2,
                                                 const std::string& variant = "") {
  struct Run {
    int stage;
    std::string variant;
  };
  using Key = std::tuple<int, int, std::string>;
  static std::map<Key, std::unique_ptr<ScratchDir>> runs;
  static std::map<int, bool> launched;  // world -> whether its launch succeeded
  if (!launched.count(world)) {
    const std::vector<Run> wanted =
        world == 2 ? std::vector<Run>{{1, ""}, {2, ""}, {3, ""}, {2, "bf16"}, {2, "sgd"}}
                   : std::vector<Run>{{2, ""}, {3, ""}};
    std::string args = "run world=" + std::to_string(world);
    std::vector<std::pair<Key, std::unique_ptr<ScratchDir>>> made;
    for (const Run& run : wanted) {
      auto dir = std::make_unique<ScratchDir>();
      args += " '" + dir->path() + "' " + std::to_string(run.stage) + run.variant;
      made.emplace_back(Key(world, run.stage, run.variant), std::move(dir));
    }
    launched[world] = run_peer_script("deepspeed_resume_reference.py", args, output) == 0;
    if (launched[world]) {
      for (auto& [key, dir] : made) runs.emplace(key, std::move(dir));
    }
  }
  const auto it = runs.find(Key(world, stage, variant));
  if (it == runs.end()) {
    if (output.empty()) output = "no reference run for this stage and world (see above)";
    return nullptr;
  }
  return it->second.get();
}

// safetensors_interop.py (an independent reader and writer of the format).
inline int run_interop(const std::string& args, std::string& output) {
  return run_peer_script("safetensors_interop.py", args, output);
}

// Whether the peer Python can import `module` (torch, safetensors.torch),
// asked once per module and test process: importing deepspeed alone costs
// about 7 s of CPU, and each interop test asks before it starts.
inline bool peer_can_import(const std::string& module) {
  static std::map<std::string, bool> known;
  const auto it = known.find(module);
  if (it != known.end()) return it->second;
  const std::string command =
      std::string(TANDEM_PEER_PYTHON) + " -c 'import " + module + "' >/dev/null 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  const bool can = pipe != nullptr && ::pclose(pipe) == 0;
  known.emplace(module, can);
  return can;
}

}  // namespace tandem::testing
