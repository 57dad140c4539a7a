// The checkpoint directory: tags, `latest`, total_limit, and corrupt or
// incomplete checkpoints reported as CheckpointError naming the file.

#include <gtest/gtest.h>

#include <fstream>

#include <torch/torch.h>

#include "support/checkpoint_testing.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace {

using TempDir = testing::ScratchDir;

// Saves `count` tags (step1, step2, ...) of a small model from 2 ranks.
void save_tags(const std::string& dir, int count, int total_limit) {
  testing::run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    torch::nn::Linear model(8, 8);
    accelerator.prepare_model(model);
    for (int i = 1; i <= count; ++i) {
      SaveStateOptions options;
      options.tag = "step" + std::to_string(i);
      options.total_limit = total_limit;
      accelerator.save_state(dir, options);
    }
  });
}

void flip_byte(const std::string& path, std::streamoff from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  f.seekp(-from_end, std::ios::end);
  c = static_cast<char>(c ^ 0x10);
  f.write(&c, 1);
}

TEST(CheckpointDir, TotalLimitKeepsTheNewestTagsAndLatestNamesTheLast) {
  TempDir dir;
  save_tags(dir.path(), 4, 2);
  EXPECT_EQ(checkpoint_tags(dir.path()), (std::vector<std::string>{"step3", "step4"}));
  EXPECT_EQ(latest_checkpoint_tag(dir.path()), std::optional<std::string>("step4"));
}

TEST(CheckpointDir, EveryRankWritesItsOwnFileAndMetaListsThem) {
  TempDir dir;
  save_tags(dir.path(), 1, 0);
  CheckpointReader reader(dir.path());
  EXPECT_EQ(reader.tag(), "step1");
  EXPECT_EQ(reader.world_size(), 2);
  EXPECT_EQ(reader.meta()["files"].size(), 2u);
  EXPECT_TRUE(reader.read_rank_tensor(1, "rng/cpu").has_value());
}

// A save whose `latest` cannot be pointed at the new tag (here `latest` is
// a folder the rename cannot replace; a full disk fails the same way)
// commits nothing: the new tag is not left behind for a later run to find,
// `latest` still names the previous tag, and the error says so.
TEST(CheckpointDir, ASaveThatCannotUpdateLatestLeavesNoNewTagBehind) {
  TempDir dir;
  save_tags(dir.path(), 1, 0);
  const std::string latest = dir.path() + "/latest";
  std::string text;
  std::getline(std::ifstream(latest), text);
  ASSERT_EQ(text, "step1");
  fs::remove(latest);
  fs::create_directories(latest + "/blocker");
  const auto errors = testing::rank_errors<CheckpointError>(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    torch::nn::Linear model(8, 8);
    accelerator.prepare_model(model);
    SaveStateOptions options;
    options.tag = "step2";
    accelerator.save_state(dir.path(), options);
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& [rank, error] : errors) {
    EXPECT_NE(error.find("failed to commit"), std::string::npos) << rank << ": " << error;
    EXPECT_NE(error.find("nothing was committed"), std::string::npos) << rank << ": " << error;
  }
  EXPECT_FALSE(fs::exists(dir.path() + "/step2"))
      << "the uncommitted tag was left behind";
  EXPECT_EQ(checkpoint_tags(dir.path()), (std::vector<std::string>{"step1"}));
  EXPECT_FALSE(fs::exists(dir.path() + "/.latest.tmp"));
}

TEST(CheckpointDir, CorruptOrIncompleteCheckpointsNameTheFile) {
  TempDir dir;
  save_tags(dir.path(), 1, 0);
  const std::string tag = dir / "step1";
  // A flipped data byte: caught by the tensor's CRC when it is read.
  flip_byte(tag + "/rank_00001.safetensors", 20);
  try {
    CheckpointReader reader(dir.path());
    (void)reader.read_rank_tensor(1, "rng/cpu");
    (void)testing::rank_files(dir.path(), "step1");
    FAIL() << "a flipped byte went unnoticed";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_00001.safetensors"), std::string::npos)
        << e.what();
  }
  // meta.json: a flipped digit fails its checksum.
  flip_byte(tag + "/meta.json", 30);
  EXPECT_THROW(CheckpointReader reader(dir.path()), CheckpointError);
  // A missing rank file, and `latest` naming nothing.
  TempDir other;
  save_tags(other.path(), 1, 0);
  std::remove((other / "step1/rank_00000.safetensors").c_str());
  EXPECT_THROW(CheckpointReader reader(other.path()), CheckpointError);
  std::ofstream(other / "latest") << "step9\n";
  EXPECT_THROW(CheckpointReader reader(other.path()), CheckpointError);
  EXPECT_FALSE(Accelerator::has_checkpoint(other.path()));
  TempDir empty;
  EXPECT_THROW(CheckpointReader reader(empty.path()), CheckpointError);
}

TEST(CheckpointDir, LoadingIntoADifferentModelIsAUsageErrorNamingTheParameter) {
  TempDir dir;
  save_tags(dir.path(), 1, 0);
  testing::run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    torch::nn::Linear model(8, 4);
    accelerator.prepare_model(model);
    try {
      accelerator.load_state(dir.path());
      FAIL() << "a shape mismatch loaded";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("weight"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace tandem
