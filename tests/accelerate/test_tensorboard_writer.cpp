// TensorBoardWriter against the tensorboard package: what tandem writes,
// EventAccumulator reads back (record CRCs, Event/Summary protobufs), scalars
// at float32, text through the text plugin and hparams through the hparams
// plugin's own parsers and backend; and the Accelerator's log_with option
// and init_trackers config.

#include <gtest/gtest.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "tandem/core/file_system.h"
#include "support/scratch_dir.h"
#include "support/subprocess.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/tensorboard_writer.h"
#include "tandem/core/error.h"

namespace tandem {
namespace tensorboard_writer_test {

using testing::run_process;
using testing::run_ranks;
using testing::ScratchDir;

bool peer_has_tensorboard() {  // asked once per process
  static const bool has =
      run_process({TANDEM_PEER_PYTHON, "-c", "import tensorboard"}, 60).exit_code == 0;
  return has;
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

TEST(HParamValue, NumbersStringsAndBoolsConvertToTheirKind) {
  const std::map<std::string, HParamValue> values = {
      {"int", 64}, {"int64", int64_t{1} << 40}, {"double", 3e-4}, {"float", 0.5f},
      {"literal", "adamw"}, {"string", std::string("x")}, {"true", true}, {"false", false}};
  EXPECT_EQ(values.at("int").kind(), HParamValue::Kind::kNumber);
  EXPECT_EQ(values.at("int").number(), 64.0);
  EXPECT_EQ(values.at("int64").number(), 1099511627776.0);
  EXPECT_EQ(values.at("double").number(), 3e-4);
  EXPECT_EQ(values.at("float").number(), 0.5);
  EXPECT_EQ(values.at("literal").kind(), HParamValue::Kind::kString);
  EXPECT_EQ(values.at("literal").text(), "adamw");
  EXPECT_EQ(values.at("string").text(), "x");
  EXPECT_EQ(values.at("true").kind(), HParamValue::Kind::kBool);
  EXPECT_TRUE(values.at("true").flag());
  EXPECT_EQ(values.at("false").kind(), HParamValue::Kind::kBool);
  EXPECT_FALSE(values.at("false").flag());
}

TEST(TensorBoardWriter, TheHparamsPluginReadsEveryHparamItsKindTheMetricsAndTheStatus) {
  if (!peer_has_tensorboard()) GTEST_SKIP() << TANDEM_PEER_PYTHON << " has no tensorboard package";
  ScratchDir dir;
  {
    TensorBoardWriter tb(dir.path());
    // Defaults (0, "", false) too: a set oneof member must be written anyway.
    tb.add_hparams({{"lr", 3e-4},
                    {"batch_size", 64},
                    {"big", int64_t{1} << 53},
                    {"warmup", 0.0},
                    {"clip", -2.5},
                    {"optimizer", "adamw"},
                    {"notes", ""},
                    {"name/ünïcode", "β2 = 0.95"},
                    {"amp", true},
                    {"tied", false}},
                   {{"hparam/accuracy", 0.75}, {"hparam/loss", 0.125}}, 9);
  }
  const auto got = dump(dir.path());
  const auto& hp = got["hparams"];
  ASSERT_TRUE(hp.is_object() && hp.contains("session_start_info")) << got;
  const nlohmann::json start = {{"lr", {{"number_value", 3e-4}}},
                                {"batch_size", {{"number_value", 64.0}}},
                                {"big", {{"number_value", 9007199254740992.0}}},
                                {"warmup", {{"number_value", 0.0}}},
                                {"clip", {{"number_value", -2.5}}},
                                {"optimizer", {{"string_value", "adamw"}}},
                                {"notes", {{"string_value", ""}}},
                                {"name/ünïcode", {{"string_value", "β2 = 0.95"}}},
                                {"amp", {{"bool_value", true}}},
                                {"tied", {{"bool_value", false}}}};
  EXPECT_EQ(hp["session_start_info"], start);
  const nlohmann::json types = {
      {"lr", "DATA_TYPE_FLOAT64"},       {"batch_size", "DATA_TYPE_FLOAT64"},
      {"big", "DATA_TYPE_FLOAT64"},      {"warmup", "DATA_TYPE_FLOAT64"},
      {"clip", "DATA_TYPE_FLOAT64"},     {"optimizer", "DATA_TYPE_STRING"},
      {"notes", "DATA_TYPE_STRING"},     {"name/ünïcode", "DATA_TYPE_STRING"},
      {"amp", "DATA_TYPE_BOOL"},         {"tied", "DATA_TYPE_BOOL"}};
  const nlohmann::json metrics = {"hparam/accuracy", "hparam/loss"};
  EXPECT_EQ(hp["experiment"]["hparam_infos"], types) << hp;
  EXPECT_EQ(hp["experiment"]["metric_infos"], metrics) << hp;
  EXPECT_EQ(hp["session_end_info"], "STATUS_SUCCESS");
  EXPECT_EQ(hp["columns"]["hparams"], types);  // what the HParams tab shows
  EXPECT_EQ(hp["columns"]["metrics"], metrics);
  EXPECT_EQ(got["scalars"]["hparam/accuracy"], nlohmann::json::parse("[[9, 0.75]]"));
  EXPECT_EQ(got["scalars"]["hparam/loss"], nlohmann::json::parse("[[9, 0.125]]"));
}

TEST(TensorBoardWriter, HparamsWithoutMetricsTakeTheRunsScalarsAsMetricColumns) {
  if (!peer_has_tensorboard()) GTEST_SKIP() << TANDEM_PEER_PYTHON << " has no tensorboard package";
  ScratchDir dir;
  {
    TensorBoardWriter tb(dir.path());
    tb.add_hparams({{"lr", 0.1}});
    tb.add_scalar("loss", 0.5, 1);
    tb.add_scalar("eval/accuracy", 0.25, 1);
  }
  const auto got = dump(dir.path());
  const auto& hp = got["hparams"];
  EXPECT_TRUE(hp["experiment"].is_null()) << got;
  EXPECT_EQ(hp["session_start_info"], nlohmann::json::parse(R"({"lr": {"number_value": 0.1}})"));
  EXPECT_EQ(hp["session_end_info"], "STATUS_SUCCESS");
  EXPECT_EQ(hp["columns"]["hparams"], nlohmann::json::parse(R"({"lr": "DATA_TYPE_FLOAT64"})"));
  EXPECT_EQ(hp["columns"]["metrics"], nlohmann::json::parse(R"(["eval/accuracy", "loss"])"));
}

TEST(TensorBoardWriter, InitTrackersConfigBecomesHparamsWrittenByTheMainProcessOnly) {
  if (!peer_has_tensorboard()) GTEST_SKIP() << TANDEM_PEER_PYTHON << " has no tensorboard package";
  ScratchDir dir;
  const std::string logdir = dir.path() + "/tb";
  run_ranks(2, [&](ProcessGroup& pg) {
    AcceleratorOptions options;
    options.log_with = {"tensorboard"};
    options.project_dir = logdir;
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
    accelerator.init_trackers(dir.path() + "/metrics.jsonl",
                              {{"lr", 1e-3}, {"gradient_accumulation_steps", 2},
                               {"mixed_precision", "bf16"}, {"cpu", true}});
    accelerator.log({{"loss", 0.5}}, 1);
    accelerator.end_training();
  });
  int files = 0;
  for (const std::string& name : fs::list_directory(logdir)) {
    files += name.rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(files, 1);
  const auto got = dump(logdir);
  const auto& hp = got["hparams"];
  EXPECT_EQ(hp["session_start_info"], nlohmann::json::parse(R"({
      "lr": {"number_value": 0.001}, "gradient_accumulation_steps": {"number_value": 2.0},
      "mixed_precision": {"string_value": "bf16"}, "cpu": {"bool_value": true}})"))
      << got;
  EXPECT_EQ(hp["session_end_info"], "STATUS_SUCCESS");
  EXPECT_EQ(hp["columns"]["metrics"], nlohmann::json::parse(R"(["loss"])"));
  EXPECT_EQ(got["scalars"]["loss"], nlohmann::json::parse("[[1, 0.5]]"));
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
