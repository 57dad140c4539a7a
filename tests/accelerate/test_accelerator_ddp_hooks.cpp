// tandem YAML's ddp.comm_hook: powersgd (with ddp.powersgd) and
// ddp.static_graph reach the Accelerator's DDP wrapper, at 2 and 3 ranks:
// PowerSGD before its start iteration trains bit for bit as plain DDP and
// after it differs, and static_graph lets a model with a parameter it never
// uses train without find_unused_parameters.

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/parity.h"
#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/config/config.h"

namespace tandem {
namespace {

using testing::Mlp;
using testing::Params;
using testing::run_ranks;
using testing::usage_error_message;

// An Mlp and a layer forward never uses.
struct MlpWithSpareImpl : torch::nn::Module {
  MlpWithSpareImpl() {
    mlp = register_module("mlp", Mlp(testing::kIn, testing::kHidden, testing::kOut));
    spare = register_module("spare", torch::nn::Linear(testing::kOut, testing::kOut));
  }
  torch::Tensor forward(torch::Tensor x) { return mlp(x); }
  Mlp mlp{nullptr};
  torch::nn::Linear spare{nullptr};
};
TORCH_MODULE(MlpWithSpare);

constexpr int64_t kHookBatch = 4, kHookSteps = 5;

// Trains an MlpWithSpare per rank through an Accelerator configured by
// `yaml`; returns rank 0's parameters after checking that every rank has
// them.
Params train_through_accelerator(int world, const std::string& yaml) {
  const Config config = parse_config_text(yaml, "ddp_hooks.yaml");
  std::vector<MlpWithSpare> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(5);
    models.emplace_back();
  }
  const auto data = testing::make_dataset(world * kHookBatch * kHookSteps);
  std::vector<Params> out(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    MlpWithSpare model = models[pg.rank()];
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1)));
    for (int64_t s = 0; s < kHookSteps; ++s) {
      const int64_t row = (s * world + pg.rank()) * kHookBatch;
      optimizer->zero_grad();
      accelerator.backward(torch::mse_loss(model->forward(data.x.narrow(0, row, kHookBatch)),
                                           data.y.narrow(0, row, kHookBatch)));
      optimizer->step();
    }
    out[pg.rank()] = testing::snapshot(*model);
  });
  for (int r = 1; r < world; ++r) {
    for (const auto& [name, value] : out[0]) {
      EXPECT_TRUE(torch::equal(out[r].at(name), value)) << "rank " << r << " " << name;
    }
  }
  return out[0];
}

const char* const kStaticGraphYaml = "ddp:\n  static_graph: true\n";

TEST(AcceleratorDdpHooks, PowerSGDFromTheConfigStartsWhereTheConfigSays) {
  for (int world : {2, 3}) {
    const Params plain = train_through_accelerator(world, kStaticGraphYaml);
    const Params late = train_through_accelerator(world, R"(ddp:
  static_graph: true
  comm_hook: powersgd
  powersgd:
    start_powerSGD_iter: 1000
)");
    const Params early = train_through_accelerator(world, R"(ddp:
  static_graph: true
  comm_hook: powersgd
  powersgd:
    start_powerSGD_iter: 2
    min_compression_rate: 1
)");
    for (const auto& [name, value] : plain) {
      EXPECT_TRUE(torch::equal(late.at(name), value)) << "world " << world << " " << name;
    }
    // Rank-1 compression of the 16 x 16 and 3 x 16 layers changes the run.
    EXPECT_GT(testing::max_relative_diff(early, plain), 1e-3) << "world " << world;
  }
}

TEST(AcceleratorDdpHooks, StaticGraphFromTheConfigTrainsAModelWithAnUnusedLayer) {
  for (int world : {2, 3}) {
    // The same model in one process, on the concatenated batches.
    torch::manual_seed(5);
    MlpWithSpare single;
    const Params initial = testing::snapshot(*single);
    torch::optim::SGD sgd(single->parameters(), torch::optim::SGDOptions(0.1));
    const auto data = testing::make_dataset(world * kHookBatch * kHookSteps);
    for (int64_t s = 0; s < kHookSteps; ++s) {
      const int64_t rows = world * kHookBatch;
      sgd.zero_grad();
      torch::mse_loss(single->forward(data.x.narrow(0, s * rows, rows)),
                      data.y.narrow(0, s * rows, rows))
          .backward();
      sgd.step();
    }
    const Params got = train_through_accelerator(world, kStaticGraphYaml);
    EXPECT_LT(testing::max_relative_diff(got, testing::snapshot(*single)), 1e-5)
        << "world " << world;
    EXPECT_TRUE(torch::equal(got.at("spare.weight"), initial.at("spare.weight")));
    // Without it, the unused layer is DDP's error.
    const std::string message = usage_error_message(
        [&] { train_through_accelerator(world, "ddp:\n  bucket_cap_mb: 25\n"); });
    EXPECT_NE(message.find("spare.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("static_graph = true"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace tandem
