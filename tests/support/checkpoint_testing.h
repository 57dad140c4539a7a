#pragma once
// Shared by the checkpoint and Accelerator tests: a temporary directory,
// and the state of a checkpoint read back as plain tensors.

#include <cstdlib>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"

#include "support/scratch_dir.h"

namespace tandem::testing {

// Every tensor of every rank file of DIR/<tag>, keyed "<rank>:<key>".
inline std::map<std::string, torch::Tensor> rank_files(const std::string& dir,
                                                       const std::string& tag) {
  std::map<std::string, torch::Tensor> out;
  CheckpointReader checkpoint(dir, tag);
  for (int r = 0; r < checkpoint.world_size(); ++r) {
    SafetensorsReader file(checkpoint.path() + "/" + checkpoint_rank_file(r));
    for (const auto& entry : file.entries()) {
      out[std::to_string(r) + ":" + entry.name] = file.read(entry.name);
    }
  }
  return out;
}

// The consolidated state: every parameter's values, fp32 masters and
// optimizer state as whole tensors, keyed "<section>/<name>", whatever the
// layout that wrote them.
inline std::map<std::string, torch::Tensor> consolidated(const std::string& dir,
                                                         const std::string& tag = "") {
  std::map<std::string, torch::Tensor> out;
  CheckpointReader checkpoint(dir, tag);
  const auto& meta = checkpoint.meta();
  std::vector<std::string> sections = {"model", "master"};
  if (meta.contains("optimizer")) {
    for (const auto& s : meta["optimizer"]["state_names"]) {
      sections.push_back("optim/" + s.get<std::string>());
    }
  }
  for (const auto& p : meta["parameters"]) {
    const std::string name = p["name"].get<std::string>();
    const auto shape = p["shape"].get<std::vector<int64_t>>();
    for (const auto& section : sections) {
      if (checkpoint.has(section, name)) {
        out[section + "/" + name] = checkpoint.read_whole(section, name, shape);
      }
    }
  }
  return out;
}

// Byte equality of two tensor maps, reporting the first difference.
inline ::testing::AssertionResult same_tensors(const std::map<std::string, torch::Tensor>& a,
                                               const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) {
    std::string only;
    for (const auto& [k, v] : a) {
      if (!b.count(k)) only += " a:" + k;
    }
    for (const auto& [k, v] : b) {
      if (!a.count(k)) only += " b:" + k;
    }
    return ::testing::AssertionFailure()
           << a.size() << " vs " << b.size() << " tensors; only in one:" << only;
  }
  for (const auto& [key, t] : a) {
    const auto it = b.find(key);
    if (it == b.end()) return ::testing::AssertionFailure() << key << " missing";
    const torch::Tensor& u = it->second;
    if (t.scalar_type() != u.scalar_type() || t.sizes() != u.sizes() ||
        !torch::equal(t.contiguous().view(torch::kByte), u.contiguous().view(torch::kByte))) {
      return ::testing::AssertionFailure() << key << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tandem::testing
