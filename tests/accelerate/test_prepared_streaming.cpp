// Accelerator::prepare_streaming_loader: an iterable dataset prepared as
// Accelerate prepares a DataLoader over an IterableDataset. The last batch of
// each pass syncs gradients whatever the accumulation count, and a run saved
// mid-epoch and resumed in new processes ends exactly where the straight run
// ends: save_state keeps the stream's epoch and position.

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "support/log_capture.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace {

constexpr int64_t kStreamSamples = 37;  // odd: ranks' shards differ in length
constexpr int64_t kStreamEpochs = 2;

// Sample k of epoch e: 4 features drawn from seed e * 1000 + k, class k % 3.
StreamFactory numbered_stream() {
  return [](const StreamShard& shard, int64_t epoch) -> SampleStream {
    auto k = std::make_shared<int64_t>(0);
    SampleStream all = [k, epoch]() -> std::optional<Sample> {
      if (*k >= kStreamSamples) return std::nullopt;
      auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(epoch * 1000 + *k));
      Sample s{torch::randn({4}, gen), torch::tensor(*k % 3)};
      ++*k;
      return s;
    };
    return shard_stream(all, shard);
  };
}

struct StreamRunResult {
  std::map<std::string, at::Tensor> params;  // rank 0's
  int64_t steps = 0;
  int64_t batches = 0;  // micro-batches this run trained on (rank 0)
};

// Trains the stream's epochs at `world` ranks with accumulation 2: from
// `load_from` when given; stops after `stop_after` micro-batches (-1: at the
// end) and saves to `save_to`.
StreamRunResult train_stream(int world, const std::string& load_from, int64_t stop_after,
                             const std::string& save_to, int64_t num_workers = 0) {
  Config config;
  config.gradient_accumulation_steps = 2;
  StreamRunResult result;
  std::mutex mutex;
  testing::run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    torch::nn::Linear model(4, 3);
    {
      torch::NoGradGuard no_grad;
      auto gen = at::detail::createCPUGenerator(5);
      model->weight.copy_(torch::randn({3, 4}, gen) * 0.3);
      model->bias.zero_();
    }
    accelerator.prepare_model(model.ptr());
    auto optimizer = accelerator.prepare_optimizer(
        std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2)));
    StreamingLoaderOptions options;
    options.batch_size = 3;
    options.num_workers = num_workers;
    auto loader = accelerator.prepare_streaming_loader(numbered_stream(), options);
    if (!load_from.empty()) accelerator.load_state(load_from);
    int64_t batches = 0;
    bool stopped = false;
    for (int64_t epoch = loader->epoch(); epoch < kStreamEpochs && !stopped; ++epoch) {
      loader->set_epoch(epoch);
      for (auto& batch : *loader) {
        auto loss = torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
        if (loader->padding()) loss = loss * 0;  // this rank's data had ended
        accelerator.backward(loss);
        optimizer->step();
        optimizer->zero_grad();
        if (++batches == stop_after) {
          stopped = true;
          break;
        }
      }
    }
    if (!save_to.empty()) accelerator.save_state(save_to);
    if (pg.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& p : model->named_parameters()) result.params[p.key()] = p.value().clone();
      result.steps = accelerator.step();
      result.batches = batches;
    }
  });
  return result;
}

// Batches per pass at `world` with even batches: the longest shard's.
int64_t batches_per_pass(int world) {
  const int64_t longest = (kStreamSamples + world - 1) / world;
  return (longest + 2) / 3;
}

TEST(PreparedStreaming, TheLastBatchOfEachPassSyncsWhateverTheAccumulation) {
  for (int world : {2, 3}) {
    const StreamRunResult r = train_stream(world, "", -1, "");
    const int64_t per_pass = batches_per_pass(world);  // 7 at world 2, 5 at world 3
    EXPECT_EQ(r.batches, kStreamEpochs * per_pass) << "world " << world;
    // Accumulation 2 and an odd pass: the last batch steps on its own.
    EXPECT_EQ(r.steps, kStreamEpochs * ((per_pass + 1) / 2)) << "world " << world;
  }
}

