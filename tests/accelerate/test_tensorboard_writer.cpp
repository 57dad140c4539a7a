// TensorBoardWriter against the tensorboard package: what tandem writes,
// EventAccumulator reads back (record CRCs, Event/Summary protobufs), scalars
// at float32 and text through the text plugin; and the Accelerator's
// log_with option.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "support/scratch_dir.h"
#include "support/subprocess.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/tensorboard_writer.h"
#include "tandem/core/error.h"

namespace tandem {
namespace tensorboard_writer_test {

using testing::run_process;
using testing::ScratchDir;

bool peer_has_tensorboard() {
  return run_process({TANDEM_PEER_PYTHON, "-c", "import tensorboard"}, 60).exit_code == 0;
}

// The folder's event files as the tensorboard package reads them.
nlohmann::json dump(const std::string& dir) {
  auto r = run_process({TANDEM_PEER_PYTHON,
                        std::string(TANDEM_SOURCE_DIR) + "/tests/support/tensorboard_dump.py", dir},
                       120);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(TensorBoardWriter, TheTensorboardPackageReadsScalarsAndText) {
  if (!peer_has_tensorboard()) GTEST_SKIP() << TANDEM_PEER_PYTHON << " has no tensorboard package";
  ScratchDir dir;
  const std::string logdir = dir.path() + "/runs/exp";
  {
    TensorBoardWriter tb(logdir);
    EXPECT_NE(tb.path().find("/events.out.tfevents."), std::string::npos) << tb.path();
    for (int step = 0; step < 5; ++step) {
      tb.add_scalar("loss", 1.0 / (step + 3), step * 10);
      tb.add_scalar("lr/group0", 3e-4 * step, step * 10);
    }
    tb.add_scalar("big_step", -2.5, int64_t{1} << 40);
    tb.add_text("notes", "lr **3e-4**, batch 64 — ünïcode", 7);
  }
  const auto got = dump(logdir);
  const auto& loss = got["scalars"]["loss"];
  ASSERT_EQ(loss.size(), 5u) << got;
  for (int step = 0; step < 5; ++step) {
    EXPECT_EQ(loss[step][0], step * 10);
    EXPECT_EQ(loss[step][1].get<double>(), static_cast<float>(1.0 / (step + 3))) << step;
    EXPECT_EQ(got["scalars"]["lr/group0"][step][1].get<double>(), static_cast<float>(3e-4 * step));
  }
  EXPECT_EQ(got["scalars"]["big_step"][0][0].get<int64_t>(), int64_t{1} << 40);
  EXPECT_EQ(got["scalars"]["big_step"][0][1].get<double>(), -2.5);
  ASSERT_EQ(got["texts"]["notes"].size(), 1u) << got;
  EXPECT_EQ(got["texts"]["notes"][0][0], 7);
  EXPECT_EQ(got["texts"]["notes"][0][1], "lr **3e-4**, batch 64 — ünïcode");
}

TEST(TensorBoardWriter, AFolderThatCannotBeCreatedIsAUsageErrorNamingIt) {
  ScratchDir dir;
  const std::string file = dir.path() + "/a_file";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  try {
    TensorBoardWriter tb(file + "/runs");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

TEST(TensorBoardWriter, AnUnknownTrackerIsRefusedNamingWhatIsAvailable) {
  AcceleratorOptions options;
  options.log_with = {"wandb"};
  try {
    Accelerator accelerator(options);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("log_with 'wandb' is not available"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("tensorboard"), std::string::npos) << e.what();
  }
}

}  // namespace tensorboard_writer_test
}  // namespace tandem
