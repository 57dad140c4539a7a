// set_trigger/check_trigger, free_memory and find_executable_batch_size:
// a flag raised on one rank is seen on all; releasing the prepared objects
// really drops them and a fresh prepare trains; the batch-size search
// agrees across ranks when only one runs out of memory.

#include <gtest/gtest.h>

#include <new>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

namespace tandem {
namespace accelerator_utilities_test {

using testing::copy_state;
using testing::kHidden;
using testing::kIn;
using testing::kOut;
using testing::make_dataset;
using testing::Mlp;
using testing::reference_init;
using testing::run_ranks;

class Worlds : public ::testing::TestWithParam<int> {};

TEST_P(Worlds, ATriggerSetOnOneRankFiresOnAllAndResets) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    EXPECT_FALSE(accelerator.check_trigger());  // nobody set it
    if (pg.rank() == world - 1) accelerator.set_trigger();
    EXPECT_TRUE(accelerator.check_trigger()) << "rank " << pg.rank();
    EXPECT_FALSE(accelerator.check_trigger()) << "not reset on rank " << pg.rank();
    // Set on several ranks at once: one firing.
    accelerator.set_trigger();
    EXPECT_TRUE(accelerator.check_trigger());
    EXPECT_FALSE(accelerator.check_trigger());
  });
}

TEST_P(Worlds, FreeMemoryDropsThePreparedObjectsAndAFreshPrepareTrains) {
  const int world = GetParam();
  const Mlp init = reference_init();
  const auto data = make_dataset(world * 4);
  // The reference: one SGD step on the whole batch.
  Mlp reference(kIn, kHidden, kOut);
  copy_state(*reference, *init);
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.1));
  torch::mse_loss(reference(data.x), data.y).backward();
  reference_sgd.step();

  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    std::weak_ptr<torch::nn::Module> released;
    {
      Mlp model(kIn, kHidden, kOut);
      released = model.ptr();
      auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                     torch::optim::SGDOptions(0.1));
      auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, int64_t{4});
      for (auto& batch : *loader) {
        optimizer->zero_grad();
        accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
        optimizer->step();
      }
      EXPECT_EQ(accelerator.step(), 1);
    }
    EXPECT_FALSE(released.expired()) << "the Accelerator should hold what it prepared";
    accelerator.free_memory();
    EXPECT_TRUE(released.expired()) << "free_memory() kept a reference to the model";
    EXPECT_EQ(accelerator.step(), 0);
    EXPECT_EQ(accelerator.unwrap_model(), nullptr);

    // A fresh prepare trains like the first time.
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto sgd =
        std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    DistributedLoaderOptions options;
    options.batch_size = 4;
    options.shuffle = false;
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, options);
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
      optimizer->step();
    }
    EXPECT_EQ(accelerator.step(), 1);
    EXPECT_LT(testing::max_relative_diff(*model, *reference), 1e-5) << "rank " << pg.rank();
  });
}

// Accelerate's reduce_batch_size_fn, passed where a test pins halving.
int64_t halve(int64_t batch_size) { return batch_size / 2; }

// By default each retry takes int(batch_size * 0.9), as Accelerate 1.x's
// find_executable_batch_size does, down to its "reached zero" error; a
// reduce function that does not shrink is refused rather than looping.
TEST_P(Worlds, BatchSizeSearchShrinksByAccelerates0Point9ByDefault) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    std::vector<int64_t> tried;
    const int64_t found = accelerator.find_executable_batch_size(
        [&](int64_t batch_size) {
          tried.push_back(batch_size);
          if (pg.rank() == 0 && batch_size > 20) throw std::bad_alloc();
        },
        40);
    EXPECT_EQ(found, 19);
    EXPECT_EQ(tried, (std::vector<int64_t>{40, 36, 32, 28, 25, 22, 19}));
    tried.clear();
    EXPECT_THROW(accelerator.find_executable_batch_size(
                     [&](int64_t batch_size) {
                       tried.push_back(batch_size);
                       throw std::bad_alloc();
                     },
                     3),
                 UsageError);
    EXPECT_EQ(tried, (std::vector<int64_t>{3, 2, 1}));
    const std::string stuck = testing::usage_error_message([&] {
      accelerator.find_executable_batch_size([](int64_t) { throw std::bad_alloc(); }, 8,
                                             [](int64_t b) { return b; });
    });
    EXPECT_NE(stuck.find("reduce(8) returned 8, which is not smaller"), std::string::npos)
        << stuck;
  });
}