TEST(PreparedStreaming, ARunResumedMidEpochEndsWhereTheStraightRunEnds) {
  for (int world : {2, 3}) {
    const StreamRunResult straight = train_stream(world, "", -1, "");
    testing::ScratchDir dir;
    // Into the second epoch, at a step boundary (accumulation 2).
    const int64_t stop = batches_per_pass(world) + (world == 2 ? 4 : 2);
    const StreamRunResult first = train_stream(world, "", stop, dir.path());
    EXPECT_EQ(first.batches, stop);
    const StreamRunResult resumed = train_stream(world, dir.path(), -1, "");
    EXPECT_EQ(first.batches + resumed.batches, straight.batches) << "world " << world;
    EXPECT_EQ(resumed.steps, straight.steps) << "world " << world;
    for (const auto& [name, value] : straight.params) {
      EXPECT_TRUE(torch::equal(resumed.params.at(name), value)) << "world " << world << ": "
                                                                << name;
    }
  }
}

// A stream's position is batches of a rank's own shard; cut into other
// shards (another world size or num_workers) it cannot resume exactly, and
// load_state says so rather than skipping the wrong samples in silence.
TEST(PreparedStreaming, ResumingWithOtherShardsWarnsThatThePositionIsNotCarriedOver) {
  testing::ScratchDir dir;
  train_stream(2, "", 4, dir.path());  // mid-way through the first pass
  const std::string same = testing::info_log_of([&] { train_stream(2, dir.path(), -1, ""); });
  EXPECT_EQ(same.find("streaming loader"), std::string::npos) << same;
  const std::string wider = testing::info_log_of([&] { train_stream(3, dir.path(), -1, ""); });
  EXPECT_NE(wider.find("streaming loader saved mid-epoch with its stream read as 2 shards "
                       "(processes x workers; 2 processes), and this run reads it as 3 (3 "
                       "processes)"),
            std::string::npos)
      << wider;
  EXPECT_NE(wider.find("skips the first 4 batches"), std::string::npos) << wider;
  const std::string workers =
      testing::info_log_of([&] { train_stream(2, dir.path(), -1, "", /*num_workers=*/2); });
  EXPECT_NE(workers.find("reads it as 4 (2 processes)"), std::string::npos) << workers;
}

TEST(PreparedStreaming, SplitBatchesMakesBatchSizeTheGlobalBatch) {
  AcceleratorOptions options;
  options.split_batches = true;
  testing::run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
    StreamingLoaderOptions loader_options;
    loader_options.batch_size = 6;
    auto loader = accelerator.prepare_streaming_loader(numbered_stream(), loader_options);
    auto batch = loader->next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ((*batch)[0].size(0), 3);
    loader_options.batch_size = 5;
    EXPECT_THROW(accelerator.prepare_streaming_loader(numbered_stream(), loader_options),
                 UsageError);
  });
}

// Ranks whose streams end at different batches would leave the others
// waiting in their next backward() forever: the Accelerator refuses
// even_batches = false for a streaming loader (Accelerate evens iterable
// datasets whatever it says), and takes it at one process.
TEST(PreparedStreaming, EvenBatchesOffIsRefusedAcrossRanksBeforeAnyBatch) {
  for (int world : {2, 3}) {
    const auto errors = testing::rank_errors<UsageError>(world, [&](ProcessGroup& pg) {
      Accelerator accelerator(pg.shared_from_this(), Config{});
      StreamingLoaderOptions loader_options;
      loader_options.batch_size = 4;
      loader_options.even_batches = false;
      accelerator.prepare_streaming_loader(numbered_stream(), loader_options);
    });
    ASSERT_EQ(static_cast<int>(errors.size()), world);
    for (const auto& [rank, error] : errors) {
      EXPECT_NE(error.find("even_batches = false is not supported"), std::string::npos)
          << rank << ": " << error;
    }
  }
  testing::run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    StreamingLoaderOptions loader_options;
    loader_options.batch_size = 4;
    loader_options.even_batches = false;
    auto loader = accelerator.prepare_streaming_loader(numbered_stream(), loader_options);
    EXPECT_TRUE(loader->next().has_value());
  });
}

}  // namespace
}  // namespace tandem
