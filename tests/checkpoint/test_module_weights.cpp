// load_safetensors / save_safetensors: a module's weights by name, with
// strict and non-strict matching, prefixes, dtype conversion, tied weights,
// and refusals that leave the module untouched; and against the safetensors
// package in the peer Python (save_model's files load, ours load there).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "checkpoint/safetensors_test_util.h"
#include "support/parity.h"
#include "tandem/checkpoint/module_weights.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/core/error.h"
#include "support/usage_error.h"

using tandem::testing::usage_error_message;

namespace tandem {
namespace module_weights_test {

using testing::ScratchDir;

// An output layer without bias over a weight it is given.
struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(const torch::Tensor& w) { weight = register_parameter("weight", w); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(Head);

// embed -> fc -> relu -> norm -> head, with head's weight tied to embed's
// (registered twice, as a language model ties its output layer). The
// Python side of the interop test builds the same model.
struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl() {
    embed = register_module("embed", torch::nn::Embedding(11, 5));
    fc = register_module("fc", torch::nn::Linear(5, 5));
    norm = register_module("norm", torch::nn::BatchNorm1d(5));
    head = register_module("head", Head(embed->weight));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    return head(norm(torch::relu(fc(embed(tokens)))));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  Head head{nullptr};
};
TORCH_MODULE(TiedNet);

// Every parameter and buffer, by name: what a load must fill.
testing::Params snapshot(const torch::nn::Module& m) { return testing::snapshot(m, true); }

bool same(const std::map<std::string, torch::Tensor>& a,
          const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || !torch::equal(t, it->second)) return false;
  }
  return true;
}

// A second net with different values (and trained batch-norm statistics).
TiedNet other_net() {
  torch::manual_seed(99);
  TiedNet net;
  torch::NoGradGuard no_grad;
  net->norm->running_mean.uniform_(-1, 1);
  net->norm->running_var.uniform_(0.5, 2);
  net->norm->num_batches_tracked.fill_(7);
  return net;
}

TEST(ModuleWeights, SaveThenLoadRestoresEveryTensorAndKeepsTheTie) {
  ScratchDir dir;
  TiedNet source = other_net();
  const std::string path = dir.file("net.safetensors");
  save_safetensors(*source, path, {{"format", "pt"}});

  SafetensorsReader reader(path);
  EXPECT_EQ(reader.find("head.weight"), nullptr) << "a tied tensor is stored once";
  EXPECT_NE(reader.find("embed.weight"), nullptr);
  EXPECT_EQ(reader.metadata().at("format"), "pt");

  torch::manual_seed(1);
  TiedNet target;
  auto result = load_safetensors(*target, path);
  EXPECT_TRUE(result.missing.empty()) << "head.weight loads through its tie";
  EXPECT_TRUE(result.unexpected.empty());
  EXPECT_TRUE(same(snapshot(*target), snapshot(*source)));
  EXPECT_TRUE(target->head->weight.is_same(target->embed->weight)) << "still one tensor";
  target->eval();
  source->eval();
  const auto tokens = torch::tensor({1, 4, 9, 10});
  EXPECT_TRUE(torch::equal(target->forward(tokens), source->forward(tokens)));
}

TEST(ModuleWeights, StrictRefusesMissingAndUnexpectedNamesAndChangesNothing) {
  ScratchDir dir;
  const std::string path = dir.file("partial.safetensors");
  write_safetensors(path, {{"fc.weight", torch::ones({5, 5})}, {"decoder.bias", torch::ones({3})}});
  torch::manual_seed(1);
  TiedNet net;
  const auto before = snapshot(*net);
  const std::string message = usage_error_message([&] { load_safetensors(*net, path); });
  EXPECT_NE(message.find("missing from the file"), std::string::npos) << message;
  EXPECT_NE(message.find("fc.bias"), std::string::npos) << message;
  EXPECT_NE(message.find("not in the module (1): decoder.bias"), std::string::npos) << message;
  EXPECT_NE(message.find("strict = false"), std::string::npos) << message;
  EXPECT_NE(message.find("nothing was loaded"), std::string::npos) << message;
  EXPECT_TRUE(same(snapshot(*net), before));
}

TEST(ModuleWeights, NonStrictLoadsWhatMatchesAndReportsTheRest) {
  ScratchDir dir;
  const std::string path = dir.file("partial.safetensors");
  write_safetensors(path, {{"fc.weight", torch::full({5, 5}, 0.5)},
                           {"decoder.bias", torch::ones({3})}});
  torch::manual_seed(1);
  TiedNet net;
  const auto before = snapshot(*net);
  LoadSafetensorsOptions options;
  options.strict = false;
  const auto result = load_safetensors(*net, path, options);
  EXPECT_EQ(result.loaded, std::vector<std::string>{"fc.weight"});
  EXPECT_EQ(result.unexpected, std::vector<std::string>{"decoder.bias"});
  EXPECT_EQ(result.missing.size(), 8u);  // embed/head.weight, fc.bias, norm's 2 + 3 buffers
  EXPECT_TRUE(torch::equal(net->fc->weight, torch::full({5, 5}, 0.5)));
  EXPECT_TRUE(torch::equal(net->fc->bias, before.at("fc.bias")));
}

TEST(ModuleWeights, PrefixIsStrippedAndBf16ConvertsIntoFp32Weights) {
  ScratchDir dir;
  TiedNet source = other_net();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : source->named_parameters()) {
    if (p.key() == "head.weight") continue;
    tensors.emplace_back("model." + p.key(), p.value().detach().to(torch::kBFloat16));
  }
  for (const auto& b : source->named_buffers()) tensors.emplace_back("model." + b.key(), b.value());
  const std::string path = dir.file("bf16.safetensors");
  write_safetensors(path, tensors);

