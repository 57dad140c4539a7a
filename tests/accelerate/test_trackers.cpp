// The trackers' files as a run leaves them: the JSON lines across a resume
// (the history kept, no step twice), the keys each line owns, a DeepSpeed
// monitor sharing log_with's folder (each value once), CSV files that
// stay one column under one header, the progress bar's lines in a log, and
// MLFLOW_TAGS' values as Accelerate stores them.

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "support/log_capture.h"
#include "support/scoped_env.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/csv_writer.h"
#include "tandem/accelerate/metrics_logger.h"
#include "tandem/accelerate/mlflow_writer.h"
#include "tandem/accelerate/progress_bar.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace trackers_test {
namespace {

using testing::run_ranks;
using testing::ScratchDir;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

std::vector<int64_t> steps_of(const std::vector<nlohmann::json>& rows) {
  std::vector<int64_t> steps;
  for (const auto& row : rows) steps.push_back(row["step"].get<int64_t>());
  return steps;
}

// One leg of a run: Linear(2, 1) with SGD; optimizer steps from step() + 1
// to `last`, each logged as {"leg": leg}; a checkpoint in `checkpoint` at
// step `save_at` (0: none). `resume`: load_state(checkpoint) first, before
// init_trackers() (Accelerate's examples: after it) when `load_first`.
void run_leg(const std::string& metrics, const std::string& checkpoint, int leg, int64_t last,
             int64_t save_at, bool resume, bool load_first) {
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{}, AcceleratorOptions{});
    auto model = torch::nn::Linear(2, 1);
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                   torch::optim::SGDOptions(0.1));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(sgd);
    if (resume && load_first) accelerator.load_state(checkpoint);
    accelerator.init_trackers(metrics);
    if (resume && !load_first) accelerator.load_state(checkpoint);
    while (accelerator.step() < last) {
      accelerator.backward(model(torch::ones({2, 2})).sum());
      optimizer->step();
      optimizer->zero_grad();
      accelerator.log({{"leg", leg}}, accelerator.step());
      if (accelerator.step() == save_at) accelerator.save_state(checkpoint);
    }
    accelerator.end_training();
  });
}

// Leg 1 saves at step 3 and stops at 5 (as if killed); leg 2 resumes at 3
// and runs to 6. The file holds steps 1-6 once each: 1-3 from leg 1, 4-6
// from leg 2, whichever side of init_trackers() load_state() is on. A run
// that does not resume starts the file over.
TEST(MetricsLogger, AResumedRunKeepsTheHistoryUpToItsStepAndLogsNoStepTwice) {
  for (bool load_first : {true, false}) {
    SCOPED_TRACE(load_first ? "load_state, then init_trackers" : "init_trackers, then load_state");
    ScratchDir dir;
    const std::string metrics = dir / "runs/metrics.jsonl";
    run_leg(metrics, dir / "ckpt", 1, 5, 3, false, load_first);
    ASSERT_EQ(steps_of(read_lines(metrics)), (std::vector<int64_t>{1, 2, 3, 4, 5}));
    run_leg(metrics, dir / "ckpt", 2, 6, 0, true, load_first);
    const auto rows = read_lines(metrics);
    ASSERT_EQ(steps_of(rows), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i]["leg"], i < 3 ? 1 : 2) << i;
    // "time" goes on from the kept lines'.
    EXPECT_GE(rows[3]["time"].get<double>(), rows[2]["time"].get<double>());
    run_leg(metrics, dir / "ckpt", 3, 2, 0, false, load_first);
    EXPECT_EQ(steps_of(read_lines(metrics)), (std::vector<int64_t>{1, 2}));
  }
}

