// SyncBatchNorm on ranks-as-threads must equal torch::nn::BatchNorm on one
// process fed the concatenated batch: outputs, input gradients, summed
// weight/bias gradients and running statistics, step after step.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/thread_ranks.h"
#include "tandem/core/error.h"
#include "tandem/parallel/sync_batch_norm.h"

namespace tandem {
namespace {

using testing::run_ranks;

// run_ranks lends each rank its group by reference; modules want ownership.
std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) {
  return std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const auto a = actual.to(at::kDouble);
  const auto e = expected.to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, rtol, atol))
      << what << ": max |diff| " << (a - e).abs().max().item<double>();
}

struct ParitySetup {
  std::vector<int64_t> local_batches;  // one per rank; the world size
  std::vector<int64_t> feature_shape;  // C, then spatial sizes
  SyncBatchNormOptions options{3};
  at::ScalarType dtype = at::kFloat;
  int steps = 3;
  uint64_t seed = 7;
};

// What one step produced on one rank, or on the reference process.
struct StepRecord {
  at::Tensor output, input_grad, weight_grad, bias_grad, running_mean, running_var;
};

// Inputs (offset and scaled, so the mean matters), upstream gradients and
// initial affine parameters, generated once so ranks and reference agree.
struct ParityData {
  std::vector<at::Tensor> inputs, output_grads;
  at::Tensor weight, bias;
};

ParityData make_data(const ParitySetup& setup) {
  auto gen = at::detail::createCPUGenerator(setup.seed);
  int64_t total = 0;
  for (int64_t b : setup.local_batches) total += b;
  std::vector<int64_t> shape = {total};
  shape.insert(shape.end(), setup.feature_shape.begin(), setup.feature_shape.end());
  const auto opts = at::TensorOptions().dtype(setup.dtype);
  ParityData data;
  for (int s = 0; s < setup.steps; ++s) {
    data.inputs.push_back(at::randn(shape, gen, opts).mul(2.0 + s).add(3.0));
    data.output_grads.push_back(at::randn(shape, gen, opts));
  }
  const int64_t c = setup.feature_shape[0];
  data.weight = at::rand({c}, gen, opts).add(0.5);
  data.bias = at::randn({c}, gen, opts);
  return data;
}

torch::nn::AnyModule make_batch_norm(int64_t input_dim, const SyncBatchNormOptions& options) {
  if (input_dim <= 3) return torch::nn::AnyModule(torch::nn::BatchNorm1d(options));
  if (input_dim == 4) return torch::nn::AnyModule(torch::nn::BatchNorm2d(options));
  return torch::nn::AnyModule(torch::nn::BatchNorm3d(options));
}

// Copies the initial affine parameters into `module` (either kind).
void init_affine(torch::nn::Module& module, const ParityData& data, at::ScalarType dtype) {
  module.to(dtype);
  auto params = module.named_parameters();
  if (!params.contains("weight")) return;
  at::NoGradGuard no_grad;
  params["weight"].copy_(data.weight);
  params["bias"].copy_(data.bias);
}

// One training step: forward, loss = sum(y * dy), backward; records everything.
StepRecord train_step(torch::nn::Module& module, const std::function<at::Tensor(at::Tensor)>& fwd,
                      const at::Tensor& input, const at::Tensor& output_grad) {
  module.zero_grad();
  auto x = input.clone().requires_grad_(true);
  auto y = fwd(x);
  (y * output_grad).sum().backward();
  auto params = module.named_parameters();
  auto buffers = module.named_buffers();
  StepRecord r;
  r.output = y.detach().clone();
  r.input_grad = x.grad().clone();
  if (params.contains("weight")) {
    r.weight_grad = params["weight"].grad().clone();
    r.bias_grad = params["bias"].grad().clone();
  }
  if (buffers.contains("running_mean")) {
    r.running_mean = buffers["running_mean"].clone();
    r.running_var = buffers["running_var"].clone();
  }
  return r;
}