  TiedNet net;
  const std::string refused = usage_error_message([&] { load_safetensors(*net, path); });
  EXPECT_NE(refused.find("LoadSafetensorsOptions::prefix"), std::string::npos) << refused;

  LoadSafetensorsOptions options;
  options.prefix = "model.";
  const auto result = load_safetensors(*net, path, options);
  EXPECT_TRUE(result.missing.empty());
  EXPECT_EQ(net->fc->weight.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(net->fc->weight, source->fc->weight.to(torch::kBFloat16).to(torch::kFloat)));
  EXPECT_TRUE(torch::equal(net->norm->num_batches_tracked, source->norm->num_batches_tracked));
}

TEST(ModuleWeights, Float8ConvertsIntoFp32WeightsAndUInt16IntoALongBuffer) {
  ScratchDir dir;
  TiedNet source = other_net();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [name, t] : snapshot(*source)) {
    if (name == "head.weight") continue;
    if (name == "norm.num_batches_tracked") {
      tensors.emplace_back(name, t.to(torch::kUInt16));
    } else {
      tensors.emplace_back(name, t.to(name == "fc.weight" ? torch::kFloat8_e5m2
                                                          : torch::kFloat8_e4m3fn));
    }
  }
  const std::string path = dir.file("fp8.safetensors");
  write_safetensors(path, tensors);
  TiedNet net;
  const auto result = load_safetensors(*net, path);
  EXPECT_TRUE(result.missing.empty());
  const auto loaded = snapshot(*net);
  const auto original = snapshot(*source);
  for (const auto& [name, t] : tensors) {
    const torch::Tensor& got = loaded.at(name);
    EXPECT_EQ(got.scalar_type(), original.at(name).scalar_type()) << name;  // Float or Long
    EXPECT_TRUE(torch::equal(got, t.to(got.scalar_type()))) << name;
  }
  EXPECT_EQ(net->norm->num_batches_tracked.item<int64_t>(), 7);
}

TEST(ModuleWeights, Float8IntoIntegerAndUnsignedIntoFloatAreRefused) {
  ScratchDir dir;
  TiedNet source = other_net();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [name, t] : snapshot(*source)) {
    if (name == "fc.bias") {
      tensors.emplace_back(name, torch::ones({5}, torch::kUInt32));
    } else if (name == "norm.num_batches_tracked") {
      tensors.emplace_back(name, t.to(torch::kFloat8_e4m3fn));
    } else {
      tensors.emplace_back(name, t);
    }
  }
  const std::string path = dir.file("bad_fp8.safetensors");
  write_safetensors(path, tensors);
  TiedNet net;
  const auto before = snapshot(*net);
  const std::string message = usage_error_message([&] { load_safetensors(*net, path); });
  EXPECT_NE(message.find("fc.bias: the file holds U32, the module Float"), std::string::npos)
      << message;
  EXPECT_NE(message.find("norm.num_batches_tracked: the file holds F8_E4M3, the module Long"),
            std::string::npos)
      << message;
  EXPECT_TRUE(same(snapshot(*net), before));
}

