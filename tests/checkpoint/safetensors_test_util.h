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

// deepspeed_resume_reference.py's run at ZeRO `stage` on 2 ranks: a folder
// with ds/ (DeepSpeed's checkpoint), data.safetensors and
// continued.safetensors. Made once per test process, the first time a test
// asks (each run starts torchrun and DeepSpeed ranks: tens of seconds on a
// busy 2-core box), shared by the tests that only read it, removed at exit.
// Null when the run failed, its output then in `output`.
inline const ScratchDir* deepspeed_reference_run(int stage, std::string& output) {
  static std::map<int, std::unique_ptr<ScratchDir>> runs;
  const auto it = runs.find(stage);
  if (it != runs.end()) return it->second.get();
  auto dir = std::make_unique<ScratchDir>();
  if (run_peer_script("deepspeed_resume_reference.py",
                      "run '" + dir->path() + "' " + std::to_string(stage), output) != 0) {
    return nullptr;
  }
  return runs.emplace(stage, std::move(dir)).first->second.get();
}

// safetensors_interop.py (an independent reader and writer of the format).
inline int run_interop(const std::string& args, std::string& output) {
  return run_peer_script("safetensors_interop.py", args, output);
}

// Whether the peer Python can import `module` (torch, safetensors.torch).
inline bool peer_can_import(const std::string& module) {
  const std::string command =
      std::string(TANDEM_PEER_PYTHON) + " -c 'import " + module + "' >/dev/null 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  return pipe != nullptr && ::pclose(pipe) == 0;
}

}  // namespace tandem::testing