std::vector<StepRecord> run_reference(const ParitySetup& setup, const ParityData& data) {
  auto bn = make_batch_norm(1 + static_cast<int64_t>(setup.feature_shape.size()), setup.options);
  init_affine(*bn.ptr(), data, setup.dtype);
  std::vector<StepRecord> records;
  for (int s = 0; s < setup.steps; ++s) {
    records.push_back(train_step(
        *bn.ptr(), [&](at::Tensor x) { return bn.forward<at::Tensor>(x); }, data.inputs[s],
        data.output_grads[s]));
  }
  return records;
}

// records[rank][step]
std::vector<std::vector<StepRecord>> run_sync(const ParitySetup& setup, const ParityData& data) {
  const int world = static_cast<int>(setup.local_batches.size());
  std::vector<std::vector<StepRecord>> records(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    const int rank = pg.rank();
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += setup.local_batches[r];
    const int64_t b = setup.local_batches[rank];
    SyncBatchNorm bn(setup.options, borrow(pg));
    init_affine(*bn, data, setup.dtype);
    for (int s = 0; s < setup.steps; ++s) {
      records[rank].push_back(train_step(
          *bn, [&](at::Tensor x) { return bn->forward(x); },
          data.inputs[s].slice(0, offset, offset + b), data.output_grads[s].slice(0, offset, offset + b)));
    }
  });
  return records;
}

void expect_parity(ParitySetup setup, double rtol, double atol) {
  setup.options.num_features(setup.feature_shape[0]);
  const auto data = make_data(setup);
  const auto want = run_reference(setup, data);
  const auto got = run_sync(setup, data);
  for (int s = 0; s < setup.steps; ++s) {
    const std::string step = "step " + std::to_string(s);
    at::Tensor weight_grad_sum, bias_grad_sum;
    int64_t offset = 0;
    for (size_t r = 0; r < got.size(); ++r) {
      const std::string where = step + " rank " + std::to_string(r);
      const int64_t b = setup.local_batches[r];
      const auto& rec = got[r][s];
      expect_close(rec.output, want[s].output.slice(0, offset, offset + b), rtol, atol, where + " output");
      expect_close(rec.input_grad, want[s].input_grad.slice(0, offset, offset + b), rtol, atol,
                   where + " grad_input");
      if (want[s].running_mean.defined()) {
        expect_close(rec.running_mean, want[s].running_mean, rtol, atol, where + " running_mean");
        expect_close(rec.running_var, want[s].running_var, rtol, atol, where + " running_var");
      }
      if (want[s].weight_grad.defined()) {
        weight_grad_sum = r == 0 ? rec.weight_grad : weight_grad_sum + rec.weight_grad;
        bias_grad_sum = r == 0 ? rec.bias_grad : bias_grad_sum + rec.bias_grad;
      }
      offset += b;
    }
    if (want[s].weight_grad.defined()) {
      expect_close(weight_grad_sum, want[s].weight_grad, rtol, atol, step + " sum of grad_weight");
      expect_close(bias_grad_sum, want[s].bias_grad, rtol, atol, step + " sum of grad_bias");
    }
  }
}

std::vector<int64_t> even_batches(int world, int64_t b) { return std::vector<int64_t>(world, b); }

class SyncBatchNormByWorld : public ::testing::TestWithParam<int> {};

TEST_P(SyncBatchNormByWorld, TrainingMatchesBatchNorm2dOnConcatenatedBatch) {
  ParitySetup setup;
  setup.local_batches = even_batches(GetParam(), 4);
  setup.feature_shape = {3, 5, 4};
  expect_parity(setup, 1e-5, 1e-5);
}

TEST_P(SyncBatchNormByWorld, DoublePrecisionMatchesToRoundoff) {
  ParitySetup setup;
  setup.local_batches = even_batches(GetParam(), 3);
  setup.feature_shape = {4, 3, 3};
  setup.dtype = at::kDouble;
  expect_parity(setup, 1e-11, 1e-11);
}