TEST(ModuleWeights, ShapeAndDtypeMismatchesAreRefusedNamingEachAndChangeNothing) {
  ScratchDir dir;
  TiedNet source = other_net();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [name, t] : snapshot(*source)) {
    if (name == "head.weight") continue;
    if (name == "fc.weight") {
      tensors.emplace_back(name, torch::ones({5, 4}));
    } else if (name == "fc.bias") {
      tensors.emplace_back(name, torch::ones({5}, torch::kInt));
    } else {
      tensors.emplace_back(name, t);
    }
  }
  const std::string path = dir.file("bad.safetensors");
  write_safetensors(path, tensors);
  TiedNet net;
  const auto before = snapshot(*net);
  LoadSafetensorsOptions options;
  options.strict = false;  // shape and dtype problems are errors even then
  const std::string message = usage_error_message([&] { load_safetensors(*net, path, options); });
  EXPECT_NE(message.find("fc.weight: the file holds shape [5, 4], the module [5, 5]"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("fc.bias: the file holds I32, the module Float"), std::string::npos)
      << message;
  EXPECT_TRUE(same(snapshot(*net), before));
}

TEST(ModuleWeights, TiedNamesWithDifferentValuesInTheFileAreRefused) {
  ScratchDir dir;
  TiedNet source = other_net();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [name, t] : snapshot(*source)) {
    tensors.emplace_back(name, name == "head.weight" ? t + 1 : t);
  }
  const std::string path = dir.file("untied.safetensors");
  write_safetensors(path, tensors);
  TiedNet net;
  const auto before = snapshot(*net);
  const std::string message = usage_error_message([&] { load_safetensors(*net, path); });
  EXPECT_NE(message.find("embed.weight and head.weight are one tied tensor"), std::string::npos)
      << message;
  EXPECT_TRUE(same(snapshot(*net), before));

  // The same file with equal values loads, both names counting as loaded.
  tensors.clear();
  for (const auto& [name, t] : snapshot(*source)) tensors.emplace_back(name, t);
  write_safetensors(path, tensors);
  const auto result = load_safetensors(*net, path);
  EXPECT_TRUE(result.unexpected.empty());
  EXPECT_TRUE(same(snapshot(*net), snapshot(*source)));
}


TEST(ModuleWeights, PretrainedWeightsSavedByPythonGiveTheSameLogits) {
  if (!testing::peer_can_import("safetensors.torch")) {
    GTEST_SKIP() << TANDEM_PEER_PYTHON << " has no safetensors package (scripts/setup.sh installs it)";
  }
  ScratchDir dir;
  const std::string weights = dir.file("pretrained.safetensors");
  const std::string expected = dir.file("expected.safetensors");
  std::string output;
  ASSERT_EQ(testing::run_interop("model '" + weights + "' '" + expected + "'", output), 0) << output;

  torch::manual_seed(1);
  TiedNet net;
  const auto result = load_safetensors(*net, weights);  // strict: every name matched
  EXPECT_TRUE(result.missing.empty());
  EXPECT_TRUE(net->head->weight.is_same(net->embed->weight));
  net->eval();
  SafetensorsReader reference(expected);
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = net->forward(reference.read("tokens"));
  const torch::Tensor want = reference.read("logits");
  EXPECT_TRUE(torch::allclose(logits, want, /*rtol=*/1e-6, /*atol=*/1e-7))
      << (logits - want).abs().max().item<float>();
}

TEST(ModuleWeights, PythonSafetensorsLoadsWhatSaveSafetensorsWrites) {
  if (!testing::peer_can_import("safetensors.torch")) {
    GTEST_SKIP() << TANDEM_PEER_PYTHON << " has no safetensors package (scripts/setup.sh installs it)";
  }
  ScratchDir dir;
  TiedNet source = other_net();
  const std::string ours = dir.file("ours.safetensors");
  const std::string resaved = dir.file("resaved.safetensors");
  save_safetensors(*source, ours);
  std::string output;
  ASSERT_EQ(testing::run_interop("resave '" + ours + "' '" + resaved + "'", output), 0) << output;
  TiedNet net;
  load_safetensors(*net, resaved);
  EXPECT_TRUE(same(snapshot(*net), snapshot(*source)));
}

TEST(ModuleWeights, AMissingFileIsACheckpointErrorNamingIt) {
  TiedNet net;
  try {
    load_safetensors(*net, "/nonexistent/weights.safetensors");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/weights.safetensors"), std::string::npos)
        << e.what();
  }
}

}  // namespace module_weights_test
}  // namespace tandem