// A line torn by a crash is dropped with the lines past the resumed step,
// and an info line says what was kept and dropped.
TEST(MetricsLogger, ResumingDropsTheTornLineAndSaysWhatItKept) {
  ScratchDir dir;
  const std::string path = dir / "metrics.jsonl";
  std::ofstream(path) << "{\"step\": 1, \"loss\": 1, \"time\": 1.0}\n"
                         "{\"step\": 2, \"loss\": 0.5, \"time\": 2.0}\n"
                         "{\"step\": 3, \"loss\": 0.25, \"time\": 3.0}\n"
                         "{\"step\": 3, \"loss\"";
  const std::string log = testing::info_log_of([&] {
    MetricsLogger logger;
    logger.resume_from(2);
    logger.open(path, true);
    logger.log({{"loss", 0.4}}, 3);
  });
  const auto rows = read_lines(path);
  ASSERT_EQ(steps_of(rows), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(rows[2]["loss"], 0.4);
  EXPECT_GE(rows[2]["time"].get<double>(), 2.0);
  EXPECT_NE(log.find("resumed at step 2: " + path + " keeps its 2 line(s) up to that step and "
                     "drops 2 (past it"),
            std::string::npos)
      << log;
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// Every line has its own "step" and "time": a value of that name would make
// a second key in the object, so it is refused, naming the key and the way
// out, on a logger that writes and on one that does not (other ranks).
TEST(MetricsLogger, AValueNamedStepOrTimeIsRefusedNamingItAndTheAlternative) {
  ScratchDir dir;
  MetricsLogger writing;
  writing.open(dir / "metrics.jsonl", true);
  MetricsLogger silent;
  for (MetricsLogger* logger : {&writing, &silent}) {
    try {
      logger->log({{"loss", 1.0}, {"step", 1000.0}}, 1);
      ADD_FAILURE() << "a value named step was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("\"step\""), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("step argument"), std::string::npos) << e.what();
    }
    try {
      logger->log({{"time", 7.0}}, 1);
      ADD_FAILURE() << "a value named time was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("\"time_s\""), std::string::npos) << e.what();
    }
  }
  writing.log({{"time_s", 7.0}}, 1);
  writing.close();
  const auto rows = read_lines(dir / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["time_s"], 7.0);
}

// DeepSpeed tensorboard and csv_monitor blocks whose folder is log_with's
// share its writers: one event file there, and each logged value once in
// its CSV file, beside the monitors' own Train/Samples events.
TEST(DeepSpeedMonitors, AMonitorInLogWithsFolderWritesEachValueOnce) {
  ScratchDir dir;
  Config config;
  for (MonitorConfig* monitor : {&config.tensorboard, &config.csv_monitor}) {
    monitor->enabled = true;
    monitor->output_path = dir.path() + "/";  // "dir/" + job_name "" : dir
    monitor->job_name = "";
  }
  AcceleratorOptions options;
  options.log_with = {"tensorboard", "csv"};
  run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config, options);
    auto model = torch::nn::Linear(2, 1);
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                   torch::optim::SGDOptions(0.5));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(sgd);
    accelerator.init_trackers(dir / "metrics.jsonl");
    for (int step = 1; step <= 2; ++step) {
      accelerator.backward(model(torch::ones({2, 2})).sum());
      optimizer->step();
      optimizer->zero_grad();
      accelerator.log({{"user/metric", step}}, step);
    }
    accelerator.end_training();
  });
  EXPECT_EQ(read_text(dir / "user_metric.csv"), "step,metric\r\n1,1.0\r\n2,2.0\r\n");
  EXPECT_EQ(read_text(dir / "Train_Samples_lr.csv"), "step,lr\r\n1,0.5\r\n2,0.5\r\n");
  int event_files = 0;
  for (const std::string& name : fs::list_directory(dir.path())) {
    if (name.rfind("events.out.tfevents.", 0) == 0) ++event_files;
  }
  EXPECT_EQ(event_files, 1);
}

// "a/b", "a b" and "a_b" all make a_b.csv: the first keeps it, the others
// get a_b_2.csv and a_b_3.csv, each one column under one header, and a
// warning names the two tags.
TEST(CsvWriter, TagsThatMakeOneFileNameGetAFileEachWithOneHeader) {
  ScratchDir dir;
  const std::string log = testing::info_log_of([&] {
    CsvWriter writer(dir.path());
    writer.add_scalar("a/b", 1.0, 1);
    writer.add_scalar("a b", 2.0, 1);
    writer.add_scalar("a_b", 3.0, 1);
    writer.add_scalar("a b", 4.0, 2);
  });
  EXPECT_EQ(read_text(dir / "a_b.csv"), "step,b\r\n1,1.0\r\n");
  EXPECT_EQ(read_text(dir / "a_b_2.csv"), "step,a b\r\n1,2.0\r\n2,4.0\r\n");
  EXPECT_EQ(read_text(dir / "a_b_3.csv"), "step,a_b\r\n1,3.0\r\n");
  EXPECT_NE(log.find("tag \"a b\" would be " + dir.path() + "/a_b.csv, which tag \"a/b\" writes"),
            std::string::npos)
      << log;
}