TEST_P(SyncBatchNormByWorld, CumulativeAverageWhenMomentumIsNone) {
  ParitySetup setup;
  setup.local_batches = even_batches(GetParam(), 2);
  setup.feature_shape = {3, 4, 4};
  setup.options.momentum(c10::nullopt);
  setup.steps = 4;
  expect_parity(setup, 1e-5, 1e-5);
}

TEST_P(SyncBatchNormByWorld, Input1dMatchesBatchNorm1d) {
  ParitySetup setup;
  setup.local_batches = even_batches(GetParam(), 5);
  setup.feature_shape = {6};
  expect_parity(setup, 1e-5, 1e-5);
  setup.feature_shape = {6, 7};  // (N, C, L)
  expect_parity(setup, 1e-5, 1e-5);
}

TEST_P(SyncBatchNormByWorld, Input3dMatchesBatchNorm3d) {
  ParitySetup setup;
  setup.local_batches = even_batches(GetParam(), 2);
  setup.feature_shape = {2, 3, 4, 3};
  expect_parity(setup, 1e-5, 1e-5);
}

TEST_P(SyncBatchNormByWorld, WithoutAffineOrRunningStatsMatchesBatchNorm) {
  ParitySetup setup;
  setup.local_batches = even_batches(GetParam(), 3);
  setup.feature_shape = {3, 4};
  setup.options.affine(false).track_running_stats(false);
  expect_parity(setup, 1e-5, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(World, SyncBatchNormByWorld, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(SyncBatchNorm, UnevenLocalBatchesIncludingAnEmptyRankMatchConcatenatedBatch) {
  ParitySetup setup;
  setup.local_batches = {3, 0, 1, 6};
  setup.feature_shape = {3, 2, 5};
  expect_parity(setup, 1e-5, 1e-5);
  setup.dtype = at::kDouble;
  expect_parity(setup, 1e-11, 1e-11);
}

// Per-rank sums of squares in float would lose the variance to cancellation
// here (mean 1000, std 1: E[x^2] - E[x]^2 ~ 1e6 - 1e6 in float is off by
// ~0.06); the statistics are combined in double instead.
TEST(SyncBatchNorm, LargeMeanInFloatStaysAccurate) {
  const int world = 4;
  auto gen = at::detail::createCPUGenerator(11);
  const auto input = at::randn({world * 8, 3, 4}, gen, at::kDouble).add(1000.0);
  torch::nn::BatchNorm1d reference(3);
  reference->to(at::kDouble);
  const auto truth = reference->forward(input);
  std::vector<at::Tensor> got(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    SyncBatchNorm bn(SyncBatchNormOptions(3), borrow(pg));
    got[pg.rank()] = bn->forward(input.slice(0, 8 * pg.rank(), 8 * pg.rank() + 8).to(at::kFloat));
  });
  expect_close(at::cat(got), truth, 0, 2e-4, "output");
}

TEST(SyncBatchNorm, IssuesOneAllReducePerForwardAndOnePerBackward) {
  run_ranks(2, [](ProcessGroup& pg) {
    SyncBatchNorm bn(SyncBatchNormOptions(3), borrow(pg));
    auto x = at::randn({4, 3, 2}).requires_grad_(true);
    const auto before = pg.sequence_number();
    auto y = bn->forward(x);
    EXPECT_EQ(pg.sequence_number(), before + 1);
    y.sum().backward();
    EXPECT_EQ(pg.sequence_number(), before + 2);
  });
}

TEST(SyncBatchNorm, EvalUsesRunningStatsWithoutCommunicating) {
  ParitySetup setup;
  setup.local_batches = {2, 5};
  setup.feature_shape = {3, 4};
  const auto data = make_data(setup);
  auto reference = torch::nn::BatchNorm1d(setup.options);
  init_affine(*reference, data, setup.dtype);
  for (int s = 0; s < setup.steps; ++s) reference->forward(data.inputs[s]);
  reference->eval();
  const auto probe = at::randn({7, 3, 4}).mul(3).add(1);
  const auto want = reference->forward(probe);

  std::vector<at::Tensor> got(2);
  run_ranks(2, [&](ProcessGroup& pg) {
    const int64_t offset = pg.rank() == 0 ? 0 : setup.local_batches[0];
    const int64_t b = setup.local_batches[pg.rank()];
    SyncBatchNorm bn(setup.options, borrow(pg));
    init_affine(*bn, data, setup.dtype);
    for (int s = 0; s < setup.steps; ++s) bn->forward(data.inputs[s].slice(0, offset, offset + b));
    bn->eval();
    const auto before = pg.sequence_number();
    // Ranks evaluate different numbers of batches: only legal without collectives.
    for (int i = 0; i <= pg.rank(); ++i) got[pg.rank()] = bn->forward(probe);
    EXPECT_EQ(pg.sequence_number(), before);
  });
  for (const auto& g : got) expect_close(g, want, 1e-5, 1e-5, "eval output");
}

TEST(SyncBatchNorm, WithoutProcessGroupIsExactlyBatchNorm) {
  auto reference = torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(3).momentum(0.3));
  SyncBatchNorm bn(SyncBatchNormOptions(3).momentum(0.3));
  const auto x = at::randn({4, 3, 5, 5});
  EXPECT_TRUE(at::equal(bn->forward(x), reference->forward(x)));
  EXPECT_TRUE(at::equal(bn->running_var, reference->running_var));
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
}

TEST(SyncBatchNorm, StateDictNamesMatchBatchNormSoCheckpointsInterchange) {
  for (bool affine : {true, false}) {
    for (bool track : {true, false}) {
      const auto options = SyncBatchNormOptions(4).affine(affine).track_running_stats(track);
      SyncBatchNorm bn(options);
      torch::nn::BatchNorm2d reference(options);
      EXPECT_EQ(bn->named_parameters().keys(), reference->named_parameters().keys());
      EXPECT_EQ(bn->named_buffers().keys(), reference->named_buffers().keys());
    }
  }
}

TEST(SyncBatchNorm, RejectsInputWhoseChannelsDifferFromNumFeatures) {
  SyncBatchNorm bn(SyncBatchNormOptions(3));
  EXPECT_THROW(bn->forward(at::randn({4, 5, 2})), UsageError);
  EXPECT_THROW(bn->forward(at::randn({4})), UsageError);
}

TEST(SyncBatchNorm, OneValuePerChannelOverTheWholeWorldThrowsOnEveryRank) {
  std::vector<int> threw(2, 0);
  run_ranks(2, [&](ProcessGroup& pg) {
    SyncBatchNorm bn(SyncBatchNormOptions(3), borrow(pg));
    const auto x = at::randn({pg.rank() == 0 ? 1 : 0, 3});
    try {
      bn->forward(x);
    } catch (const UsageError&) {
      threw[pg.rank()] = 1;
    }
  });
  EXPECT_EQ(threw, std::vector<int>({1, 1}));
}

// Without synchronisation (no group, or eval without running statistics)
// one value per channel is refused as torch.nn.BatchNorm refuses it; it used
// to come out silently as the bias. Two values, or eval with running
// statistics, are fine.
TEST(SyncBatchNorm, OneValuePerChannelIsRefusedWhenNotSynchronisingToo) {
  SyncBatchNorm alone(SyncBatchNormOptions(3));
  EXPECT_THROW(alone->forward(at::randn({1, 3})), UsageError);
  EXPECT_THROW(alone->forward(at::randn({1, 3, 1, 1})), UsageError);
  EXPECT_NO_THROW(alone->forward(at::randn({2, 3})));
  alone->eval();
  EXPECT_NO_THROW(alone->forward(at::randn({1, 3})));
  SyncBatchNorm untracked(SyncBatchNormOptions(3).track_running_stats(false));
  untracked->eval();
  EXPECT_THROW(untracked->forward(at::randn({1, 3})), UsageError);
}

TEST(SyncBatchNorm, BackwardWithCreateGraphIsRejected) {
  run_ranks(2, [](ProcessGroup& pg) {
    SyncBatchNorm bn(SyncBatchNormOptions(3), borrow(pg));
    auto y = bn->forward(at::randn({4, 3}).requires_grad_(true));
    EXPECT_ANY_THROW(y.pow(2).sum().backward({}, /*retain_graph=*/true, /*create_graph=*/true));
  });
}

// ---- convert_sync_batchnorm ------------------------------------------------

// A Sequential cannot hold a plain Sequential (its forward is a template);
// LibTorch's own models subclass it with a concrete forward instead.
struct BlockImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  at::Tensor forward(at::Tensor x) { return SequentialImpl::forward(x); }
};
TORCH_MODULE(Block);

