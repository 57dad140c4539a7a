// Specification of DistributedLoader's worker threads (num_workers): the
// same batches as synchronous loading for every worker count, in order even
// when workers finish out of order, a bounded number in flight, exact
// mid-epoch resume, errors that name their batch, and clean shutdown.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "support/loader_testing.h"
#include "tandem/core/error.h"
#include "tandem/data/distributed_loader.h"

namespace tandem {
namespace {

using testing::drain;
using testing::values;
using Batches = std::vector<std::vector<int64_t>>;

DistributedLoaderOptions with_workers(int64_t batch_size, int64_t workers, int64_t factor = 2) {
  DistributedLoaderOptions options;
  options.batch_size = batch_size;
  options.num_workers = workers;
  options.prefetch_factor = factor;
  options.seed = 11;
  return options;
}

TEST(LoaderWorkers, YieldTheSameBatchesAsSynchronousLoadingForAnyWorkerCount) {
  for (int64_t world : {1, 2, 3}) {
    for (int64_t rank = 0; rank < world; ++rank) {
      DistributedLoader sync({at::arange(67, at::kLong)}, world, rank, with_workers(4, 0));
      for (int64_t workers : {1, 2, 3, 5}) {
        for (int64_t factor : {1, 3}) {
          SCOPED_TRACE("world=" + std::to_string(world) + " rank=" + std::to_string(rank) +
                       " workers=" + std::to_string(workers) + " factor=" +
                       std::to_string(factor));
          DistributedLoader par({at::arange(67, at::kLong)}, world, rank,
                                with_workers(4, workers, factor));
          for (int64_t epoch : {0, 3}) {
            sync.set_epoch(epoch);
            par.set_epoch(epoch);
            const Batches expected = drain(sync);
            ASSERT_FALSE(expected.empty());
            EXPECT_EQ(drain(par), expected);
          }
        }
      }
    }
  }
}

// The resume contract the Accelerator's checkpoints rely on.
TEST(LoaderWorkers, SkipFirstBatchesResumesExactlyWithAnyWorkerCount) {
  const at::Tensor x = at::arange(83, at::kLong);
  DistributedLoader reference({x}, 3, 1, with_workers(5, 0));
  reference.set_epoch(2);
  const Batches full = drain(reference);  // 28 samples on rank 1: 6 batches
  ASSERT_EQ(full.size(), 6u);
  for (int64_t workers : {0, 1, 3}) {
    DistributedLoader loader({x}, 3, 1, with_workers(5, workers));
    loader.set_epoch(2);
    for (int64_t k : {0, 1, 4, 5, 6, 9}) {
      SCOPED_TRACE("workers=" + std::to_string(workers) + " k=" + std::to_string(k));
      loader.skip_first_batches(k);
      const auto from = full.begin() + std::min<std::ptrdiff_t>(k, 6);
      EXPECT_EQ(drain(loader), Batches(from, full.end()));
    }
    // Interrupting a pass mid-way and resuming where it stopped also matches.
    Batches resumed;
    for (int i = 0; i < 2; ++i) resumed.push_back(values(loader.next()->at(0)));
    loader.skip_first_batches(2);
    for (auto& batch : loader) resumed.push_back(values(batch[0]));
    EXPECT_EQ(resumed, full);
  }
}

TEST(LoaderWorkers, BatchesFinishedOutOfOrderAreYieldedInOrder) {
  // Batch 0 is held back until batches 1 and 2 are done, so with three
  // workers the loader must wait for a batch that finishes last.
  std::mutex mutex;
  std::condition_variable done;
  std::vector<int64_t> finish_order;
  bool gave_up = false;
  DistributedLoader::Fetch fetch = [&](const std::vector<int64_t>& indices) {
    const int64_t b = indices.front() / 2;
    std::unique_lock<std::mutex> lock(mutex);
    if (b == 0) {
      gave_up = !done.wait_for(lock, std::chrono::seconds(60), [&] {
        return finish_order.size() >= 2;
      });
    }
    finish_order.push_back(b);
    done.notify_all();
    return DistributedLoader::Batch{at::tensor(indices, at::kLong)};
  };
  DistributedLoaderOptions options = with_workers(2, 3);
  options.shuffle = false;
  DistributedLoader loader(fetch, 12, 1, 0, options);
  const Batches got = drain(loader);
  EXPECT_FALSE(gave_up) << "the other workers never finished a batch while batch 0 waited";
  ASSERT_GE(finish_order.size(), 3u);
  EXPECT_NE(finish_order.front(), 0) << "batch 0 should have finished after others";
  EXPECT_EQ(got, testing::chunks({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 2));
}

TEST(LoaderWorkers, KeepAtMostWorkersTimesPrefetchFactorBatchesInFlight) {
  for (int64_t workers : {1, 2, 3}) {
    for (int64_t factor : {1, 2}) {
      std::atomic<int64_t> started{0};
      DistributedLoader::Fetch fetch = [&started](const std::vector<int64_t>& indices) {
        ++started;
        return DistributedLoader::Batch{at::tensor(indices, at::kLong)};
      };
      DistributedLoader loader(fetch, 200, 1, 0, with_workers(1, workers, factor));
      int64_t popped = 0;
      while (auto batch = loader.next()) {
        ++popped;
        // Claimed and not yet popped: at most workers * factor.
        EXPECT_LE(started.load(), popped + workers * factor)
            << "workers=" << workers << " factor=" << factor;
      }
      EXPECT_EQ(popped, 200);
      EXPECT_EQ(started.load(), 200) << "every batch assembled exactly once";
    }
  }
}

TEST(LoaderWorkers, AFetchErrorComesBackAtItsBatchWithTheOriginalNested) {
  for (int64_t workers : {0, 1, 3}) {
    SCOPED_TRACE("workers=" + std::to_string(workers));
    std::atomic<bool> fail{true};
    DistributedLoader::Fetch fetch = [&fail](const std::vector<int64_t>& indices) {
      if (fail && indices.front() == 30) throw std::invalid_argument("sample 30 is corrupt.");
      return DistributedLoader::Batch{at::tensor(indices, at::kLong)};
    };
    DistributedLoaderOptions options = with_workers(5, workers);
    options.shuffle = false;
    DistributedLoader loader(fetch, 50, 1, 0, options);
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(loader.next().has_value()) << "batch " << i;
    std::string message;
    bool nested_original = false;
    try {
      loader.next();
    } catch (const Error& e) {
      message = e.what();
      try {
        std::rethrow_if_nested(e);
      } catch (const std::invalid_argument& original) {
        nested_original = std::string(original.what()) == "sample 30 is corrupt.";
      }
    }
    EXPECT_EQ(message.find("corrupt.."), std::string::npos) << "two full stops: " << message;
    EXPECT_NE(message.find("batch 6 of epoch 0"), std::string::npos) << message;
    EXPECT_NE(message.find("sample 30 is corrupt"), std::string::npos) << message;
    EXPECT_NE(message.find(workers > 0 ? "worker" : "calling thread"), std::string::npos)
        << message;
    EXPECT_TRUE(nested_original);
    fail = false;  // the failed pass ended; the next one starts from the top
    auto first = loader.next();
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(values(first->at(0)), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  }
}

TEST(LoaderWorkers, EndingAPassOrDestroyingTheLoaderJoinsTheWorkers) {
  std::atomic<int64_t> started{0};
  DistributedLoader::Fetch fetch = [&started](const std::vector<int64_t>& indices) {
    ++started;
    return DistributedLoader::Batch{at::tensor(indices, at::kLong)};
  };
  {
    DistributedLoader loader(fetch, 1000, 2, 0, with_workers(1, 3, 2));
    ASSERT_TRUE(loader.next().has_value());
    loader.set_epoch(1);  // ends the pass with batches in flight
    ASSERT_TRUE(loader.next().has_value());
    loader.skip_first_batches(7);
    ASSERT_TRUE(loader.next().has_value());
  }  // destroyed mid-pass: must join, not hang or touch freed memory
  // Three passes, each at most 1 popped + 3 * 2 in flight.
  EXPECT_LE(started.load(), 3 * (1 + 6));
}

TEST(LoaderWorkers, WorkersRunWithTheThreadStateOfThePassStart) {
  std::atomic<int> grad_enabled{0};
  std::atomic<int> fetched{0};
  DistributedLoader::Fetch fetch = [&](const std::vector<int64_t>& indices) {
    ++fetched;
    if (at::GradMode::is_enabled()) ++grad_enabled;
    return DistributedLoader::Batch{at::tensor(indices, at::kLong)};
  };
  DistributedLoader loader(fetch, 24, 1, 0, with_workers(2, 3));
  {
    at::NoGradGuard no_grad;  // as in an evaluation loop
    EXPECT_EQ(drain(loader).size(), 12u);
  }
  EXPECT_EQ(fetched.load(), 12);
  EXPECT_EQ(grad_enabled.load(), 0) << "a worker assembled a batch with grad mode on";
}

TEST(LoaderWorkers, BadWorkerOptionsAreRejected) {
  const at::Tensor x = at::arange(10, at::kLong);
  auto bad = [&](auto edit) {
    DistributedLoaderOptions options;
    edit(options);
    return DistributedLoader({x}, 1, 0, options);
  };
  EXPECT_THROW(bad([](auto& o) { o.num_workers = -1; }), UsageError);
  EXPECT_THROW(bad([](auto& o) { o.prefetch_factor = 0; }), UsageError);
  EXPECT_THROW(bad([](auto& o) {
                 o.num_workers = 2;
                 o.prefetch = 2;
               }),
               UsageError);
  EXPECT_THROW(bad([](auto& o) { o.bucket_pool_batches = 0; }), UsageError);
}

}  // namespace
}  // namespace tandem