// A second writer on the folder (a resumed run) continues a file with its
// header without writing the header again; a file left with another
// column's header is not mixed into.
TEST(CsvWriter, AnEarlierRunsFileIsContinuedWithoutASecondHeader) {
  ScratchDir dir;
  std::ofstream(dir / "x.csv") << "step,other\r\n1,9.0\r\n";
  for (int64_t step : {1, 2}) {
    CsvWriter writer(dir.path());
    writer.add_scalar("eval/loss", 0.5, step);
    writer.add_scalar("x", 1.0, step);
  }
  EXPECT_EQ(read_text(dir / "eval_loss.csv"), "step,loss\r\n1,0.5\r\n2,0.5\r\n");
  EXPECT_EQ(read_text(dir / "x.csv"), "step,other\r\n1,9.0\r\n");
  EXPECT_EQ(read_text(dir / "x_2.csv"), "step,x\r\n1,1.0\r\n2,1.0\r\n");
}

// What a bar prints to a log (stderr not a terminal) for `updates` steps.
std::vector<std::string> bar_lines(int64_t total, int updates) {
  ::testing::internal::CaptureStderr();
  {
    ProgressBar bar(total, "train", true);
    for (int i = 0; i < updates; ++i) bar.update(1);
  }
  const std::string text = ::testing::internal::GetCapturedStderr();
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    lines.push_back(text.substr(begin, end - begin));
  }
  return lines;
}

// In a log a bar prints at each tenth of the total, past the total too
// (110%, 120%, ...), not at every update once the count passed it.
TEST(ProgressBar, ALogGetsALineEveryTenthOfTheTotalPastItToo) {
  const auto lines = bar_lines(100, 300);
  ASSERT_EQ(lines.size(), 31u);  // the first update, then 10, 20, ..., 300
  EXPECT_EQ(lines[0].rfind("train:   1% [", 0), 0u) << lines[0];
  EXPECT_EQ(lines[10].rfind("train: 100% [########################] 100/100", 0), 0u)
      << lines[10];
  EXPECT_EQ(lines[11].rfind("train: 110% [########################] 110/100", 0), 0u)
      << lines[11];
  EXPECT_EQ(lines[30].rfind("train: 300% [########################] 300/100", 0), 0u)
      << lines[30];
}

// A total of 0 is unknown: the count and rate without a percentage, at
// counts 1, 2, 5, 10, 20, ... and the last one on close.
TEST(ProgressBar, AnUnknownTotalShowsTheCountWithoutAPercentage) {
  const auto lines = bar_lines(0, 25);
  ASSERT_EQ(lines.size(), 6u);
  const char* counts[] = {"1", "2", "5", "10", "20", "25"};
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].rfind(std::string("train: ") + counts[i] + " [", 0), 0u) << lines[i];
    EXPECT_EQ(lines[i].find('%'), std::string::npos) << lines[i];
  }
}

// MLFLOW_TAGS' values as Accelerate's tracker stores them: json.loads,
// then str() in mlflow.set_tags (the expected texts are Python's own).
TEST(MlflowWriter, MlflowTagsValuesAreStoredAsPythonsStrWritesThem) {
  testing::ScopedEnv env;
  env.set("MLFLOW_TAGS",
          R"({"flag": true, "off": false, "ratio": 1.0, "n": 2, "none": null, "big": 1e16,
              "mid": 1e15, "small": 1e-05, "third": 0.1, "team": "nlp",
              "list": [1, "a", true, null, 2.5], "map": {"k": "it's"}})");
  const auto tags = mlflow_options_from_environment(MlflowOptions{}).tags;
  const std::map<std::string, std::string> python = {
      {"flag", "True"},          {"off", "False"},
      {"ratio", "1.0"},          {"n", "2"},
      {"none", "None"},          {"big", "1e+16"},
      {"mid", "1000000000000000.0"}, {"small", "1e-05"},
      {"third", "0.1"},          {"team", "nlp"},
      {"list", "[1, 'a', True, None, 2.5]"}, {"map", "{'k': \"it's\"}"}};
  EXPECT_EQ(tags, python);
}

}  // namespace
}  // namespace trackers_test
}  // namespace tandem