// Conv, BN, ReLU, Block(Conv, BN), built the same way for every `seed`, with
// non-default BatchNorm affine values.
torch::nn::Sequential make_conv_net(uint64_t seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential net(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3).padding(1)),
      torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(4).momentum(0.2)), torch::nn::ReLU(),
      Block(torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1)),
            torch::nn::BatchNorm2d(4)));
  at::NoGradGuard no_grad;
  for (auto& m : net->modules()) {
    if (!is_batch_norm(*m)) continue;
    auto params = m->named_parameters(false);
    params["weight"].uniform_(0.5, 1.5);
    params["bias"].normal_();
  }
  return net;
}

std::vector<std::string> kinds_of_norms(torch::nn::Module& module) {
  std::vector<std::string> kinds;
  for (auto& m : module.modules()) {
    if (is_batch_norm(*m)) kinds.push_back("BatchNorm");
    if (m->as<SyncBatchNorm>() != nullptr) kinds.push_back("SyncBatchNorm");
  }
  return kinds;
}

class ConvertByWorld : public ::testing::TestWithParam<int> {};

TEST_P(ConvertByWorld, ConvertedNestedSequentialKeepsWeightsAndMatchesConcatenatedBatch) {
  const int world = GetParam();
  // Reference: the unconverted network on the whole batch, in one process.
  const auto input = at::randn({2 * world, 2, 5, 5});
  const auto want = make_conv_net(3)->forward(input);
  std::vector<torch::nn::Sequential> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(make_conv_net(3));

  std::vector<at::Tensor> got(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    auto model = replicas[pg.rank()];
    const auto weights_before = model->named_parameters();
    const auto root = convert_sync_batchnorm(model, borrow(pg));
    EXPECT_EQ(root.get(), model.ptr().get()) << "the Sequential is converted in place";
    EXPECT_EQ(kinds_of_norms(*model), std::vector<std::string>({"SyncBatchNorm", "SyncBatchNorm"}));
    // Same names, and the very same tensors (shared, as in PyTorch).
    const auto weights_after = model->named_parameters();
    ASSERT_EQ(weights_after.keys(), weights_before.keys());
    for (const auto& item : weights_before) {
      EXPECT_TRUE(weights_after[item.key()].is_same(item.value())) << item.key();
    }
    // What forward() runs, not just what the registry lists.
    auto* first_norm = (*model)[1]->as<SyncBatchNorm>();
    EXPECT_NE(first_norm, nullptr) << "Sequential::forward still runs the old module";
    if (first_norm != nullptr) {
      EXPECT_EQ(first_norm->options.momentum(), c10::optional<double>(0.2));
    }
    got[pg.rank()] = model->forward(input.slice(0, 2 * pg.rank(), 2 * pg.rank() + 2));
  });
  for (int r = 0; r < world; ++r) {
    expect_close(got[r], want.slice(0, 2 * r, 2 * r + 2), 1e-5, 1e-5,
                 "rank " + std::to_string(r) + " output");
  }
}