TEST_P(Worlds, BatchSizeSearchAgreesWhenOnlyOneRankRunsOutOfMemory) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    const int r = pg.rank();
    std::vector<int64_t> tried;
    const int64_t found = accelerator.find_executable_batch_size(
        [&](int64_t batch_size) {
          tried.push_back(batch_size);
          // The last rank has the least memory: only 5 rows fit.
          if (r == world - 1 && batch_size > 5) throw std::bad_alloc();
          // Rank 0 runs out through LibTorch's allocator error above 16.
          if (r == 0 && batch_size > 16) {
            TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (simulated)");
          }
        },
        40, halve);
    EXPECT_EQ(found, 5) << "rank " << r;
    EXPECT_EQ(tried, (std::vector<int64_t>{40, 20, 10, 5})) << "rank " << r;
  });
}

// LibTorch's CPU allocator reports running out of memory as a plain
// c10::Error ("DefaultCPUAllocator: can't allocate memory"): the search
// halves on it, as Accelerate's does, and still rethrows other c10::Errors.
TEST_P(Worlds, BatchSizeSearchHalvesOnTheCpuAllocatorsOutOfMemory) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    std::vector<int64_t> tried;
    const int64_t found = accelerator.find_executable_batch_size(
        [&](int64_t batch_size) {
          tried.push_back(batch_size);
          // Petabytes above 8: a real allocation the allocator refuses.
          if (batch_size > 8) (void)torch::empty({batch_size << 47}, torch::kByte);
        },
        64, halve);
    EXPECT_EQ(found, 8);
    EXPECT_EQ(tried, (std::vector<int64_t>{64, 32, 16, 8}));
    EXPECT_THROW(accelerator.find_executable_batch_size(
                     [](int64_t) { TORCH_CHECK(false, "a shape mismatch"); }, 4),
                 c10::Error);
  });
}

TEST_P(Worlds, BatchSizeSearchRethrowsOtherErrorsAndStopsAtZero) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    const int r = pg.rank();
    // Another error on one rank: that rank gets its own, the others an Error
    // naming it; nobody hangs.
    try {
      accelerator.find_executable_batch_size(
          [&](int64_t batch_size) {
            if (batch_size > 4) throw std::bad_alloc();
            if (r == 1) throw std::runtime_error("disk full");
          },
          16, halve);
      ADD_FAILURE() << "no error on rank " << r;
    } catch (const Error& e) {
      EXPECT_NE(r, 1) << "rank 1 should get its own std::runtime_error";
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("disk full"), std::string::npos) << e.what();
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(r, 1);
      EXPECT_STREQ(e.what(), "disk full");
    }
    int calls = 0;
    try {
      accelerator.find_executable_batch_size(
          [&](int64_t) {
            ++calls;
            if (r == 0) throw std::bad_alloc();
          },
          6, halve);
      ADD_FAILURE() << "reached zero without an error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("no executable batch size"), std::string::npos);
    }
    EXPECT_EQ(calls, 3);  // 6, 3, 1
    EXPECT_THROW(accelerator.find_executable_batch_size([](int64_t) {}, 0), UsageError);
  });
}

INSTANTIATE_TEST_SUITE_P(TwoAndThree, Worlds, ::testing::Values(2, 3));

}  // namespace accelerator_utilities_test
}  // namespace tandem
