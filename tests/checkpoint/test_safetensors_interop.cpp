// Interop with an independent implementation: tests/checkpoint/safetensors_interop.py
// parses and writes the format with json + torch.frombuffer, in the peer
// Python (pip's torch 2.13 in .venv/), and with the safetensors package's
// save_file / load_file. Skipped when that Python has no torch (or package).

#include <cstdlib>

#include "checkpoint/safetensors_test_util.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem {
namespace {

using testing::formula_specs;
using testing::formula_tensor;
using testing::ScratchDir;

const char* kPython = TANDEM_PEER_PYTHON;

bool python_has_torch() { return testing::peer_can_import("torch"); }

bool python_has_safetensors() { return testing::peer_can_import("safetensors.torch"); }

// The tensor's bytes, flat.
at::Tensor bits(const at::Tensor& t) { return t.contiguous().reshape({-1}).view(at::kByte); }

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
  const int code = testing::run_interop("check '" + path + "'", output);
  EXPECT_EQ(code, 0) << output;
  EXPECT_NE(output.find("ok " + std::to_string(formula_specs().size()) + " tensors"),
            std::string::npos)
      << output;
}

TEST(SafetensorsInterop, TandemReadsWhatPythonWrites) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch";
  ScratchDir dir;
  const std::string path = dir.file("from_python.safetensors");
  std::string output;
  ASSERT_EQ(testing::run_interop("write '" + path + "'", output), 0)
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

// Every dtype, U16/U32/U64 and the float8 types included, through the
// safetensors package itself: Python's save_file writes, tandem reads the
// same bits.
TEST(SafetensorsInterop, TandemReadsTheBitsSafetensorsSaveFileWritesInEveryDtype) {
  if (!python_has_safetensors()) GTEST_SKIP() << kPython << " has no safetensors package";
  ScratchDir dir;
  const std::string path = dir.file("save_file.safetensors");
  std::string output;
  ASSERT_EQ(testing::run_interop("save_file '" + path + "'", output), 0)
      << output;
  SafetensorsReader reader(path);
  ASSERT_EQ(reader.entries().size(), formula_specs().size());
  for (const auto& spec : formula_specs()) {
    const at::Tensor got = reader.read(spec.name);
    EXPECT_EQ(got.scalar_type(), spec.dtype) << spec.name;
    EXPECT_EQ(got.sizes().vec(), spec.shape) << spec.name;
    EXPECT_TRUE(at::equal(bits(got), bits(formula_tensor(spec.dtype, spec.shape)))) << spec.name;
  }
}

// And the reverse: tandem writes, Python's load_file gives the same bits.
TEST(SafetensorsInterop, SafetensorsLoadFileReadsTheBitsTandemWritesInEveryDtype) {
  if (!python_has_safetensors()) GTEST_SKIP() << kPython << " has no safetensors package";
  ScratchDir dir;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& spec : formula_specs()) {
    tensors.emplace_back(spec.name, formula_tensor(spec.dtype, spec.shape));
  }
  const std::string path = dir.file("from_tandem.safetensors");
  write_safetensors(path, tensors);
  std::string output;
  EXPECT_EQ(testing::run_interop("load_file '" + path + "'", output), 0)
      << output;
  EXPECT_NE(output.find("ok load_file reads " + std::to_string(tensors.size()) + " tensors"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace tandem