INSTANTIATE_TEST_SUITE_P(World, ConvertByWorld, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(ConvertSyncBatchNorm, ModuleListAndModuleDictIterateTheConvertedModules) {
  torch::nn::ModuleList list(torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3));
  torch::nn::ModuleDict dict(std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
      {"norm", torch::nn::BatchNorm1d(3).ptr()}, {"proj", torch::nn::Linear(3, 2).ptr()}});
  auto pg = ProcessGroup::local();
  convert_sync_batchnorm(list, pg);
  convert_sync_batchnorm(dict, pg);
  EXPECT_NE(list[1]->as<SyncBatchNorm>(), nullptr);
  EXPECT_NE(list->named_children()["1"]->as<SyncBatchNorm>(), nullptr);
  EXPECT_NE(dict["norm"]->as<SyncBatchNorm>(), nullptr);
  EXPECT_NE(dict->named_children()["norm"]->as<SyncBatchNorm>(), nullptr);
  EXPECT_EQ(dict->keys(), std::vector<std::string>({"norm", "proj"}));
}

// A module that reaches its BatchNorm only through the registry.
struct RegistryNet : torch::nn::Module {
  RegistryNet() { register_module("norm", torch::nn::BatchNorm1d(3)); }
  at::Tensor forward(const at::Tensor& x) {
    return named_children()["norm"]->as<SyncBatchNorm>()->forward(x);
  }
};

