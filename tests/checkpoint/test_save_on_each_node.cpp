// save_on_each_node with ranks as threads playing two hosts of two ranks
// (host ids) on one file system: the hosts find that they share the folder
// and commit it once; each host's local main also writes what rank 0 alone
// would (DDP's whole tensors); the state is the one a plain save holds.
// With the first host's files taken away, as on a host without a shared
// file system, the reader reads what the folder has and names what it
// lacks. tests/multinode/test_save_on_each_node.cpp runs it on hosts with
// folders of their own.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include <torch/torch.h>

#include "support/checkpoint_testing.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace {

// Two optimizer steps of the recipe's model at 4 ranks, ranks 0-1 on host
// "a" and 2-3 on host "b", under ZeRO `stage` (0: DDP); then save_state(dir).
void save_after_two_steps_on_two_hosts(const std::string& dir, int stage, bool each_node) {
  testing::Recipe r;
  Config config;
  config.zero.stage = stage;
  AcceleratorOptions options;
  options.save_on_each_node = each_node;
  testing::run_ranks_with_options(
      4,
      [&](ProcessGroup& pg) {
        Accelerator accelerator(pg.shared_from_this(), config, options);
        testing::Stack model = testing::make_model(r);
        auto adam = std::make_shared<torch::optim::Adam>(model->parameters(),
                                                         torch::optim::AdamOptions(1e-2));
        accelerator.prepare_model(model);
        auto optimizer = accelerator.prepare_optimizer(adam);
        for (int step = 0; step < 2; ++step) {
          auto [x, y] = testing::micro_batch(r, step, 0, pg.rank(), pg.world_size());
          optimizer->zero_grad();
          accelerator.backward(torch::nn::functional::cross_entropy(model->forward(x), y));
          optimizer->step();
        }
        accelerator.save_state(dir);
      },
      [](int rank) {
        ProcessGroupOptions o;
        o.host_id = rank < 2 ? "host-a" : "host-b";
        return o;
      });
}

bool has_model_tensors(const std::string& file) {
  SafetensorsReader reader(file);
  for (const auto& entry : reader.entries()) {
    if (entry.name.rfind("model/", 0) == 0) return true;
  }
  return false;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no CheckpointError)";
}

TEST(SaveOnEachNodeShared, HostsSharingTheFolderCommitItOnceWithTheStateOfAPlainSave) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(stage));
    testing::ScratchDir plain, each;
    save_after_two_steps_on_two_hosts(plain.path(), stage, false);
    save_after_two_steps_on_two_hosts(each.path(), stage, true);
    EXPECT_TRUE(testing::same_tensors(testing::consolidated(each.path()),
                                      testing::consolidated(plain.path())));
    // One tag, committed once: no temporaries, no host markers.
    std::vector<std::string> names = fs::list_directory(each.path());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"global_step2", "latest"}));
    const std::string tag = each / "global_step2";
    EXPECT_EQ(fs::list_directory(tag).size(), 5u);  // meta.json and 4 rank files
    CheckpointReader checkpoint(each.path());
    EXPECT_TRUE(checkpoint.meta().value("save_on_each_node", false));
    EXPECT_FALSE(CheckpointReader(plain.path()).meta().contains("save_on_each_node"));
    // DDP: host b's local main (rank 2) keeps the whole model too (what rank
    // 0 alone writes), its other rank does not. (ZeRO's ranks each write
    // their own shards, either way.)
    if (stage == 0) {
      EXPECT_TRUE(has_model_tensors(tag + "/rank_00002.safetensors"));
      EXPECT_FALSE(has_model_tensors(tag + "/rank_00003.safetensors"));
      EXPECT_FALSE(has_model_tensors(plain / "global_step2/rank_00002.safetensors"));
    }
  }
}

