// Specification of tandem::DistributedLoader beyond index order: background
// prefetch (same batches, errors in order, clean shutdown), torch::data
// datasets, and misuse of iteration.

#include <atomic>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <torch/data/datasets/base.h>

#include "support/loader_testing.h"
#include "tandem/core/error.h"
#include "tandem/data/distributed_loader.h"

namespace tandem {
namespace {

using testing::drain;
using testing::values;

DistributedLoaderOptions options_with(int64_t batch_size, int64_t prefetch) {
  DistributedLoaderOptions options;
  options.batch_size = batch_size;
  options.prefetch = prefetch;
  options.seed = 9;
  return options;
}

TEST(LoaderPrefetch, YieldsTheSameBatchesAsSynchronousLoading) {
  const at::Tensor x = at::arange(61, at::kLong);
  DistributedLoader sync({x}, 3, 2, options_with(4, 0));
  for (int64_t prefetch : {1, 2, 16}) {
    SCOPED_TRACE("prefetch=" + std::to_string(prefetch));
    DistributedLoader ahead({x}, 3, 2, options_with(4, prefetch));
    for (int64_t epoch : {0, 1}) {
      sync.set_epoch(epoch);
      ahead.set_epoch(epoch);
      EXPECT_EQ(drain(ahead), drain(sync));
    }
    sync.skip_first_batches(3);
    ahead.skip_first_batches(3);
    EXPECT_EQ(drain(ahead), drain(sync));
  }
}

TEST(LoaderPrefetch, RethrowsAFetchErrorAtItsBatchAndRecovers) {
  std::atomic<bool> fail{true};
  DistributedLoader::Fetch fetch = [&fail](const std::vector<int64_t>& indices) {
    if (fail && indices.front() == 30) throw std::runtime_error("sample 30 is corrupt");
    return DistributedLoader::Batch{at::tensor(indices, at::kLong)};
  };
  DistributedLoaderOptions options = options_with(5, 3);
  options.shuffle = false;
  DistributedLoader loader(fetch, 50, 1, 0, options);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(loader.next().has_value()) << "batch " << i;
  EXPECT_THROW(loader.next(), std::runtime_error);
  // The failed pass is over; the next one starts from the top.
  fail = false;
  auto first = loader.next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(values(first->at(0)), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(LoaderPrefetch, AbandoningAPassOrTheLoaderJoinsTheThread) {
  std::atomic<int> fetched{0};
  DistributedLoader::Fetch fetch = [&fetched](const std::vector<int64_t>& indices) {
    ++fetched;
    return DistributedLoader::Batch{at::tensor(indices, at::kLong)};
  };
  {
    DistributedLoader loader(fetch, 1000, 2, 0, options_with(1, 4));
    ASSERT_TRUE(loader.next().has_value());
    loader.set_epoch(1);  // ends the pass with batches still queued
    ASSERT_TRUE(loader.next().has_value());
  }  // destroyed mid-pass: must join, not hang or touch freed memory
  // Bounded read-ahead: at most prefetch + 1 batches per started pass (one
  // popped, `prefetch` queued, one in the making).
  EXPECT_LE(fetched.load(), 2 * (1 + 4 + 1));
}

TEST(LoaderPrefetch, MovedLoaderContinuesItsPass) {
  DistributedLoader source({at::arange(40, at::kLong)}, 2, 0, options_with(2, 2));
  DistributedLoader reference({at::arange(40, at::kLong)}, 2, 0, options_with(2, 0));
  const auto expected = drain(reference);
  std::vector<std::vector<int64_t>> got;
  got.push_back(values(source.next()->at(0)));
  DistributedLoader moved(std::move(source));
  while (auto batch = moved.next()) got.push_back(values(batch->at(0)));
  EXPECT_EQ(got, expected);
}

// A torch::data dataset of `n` examples: data {i, 2i} (float), target i % 3.
class PairDataset : public torch::data::datasets::Dataset<PairDataset> {
 public:
  explicit PairDataset(size_t n) : n_(n) {}
  torch::data::Example<> get(size_t index) override {
    const auto i = static_cast<double>(index);
    return {at::tensor({i, 2 * i}), at::scalar_tensor(static_cast<int64_t>(index % 3))};
  }
  c10::optional<size_t> size() const override { return n_; }

 private:
  size_t n_;
};

TEST(LoaderDatasets, TorchDataDatasetIsStackedIntoDataAndTarget) {
  for (int64_t prefetch : {0, 2}) {
    auto loader = make_distributed_loader(PairDataset(11), 2, 1, options_with(4, prefetch));
    loader.set_epoch(2);
    const auto chunks = testing::chunks(loader.epoch_indices(), 4);
    ASSERT_EQ(loader.size(), 2);  // 6 samples on rank 1: 4 + 2
    size_t b = 0;
    for (auto& batch : loader) {
      ASSERT_EQ(batch.size(), 2u);
      const auto& idx = chunks.at(b++);
      const auto n = static_cast<int64_t>(idx.size());
      ASSERT_EQ(batch[0].sizes(), (std::vector<int64_t>{n, 2}));
      const at::Tensor i = at::tensor(idx, at::kLong);
      EXPECT_TRUE(batch[0].select(1, 0).equal(i.to(at::kDouble)));
      EXPECT_TRUE(batch[0].select(1, 1).equal(i.to(at::kDouble) * 2));
      EXPECT_TRUE(batch[1].equal(i.remainder(3)));
    }
    EXPECT_EQ(b, 2u);
  }
}

class DataOnlyDataset
    : public torch::data::datasets::Dataset<DataOnlyDataset, torch::data::TensorExample> {
 public:
  torch::data::TensorExample get(size_t index) override {
    return torch::data::TensorExample(at::full({3}, static_cast<int64_t>(index), at::kLong));
  }
  c10::optional<size_t> size() const override { return 5; }
};

class StreamDataset : public torch::data::datasets::Dataset<StreamDataset> {
 public:
  torch::data::Example<> get(size_t) override { return {at::zeros({1}), at::zeros({1})}; }
  c10::optional<size_t> size() const override { return c10::nullopt; }
};

TEST(LoaderDatasets, DataOnlyExamplesGiveOneFieldAndUnsizedDatasetsAreRejected) {
  auto options = options_with(5, 0);
  options.shuffle = false;
  auto loader = make_distributed_loader(DataOnlyDataset(), 1, 0, options);
  auto batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->size(), 1u);
  EXPECT_TRUE(batch->at(0).equal(at::arange(5, at::kLong).unsqueeze(1).expand({5, 3})));
  EXPECT_THROW(make_distributed_loader(StreamDataset(), 1, 0), UsageError);
}

TEST(LoaderIteration, SetEpochInsideTheLoopBodyIsReported) {
  DistributedLoader loader({at::arange(10, at::kLong)}, 1, 0, options_with(2, 0));
  auto it = loader.begin();
  ASSERT_NE(it, loader.end());
  loader.set_epoch(1);
  EXPECT_THROW(++it, UsageError);
}

}  // namespace
}  // namespace tandem