TEST(ConvertSyncBatchNorm, RegistryOnlyChildIsReplaced) {
  auto net = std::make_shared<RegistryNet>();
  convert_sync_batchnorm(net, ProcessGroup::local());
  EXPECT_EQ(net->forward(at::randn({4, 3})).sizes(), at::IntArrayRef({4, 3}));
}

// The usual C++ style: forward() calls a member field.
struct MemberNet : torch::nn::Module {
  MemberNet() { norm = register_module("norm", torch::nn::BatchNorm1d(3)); }
  at::Tensor forward(const at::Tensor& x) { return norm->forward(x); }
  torch::nn::BatchNorm1d norm{nullptr};
};

TEST(ConvertSyncBatchNorm, BatchNormHeldByMemberFieldIsRejectedAndNothingChanges) {
  auto outer = torch::nn::Sequential(torch::nn::BatchNorm1d(3), std::make_shared<MemberNet>());
  try {
    convert_sync_batchnorm(outer, ProcessGroup::local());
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("1.norm"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kinds_of_norms(*outer), std::vector<std::string>({"BatchNorm", "BatchNorm"}));
}

struct SyncMemberNet : torch::nn::Module {
  SyncMemberNet() { norm = register_module("norm", SyncBatchNorm(SyncBatchNormOptions(3))); }
  SyncBatchNorm norm{nullptr};
};

TEST(ConvertSyncBatchNorm, GivesTheGroupToSyncBatchNormMembersThatHaveNone) {
  auto net = std::make_shared<SyncMemberNet>();
  auto pg = ProcessGroup::local();
  convert_sync_batchnorm(net, pg);
  EXPECT_EQ(net->norm->process_group(), pg);
  auto other = ProcessGroup::local();
  convert_sync_batchnorm(net, other);
  EXPECT_EQ(net->norm->process_group(), pg) << "an existing group is kept";
}

TEST(ConvertSyncBatchNorm, BatchNormRootBecomesNewSyncBatchNormSharingItsState) {
  torch::nn::BatchNorm3d bn(torch::nn::BatchNorm3dOptions(2).eps(1e-3));
  bn->eval();
  auto root = convert_sync_batchnorm(bn, nullptr);
  auto sync_bn = std::dynamic_pointer_cast<SyncBatchNormImpl>(root);
  ASSERT_NE(sync_bn, nullptr);
  EXPECT_EQ(sync_bn->options.eps(), 1e-3);
  EXPECT_FALSE(sync_bn->is_training());
  EXPECT_TRUE(sync_bn->running_mean.is_same(bn->running_mean));
  EXPECT_TRUE(sync_bn->weight.is_same(bn->weight));
}

}  // namespace
}  // namespace tandem