TEST(SaveOnEachNodeShared, AHostsFolderReadsWhatItHoldsAndNamesTheFilesItLacks) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(stage));
    testing::ScratchDir each;
    save_after_two_steps_on_two_hosts(each.path(), stage, true);
    const auto whole = testing::consolidated(each.path());
    // Host b's folder, had it not shared host a's.
    fs::remove(each / "global_step2/rank_00000.safetensors");
    fs::remove(each / "global_step2/rank_00001.safetensors");
    CheckpointReader checkpoint(each.path());
    EXPECT_EQ(checkpoint.absent_files(),
              (std::vector<std::string>{"rank_00000.safetensors", "rank_00001.safetensors"}));
    // DDP's whole tensors are on every host; ZeRO's shards only on their
    // ranks' hosts (block2 is in rank 0's).
    for (const char* name : {"input.weight", "block2.fc.weight"}) {
      for (const char* section : {"model", "optim/exp_avg"}) {
        const at::Tensor saved = whole.at(std::string(section) + "/" + name);
        if (stage == 0 || std::string(name) == "input.weight") {
          EXPECT_TRUE(checkpoint.read_whole(section, name, saved.sizes().vec()).equal(saved))
              << section << "/" << name;
          continue;
        }
        const std::string error =
            error_of([&] { checkpoint.read_whole(section, name, saved.sizes().vec()); });
        EXPECT_NE(error.find("saved with save_on_each_node, and this host's copy lacks "
                             "rank_00000.safetensors, rank_00001.safetensors (they are on the "
                             "other hosts)"),
                  std::string::npos)
            << error;
      }
    }
    // This host's ranks' own tensors are all there.
    EXPECT_TRUE(checkpoint.read_rank_tensor(2, "rng/cpu").has_value());
    EXPECT_FALSE(checkpoint.read_rank_tensor(0, "rng/cpu").has_value());
  }
  // A plain checkpoint missing a rank file is still refused when opened.
  testing::ScratchDir plain;
  save_after_two_steps_on_two_hosts(plain.path(), 0, false);
  fs::remove(plain / "global_step2/rank_00003.safetensors");
  EXPECT_NE(error_of([&] { CheckpointReader checkpoint(plain.path()); })
                .find("rank_00003.safetensors' is missing: checkpoint"),
            std::string::npos);
}

// load_state on ranks that pass host a's folder (ranks 0-1) and `b_dir`
// (ranks 2-3): each rank's CheckpointError, "" where it loaded. A 20 s
// timeout: were the ranks not to agree first, those that can read would
// wait in the load's collectives for the others.
std::vector<std::string> load_on_two_hosts(const std::string& a_dir, const std::string& b_dir) {
  testing::Recipe r;
  std::vector<std::string> errors(4);
  testing::run_ranks_with_options(
      4,
      [&](ProcessGroup& pg) {
        Accelerator accelerator(pg.shared_from_this(), Config{}, AcceleratorOptions{});
        testing::Stack model = testing::make_model(r);
        auto adam = std::make_shared<torch::optim::Adam>(model->parameters(),
                                                         torch::optim::AdamOptions(1e-2));
        accelerator.prepare_model(model);
        auto optimizer = accelerator.prepare_optimizer(adam);
        std::string error;
        try {
          accelerator.load_state(pg.rank() < 2 ? a_dir : b_dir);
        } catch (const CheckpointError& e) {
          error = e.what();
        }
        errors[static_cast<std::size_t>(pg.rank())] = error;
      },
      [](int rank) {
        ProcessGroupOptions o;
        o.host_id = rank < 2 ? "host-a" : "host-b";
        o.timeout = std::chrono::seconds(20);
        return o;
      });
  return errors;
}

// A host whose folder lacks the checkpoint, or holds another save, stops
// every rank's load_state at once with the reason, before anything loads.
TEST(SaveOnEachNodeShared, ALoadSomeHostCannotReadStopsEveryRankWithTheReason) {
  testing::ScratchDir a, b;
  save_after_two_steps_on_two_hosts(a.path(), 0, true);
  std::string output;
  ASSERT_EQ(testing::run_shell_capture("cp -r '" + a.path() + "/.' '" + b.path() + "' 2>&1",
                                       output),
            0)
      << output;
  // The same save on both hosts loads.
  for (const std::string& error : load_on_two_hosts(a.path(), b.path())) EXPECT_EQ(error, "");

  // Host b's copy names another tag (an older save, say).
  fs::rename(b / "global_step2", b / "global_step1");
  { std::ofstream(b / "latest") << "global_step1"; }
  auto errors = load_on_two_hosts(a.path(), b.path());
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(errors[rank].find("the ranks opened different checkpoints:\n  ranks 0, 1: "
                                "global_step2"),
              std::string::npos)
        << "rank " << rank << ": " << errors[rank];
    EXPECT_NE(errors[rank].find("ranks 2, 3: global_step1"), std::string::npos) << errors[rank];
  }

  // Host b has no checkpoint at all.
  fs::remove_all(b.path());
  fs::create_directories(b.path());
  errors = load_on_two_hosts(a.path(), b.path());
  for (int rank = 0; rank < 4; ++rank) EXPECT_NE(errors[rank], "") << "rank " << rank;
  for (int rank : {0, 1}) {
    EXPECT_NE(errors[rank].find("not every rank can read the checkpoint, so none loads it"),
              std::string::npos)
        << errors[rank];
    EXPECT_NE(errors[rank].find("rank 2: "), std::string::npos) << errors[rank];
    EXPECT_NE(errors[rank].find("rank 3: "), std::string::npos) << errors[rank];
  }
  EXPECT_NE(errors[2].find(b.path()), std::string::npos) << errors[2];
}

}  // namespace
}  // namespace tandem
