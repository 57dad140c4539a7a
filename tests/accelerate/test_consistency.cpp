// Start-up consistency: ranks whose resolved config or model structure
// differ must all fail at once with a diff naming the key and the ranks;
// ranks that agree (apart from per-node keys) must start normally.

#include <gtest/gtest.h>

#include <mutex>

#include <torch/torch.h>

#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::run_ranks;

// Each rank's UsageError message ("" for a rank that did not throw).
std::map<int, std::string> usage_errors(int world, const std::function<void(ProcessGroup&)>& fn) {
  return testing::rank_errors<UsageError>(world, fn);
}

struct Net : torch::nn::Module {
  Net(int in, int hidden, bool swap_order = false) {
    if (swap_order) {
      head = register_module("head", torch::nn::Linear(hidden, 2));
      fc = register_module("fc", torch::nn::Linear(in, hidden));
    } else {
      fc = register_module("fc", torch::nn::Linear(in, hidden));
      head = register_module("head", torch::nn::Linear(hidden, 2));
    }
  }
  torch::nn::Linear fc{nullptr}, head{nullptr};
};

Config accumulation(int64_t steps) {
  Config config;
  config.gradient_accumulation_steps = steps;
  return config;
}

TEST(ConfigConsistency, DifferingValueOnOneRankNamesTheKeyAndTheRanksOnEveryRank) {
  auto messages = usage_errors(3, [](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), accumulation(pg.rank() == 2 ? 4 : 2));
  });
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(messages[rank].find("config differs across ranks: gradient_accumulation_steps: 2 "
                                  "on ranks 0,1 but 4 on rank 2"),
              std::string::npos)
        << "rank " << rank << ": " << messages[rank];
    EXPECT_NE(messages[rank].find("every node reads the same config file and environment"),
              std::string::npos)
        << messages[rank];
  }
}

TEST(ConfigConsistency, EveryDifferingKeyIsListed) {
  auto messages = usage_errors(2, [](ProcessGroup& pg) {
    Config config = accumulation(pg.rank() + 1);
    if (pg.rank() == 1) config.mixed_precision = MixedPrecision::kBf16;
    Accelerator accelerator(pg.shared_from_this(), config);
  });
  EXPECT_NE(messages[0].find("gradient_accumulation_steps: 1 on rank 0 but 2 on rank 1"),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("mixed_precision: \"no\" on rank 0 but \"bf16\" on rank 1"),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("bf16.enabled: false on rank 0 but true on rank 1"),
            std::string::npos)
      << messages[0];
}

TEST(ConfigConsistency, CodeOverridesCountAndRankListsAreCompressed) {
  auto messages = usage_errors(5, [](ProcessGroup& pg) {
    AcceleratorOptions options;
    options.gradient_clipping = pg.rank() == 3 ? 0.5 : 1.0;
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
  });
  EXPECT_NE(messages[4].find("gradient_clipping: 1.0 on ranks 0-2,4 but 0.5 on rank 3"),
            std::string::npos)
      << messages[4];
}

TEST(ConfigConsistency, EqualConfigsStartAndPerNodeKeysAreIgnored) {
  auto messages = usage_errors(3, [](ProcessGroup& pg) {
    Config config = accumulation(2);
    // What legitimately differs between nodes: their index, their devices,
    // where they found the file.
    config.machine_rank = pg.rank();
    config.gpu_ids = std::to_string(pg.rank());
    config.source_path = "/home/node" + std::to_string(pg.rank()) + "/config.yaml";
    Accelerator accelerator(pg.shared_from_this(), config);
    EXPECT_EQ(accelerator.gradient_accumulation_steps(), 2);
  });
  for (const auto& [rank, message] : messages) EXPECT_EQ(message, "") << "rank " << rank;
}

TEST(ModelConsistency, DifferingShapeOnOneRankNamesTheParameterAndTheRanks) {
  auto messages = usage_errors(2, [](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    accelerator.prepare_model(std::make_shared<Net>(pg.rank() == 0 ? 4 : 5, 10));
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(messages[rank].find("model differs across ranks: parameter fc.weight is "
                                  "Float[10, 4] on rank 0 but Float[10, 5] on rank 1"),
              std::string::npos)
        << "rank " << rank << ": " << messages[rank];
  }
}

TEST(ModelConsistency, FrozenParametersAndBuffersAreCompared) {
  auto messages = usage_errors(3, [](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    auto net = std::make_shared<Net>(4, 8);
    if (pg.rank() == 1) net->fc->bias.set_requires_grad(false);
    if (pg.rank() == 2) net->register_buffer("steps", torch::zeros({1}, torch::kLong));
    accelerator.prepare_model(net);
  });
  EXPECT_NE(messages[0].find("parameter fc.bias is Float[8] on ranks 0,2 but Float[8] frozen on "
                             "rank 1"),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("buffer steps is (absent) on ranks 0,1 but Long[1] on rank 2"),
            std::string::npos)
      << messages[0];
}

TEST(ModelConsistency, RegistrationOrderMatters) {
  auto messages = usage_errors(2, [](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    accelerator.prepare_model(std::make_shared<Net>(4, 8, /*swap_order=*/pg.rank() == 1));
  });
  EXPECT_NE(messages[1].find("model differs across ranks: the same entries are in a different "
                             "order; entry 0 is parameter fc.weight on rank 0 but parameter "
                             "head.weight on rank 1"),
            std::string::npos)
      << messages[1];
}

TEST(ModelConsistency, EqualModelsArePrepared) {
  auto messages = usage_errors(3, [](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    auto net = std::make_shared<Net>(4, 8);
    accelerator.prepare_model(net);
    EXPECT_EQ(accelerator.unwrap_model(), net);
  });
  for (const auto& [rank, message] : messages) EXPECT_EQ(message, "") << "rank " << rank;
}

}  // namespace
}  // namespace tandem
