// Interop with an independent implementation: tests/checkpoint/safetensors_interop.py
// parses and writes the format with json + torch.frombuffer, in the peer
// Python (pip's torch 2.13 in .venv/). Skipped when that Python has no torch.

#include <stdio.h>
#include <sys/wait.h>

#include <cstdlib>

#include "checkpoint/safetensors_test_util.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem {
namespace {

using testing::formula_specs;
using testing::formula_tensor;
using testing::ScratchDir;

const char* kPython = TANDEM_PEER_PYTHON;

std::string script_path() {
  const std::string here = __FILE__;
  return here.substr(0, here.rfind('/')) + "/safetensors_interop.py";
}

// Runs `command`, returning its exit code and stdout+stderr in `output`.
int run(const std::string& command, std::string& output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool python_has_torch() {
  std::string ignored;
  return run(std::string(kPython) + " -c 'import torch'", ignored) == 0;
}

TEST(SafetensorsInterop, PythonReadsWhatTandemWrites) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch";
  ScratchDir dir;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& spec : formula_specs()) {
    tensors.emplace_back(spec.name, formula_tensor(spec.dtype, spec.shape));
  }
  const std::string path = dir.file("from_tandem.safetensors");
  write_safetensors(path, tensors, {{"writer", "tandem"}});
  std::string output;
  const int code = run(std::string(kPython) + " " + script_path() + " check '" + path + "'", output);
  EXPECT_EQ(code, 0) << output;
  EXPECT_NE(output.find("ok 12 tensors"), std::string::npos) << output;
}

TEST(SafetensorsInterop, TandemReadsWhatPythonWrites) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch";
  ScratchDir dir;
  const std::string path = dir.file("from_python.safetensors");
  std::string output;
  ASSERT_EQ(run(std::string(kPython) + " " + script_path() + " write '" + path + "'", output), 0)
      << output;
  SafetensorsReader reader(path);
  EXPECT_FALSE(reader.has_checksums());
  EXPECT_EQ(reader.metadata(), (std::map<std::string, std::string>{{"writer", "python"}}));
  ASSERT_EQ(reader.entries().size(), formula_specs().size());
  for (const auto& spec : formula_specs()) {
    const at::Tensor got = reader.read(spec.name);
    EXPECT_EQ(got.scalar_type(), spec.dtype) << spec.name;
    EXPECT_TRUE(at::equal(got, formula_tensor(spec.dtype, spec.shape))) << spec.name;
  }
}

}  // namespace
}  // namespace tandem
