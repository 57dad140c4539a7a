// The examples, end to end: real processes through `tandem launch`.
// Short runs: these check that the Accelerator-based programs start, train,
// evaluate and report as documented, not how well they learn (the full demo
// figure is in docs/performance.md).

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/subprocess.h"
#include "tandem/amp/cpu_bf16.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem {
namespace {

using testing::bin;
using testing::read_file;
using testing::run_process;
using testing::TempDir;

std::vector<std::string> launch(int ranks, std::vector<std::string> program) {
  std::vector<std::string> argv = {bin("tandem"), "launch", "--standalone", "--nproc-per-node",
                                   std::to_string(ranks)};
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

// The last stdout line, without the launcher's "[rank0]: " prefix.
nlohmann::json last_json_line(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  auto start = out.rfind('\n', end);
  std::string line = out.substr(start == std::string::npos ? 0 : start + 1, end - start);
  auto brace = line.find('{');
  EXPECT_NE(brace, std::string::npos) << out;
  return nlohmann::json::parse(line.substr(brace));
}

TEST(GptAddition, TwoRanksTrainEvaluateAndReportTheDocumentedJson) {
  TempDir dir;
  const std::string metrics = dir.path() + "/metrics.jsonl";
  auto r = run_process(launch(2, {bin("gpt_addition"), "--max-steps", "30", "--train-size", "4096",
                                  "--test-size", "300", "--log-every", "10", "--eval-every", "20",
                                  "--metrics-file", metrics}),
                       240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto result = last_json_line(r.out);
  EXPECT_EQ(result["step"], 30);
  EXPECT_TRUE(std::isfinite(result["loss"].get<double>()));
  EXPECT_GE(result["accuracy"].get<double>(), 0.0);
  EXPECT_LE(result["accuracy"].get<double>(), 1.0);
  EXPECT_GT(result["tokens_per_s"].get<double>(), 0.0);
  EXPECT_EQ(r.out.find("[rank1]: {"), std::string::npos) << "only rank 0 reports:\n" << r.out;

  std::ifstream in(metrics);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_FALSE(rows.empty());
  int losses = 0, accuracies = 0;
  for (const auto& row : rows) {
    losses += row.contains("loss");
    accuracies += row.contains("accuracy");
  }
  EXPECT_EQ(losses, 3);      // steps 10, 20, 30
  EXPECT_EQ(accuracies, 2);  // step 20 and the final evaluation
}

// --target-accuracy (README's command 1): the run stops at the first
// evaluation that reaches the target, before --max-steps, and reports that
// evaluation's accuracy; every evaluation before it was below the target.
// One-digit sums learn within about a hundred steps.
TEST(GptAddition, StopsAtTheFirstEvaluationThatReachesTheTargetAccuracy) {
  TempDir dir;
  const std::string metrics = dir.path() + "/metrics.jsonl";
  const double target = 0.1;
  auto r = run_process(launch(2, {bin("gpt_addition"), "--digits", "1", "--train-size", "4096",
                                  "--test-size", "40", "--max-steps", "400", "--eval-every", "20",
                                  "--lr", "3e-3", "--warmup-steps", "10", "--target-accuracy",
                                  "0.1", "--metrics-file", metrics}),
                       240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto result = last_json_line(r.out);
  const int64_t step = result["step"].get<int64_t>();
  EXPECT_LT(step, 400) << r.out;
  EXPECT_EQ(step % 20, 0);
  EXPECT_GE(result["accuracy"].get<double>(), target);
  EXPECT_NE(r.out.find("reached accuracy"), std::string::npos) << r.out;
  std::ifstream in(metrics);
  std::vector<std::pair<int64_t, double>> evaluations;
  for (std::string line; std::getline(in, line);) {
    auto row = nlohmann::json::parse(line);
    if (row.contains("accuracy")) evaluations.emplace_back(row["step"], row["accuracy"]);
  }
  ASSERT_FALSE(evaluations.empty());
  EXPECT_EQ(evaluations.back().first, step);
  EXPECT_NEAR(evaluations.back().second, result["accuracy"].get<double>(), 5e-5);  // printed with 4 decimals
  for (std::size_t i = 0; i + 1 < evaluations.size(); ++i) {
    EXPECT_LT(evaluations[i].second, target) << "step " << evaluations[i].first;
  }
}

// Activation checkpointing end to end: 30 steps on 2 ranks end at the same
// loss with each transformer block recomputed in backward as without, under
// DDP (--activation-checkpointing) and under ZeRO-3 (the DeepSpeed JSON's
// activation_checkpointing block); the final JSON has peak_rss_mb either way.
TEST(GptAddition, ActivationCheckpointingEndsAtTheSameLossAndReportsPeakRss) {
  TempDir dir;
  const std::string zero3 = dir.path() + "/zero3.json";
  std::ofstream(zero3) << R"({"zero_optimization": {"stage": 3}})";
  const std::string zero3_checkpointed = dir.path() + "/zero3_ckpt.json";
  std::ofstream(zero3_checkpointed)
      << R"({"zero_optimization": {"stage": 3}, "activation_checkpointing": {}})";
  auto run = [&](const std::vector<std::string>& extra, bool checkpointing) {
    std::vector<std::string> argv = {bin("tandem"), "launch", "--standalone", "--nproc-per-node",
                                     "2"};
    std::vector<std::string> program = {bin("gpt_addition"), "--max-steps", "30",
                                        "--train-size", "4096", "--test-size", "100",
                                        "--log-every", "10", "--metrics-file",
                                        dir.path() + "/m.jsonl"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), program.begin(), program.end());
    if (checkpointing && extra.empty()) argv.push_back("--activation-checkpointing");
    auto r = run_process(argv, 240);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(std::string("activation checkpointing ") + (checkpointing ? "on" : "off")),
              std::string::npos)
        << r.out;
    auto result = last_json_line(r.out);
    EXPECT_EQ(result["step"], 30);
    EXPECT_GT(result["peak_rss_mb"].get<double>(), 1.0) << result;
    return result;
  };
  const auto ddp = run({}, false);
  const auto ddp_checkpointed = run({}, true);
  EXPECT_EQ(ddp_checkpointed["loss"].get<double>(), ddp["loss"].get<double>())
      << "checkpointed " << ddp_checkpointed << " vs " << ddp;
  const auto zero = run({"--config-file", zero3}, false);
  const auto zero_checkpointed = run({"--config-file", zero3_checkpointed}, true);
  EXPECT_EQ(zero_checkpointed["loss"].get<double>(), zero["loss"].get<double>())
      << "checkpointed " << zero_checkpointed << " vs " << zero;
}

TEST(GptAddition, TrainsACharModelOnAnyTextFile) {
  TempDir dir;
  const std::string text_path = dir.path() + "/text.txt";
  {
    std::ofstream text(text_path);
    for (int i = 0; i < 400; ++i) text << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  auto r = run_process(launch(2, {bin("gpt_addition"), "--data", text_path, "--max-steps", "10",
                                  "--block-size", "32", "--train-size", "2000", "--test-size",
                                  "200", "--log-every", "5", "--metrics-file",
                                  dir.path() + "/m.jsonl"}),
                       240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto result = last_json_line(r.out);
  EXPECT_EQ(result["step"], 10);
  EXPECT_GT(result["accuracy"].get<double>(), 0.0);
}

TEST(GptAddition, RunsAloneWithoutALauncher) {
  TempDir dir;
  auto r = run_process({bin("gpt_addition"), "--max-steps", "5", "--train-size", "1024",
                        "--test-size", "100", "--log-every", "5", "--metrics-file",
                        dir.path() + "/m.jsonl"},
                       120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(last_json_line(r.out)["step"], 5);
}

// Mixed precision end to end: `tandem launch --mixed-precision bf16` reaches
// the workers' Accelerator, which runs the forward under bf16 autocast; the
// loss after 300 steps must track fp32 training's within 10%. On a CPU
// without AVX-512 BF16 (the CI box since 2026-11-24) LibTorch emulates bf16
// matmuls, about 90x slower than fp32: the bf16 run then takes about 220 s,
// hence the generous limit.
// bf16 autocast through `tandem launch --mixed-precision bf16` tracks fp32,
// and on a CPU that emulates bf16 matmuls (no AVX512_BF16 or AMX) the main
// process says so, with the measured factor and the remedy; where bf16 is
// native it says nothing. Sized to the machine: 300 steps where bf16 is
// native; where it is emulated a bf16 step costs tens of fp32 steps, so 60
// (both runs took 62 s on an AVX2-only 2-core machine), by which the fp32
// loss has fallen below 0.85x its first logged value (2.26 -> 1.78 there;
// checked below), so the two runs still compare trained models.
TEST(AmpAutocastDemo, Bf16TrainingTracksFp32AndSaysWhenTheCpuEmulatesBf16) {
  const bool native = cpu_bf16_support(/*measure=*/false).native;
  const int steps = native ? 300 : 60;
  TempDir dir;
  auto run = [&](const std::string& precision) {
    const std::string metrics = dir.path() + "/" + precision + ".jsonl";
    std::vector<std::string> argv = {bin("tandem"), "launch", "--standalone", "--nproc-per-node",
                                     "2", "--mixed-precision", precision, bin("gpt_addition"),
                                     "--max-steps", std::to_string(steps), "--train-size",
                                     "32768", "--test-size", "200", "--log-every", "10",
                                     "--metrics-file", metrics};
    auto r = run_process(argv, 900);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("mixed precision " + precision), std::string::npos) << r.out;
    const bool warned = (r.out + r.err).find("without native bf16") != std::string::npos;
    EXPECT_EQ(warned, precision == "bf16" && !native) << r.out << r.err;
    std::ifstream lines(metrics);
    nlohmann::json first;  // the first logged loss
    for (std::string line; first.is_null() && std::getline(lines, line);) {
      auto row = nlohmann::json::parse(line);
      if (row.contains("loss")) first = row;
    }
    EXPECT_FALSE(first.is_null()) << "no loss in " << metrics;
    return std::make_pair(last_json_line(r.out), first);
  };
  const auto [fp32, fp32_first] = run("no");
  const auto [bf16, bf16_first] = run("bf16");
  const double reference = fp32["loss"].get<double>();
  EXPECT_EQ(bf16["step"], steps);
  EXPECT_LT(reference, 0.85 * fp32_first["loss"].get<double>()) << fp32_first << " -> " << fp32;
  EXPECT_LT(std::abs(bf16["loss"].get<double>() - reference), 0.1 * reference)
      << "bf16 " << bf16 << " vs fp32 " << fp32;
}

// ZeRO-3 end to end: a DeepSpeed JSON with zero_optimization.stage 3 reaches
// the workers' Accelerator, which shards the demo's Sharded transformer
// blocks; the loss after 300 steps tracks DDP's (the same arithmetic in
// another order) within 2%.
TEST(ZeroDemo, Stage3TrainingTracksDdpAfter300Steps) {
  TempDir dir;
  const std::string zero3 = dir.path() + "/zero3.json";
  std::ofstream(zero3) << R"({"zero_optimization": {"stage": 3}})";
  auto run = [&](const std::vector<std::string>& config) {
    std::vector<std::string> argv = {bin("tandem"), "launch", "--standalone", "--nproc-per-node",
                                     "2"};
    argv.insert(argv.end(), config.begin(), config.end());
    for (const std::string& arg : {bin("gpt_addition"), std::string("--max-steps"),
                                   std::string("300"), std::string("--train-size"),
                                   std::string("32768"), std::string("--test-size"),
                                   std::string("100"), std::string("--log-every"),
                                   std::string("50")}) {
      argv.push_back(arg);
    }
    auto r = run_process(argv, 300);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return last_json_line(r.out);
  };
  const auto ddp = run({});
  const auto zero = run({"--config-file", zero3});
  const double reference = ddp["loss"].get<double>();
  EXPECT_EQ(zero["step"], 300);
  EXPECT_LT(std::abs(zero["loss"].get<double>() - reference), 0.02 * reference)
      << "zero-3 " << zero << " vs ddp " << ddp;
}

// HSDP end to end: four processes through `tandem launch` with a DeepSpeed
// JSON that sets zero_hpz_partition_size 2 (two shard groups of two) train
// the demo to the loss ZeRO-3 over all four reaches: the same averages in
// another order (1e-3 relative; the run is short and fp32). The checkpoint
// says HSDP held the model, and a size of 3 stops the launch with the error.
TEST(HsdpDemo, FourRanksAsTwoShardGroupsOfTwoTrackZero3) {
  TempDir dir;
  const std::string zero3 = dir.path() + "/zero3.json";
  std::ofstream(zero3) << R"({"zero_optimization": {"stage": 3}})";
  const std::string hsdp = dir.path() + "/hsdp.json";
  std::ofstream(hsdp) << R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})";
  const std::string checkpoints = dir.path() + "/ckpt";
  auto run = [&](const std::string& config) {
    std::vector<std::string> argv = {bin("tandem"), "launch", "--standalone", "--nproc-per-node",
                                     "4", "--config-file", config};
    for (const std::string& arg : {bin("gpt_addition"), std::string("--max-steps"),
                                   std::string("30"), std::string("--train-size"),
                                   std::string("4096"), std::string("--test-size"),
                                   std::string("100"), std::string("--log-every"),
                                   std::string("10")}) {
      argv.push_back(arg);
    }
    if (config == hsdp) {
      for (const std::string& arg : {std::string("--checkpoint-dir"), checkpoints,
                                     std::string("--save-every"), std::string("30")}) {
        argv.push_back(arg);
      }
    }
    auto r = run_process(argv, 300);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return last_json_line(r.out);
  };
  const auto reference = run(zero3);
  const auto hybrid = run(hsdp);
  EXPECT_EQ(hybrid["step"], 30);
  const double loss = reference["loss"].get<double>();
  EXPECT_LT(std::abs(hybrid["loss"].get<double>() - loss), 1e-3 * loss)
      << "hsdp " << hybrid << " vs zero-3 " << reference;
  const auto meta = read_checkpoint_meta(checkpoints + "/global_step30");
  EXPECT_EQ(meta["strategy"], "hsdp");
  EXPECT_EQ(meta["hpz_partition_size"], 2);

  const std::string wrong = dir.path() + "/hsdp3.json";
  std::ofstream(wrong) << R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 3}})";
  auto r = run_process({bin("tandem"), "launch", "--standalone", "--nproc-per-node", "4",
                        "--config-file", wrong, bin("gpt_addition"), "--max-steps", "1"},
                       120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("zero_hpz_partition_size is 3, which does not divide the world "
                                 "size 4"),
            std::string::npos)
      << r.out << r.err;
}

// Issue 7's acceptance: 40 straight steps, and 20 steps then a resumed 20
// (new processes, `latest` picked up by itself), merge to byte-identical
// files, under DDP and under ZeRO-3.
TEST(GptAdditionCheckpoint, StraightAndResumedRunsMergeToIdenticalFiles) {
  TempDir dir;
  const std::string zero3 = dir.path() + "/zero3.json";
  std::ofstream(zero3) << R"({"zero_optimization": {"stage": 3}})";
  auto run = [&](const std::vector<std::string>& config, const std::string& checkpoints,
                 int stop_after) {
    std::vector<std::string> argv = {bin("tandem"), "launch", "--standalone", "--nproc-per-node",
                                     "2"};
    argv.insert(argv.end(), config.begin(), config.end());
    for (const std::string& arg :
         {bin("gpt_addition"), std::string("--max-steps"), std::string("40"),
          std::string("--save-every"), std::string("20"), std::string("--checkpoint-dir"),
          checkpoints, std::string("--stop-after"), std::to_string(stop_after),
          std::string("--train-size"), std::string("4096"), std::string("--test-size"),
          std::string("100"), std::string("--metrics-file"), dir.path() + "/metrics.jsonl"}) {
      argv.push_back(arg);
    }
    auto r = run_process(argv, 300);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return r.out;
  };
  auto merge = [&](const std::string& checkpoints, const std::string& out) {
    auto r = run_process({bin("tandem"), "checkpoint", "merge", checkpoints, out}, 120);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return read_file(out);
  };
  for (const std::vector<std::string>& config :
       {std::vector<std::string>{}, std::vector<std::string>{"--config-file", zero3}}) {
    const std::string label = config.empty() ? "ddp" : "zero3";
    const std::string straight = dir.path() + "/straight_" + label;
    const std::string resumed = dir.path() + "/resumed_" + label;
    run(config, straight, 0);
    run(config, resumed, 20);
    const std::string second = run(config, resumed, 0);
    EXPECT_NE(second.find("resumed from"), std::string::npos) << second;
    const std::string a = merge(straight, dir.path() + "/a_" + label + ".safetensors");
    const std::string b = merge(resumed, dir.path() + "/b_" + label + ".safetensors");
    ASSERT_GT(a.size(), 100000u) << label;
    EXPECT_TRUE(a == b) << label << ": the merged files differ";
    // The merged file loads in Python, with the script's own parser and with
    // the safetensors package's load_file, to the values tandem wrote.
    const auto py = run_process({TANDEM_PEER_PYTHON, std::string(TANDEM_SOURCE_DIR) +
                                                         "/tests/checkpoint/safetensors_interop.py",
                                 "load", dir.path() + "/a_" + label + ".safetensors"},
                                120);
    EXPECT_EQ(py.exit_code, 0) << py.out << py.err;
    EXPECT_EQ(py.out.rfind("ok ", 0), 0u) << py.out;
    EXPECT_NE(py.out.find("load_file agrees"), std::string::npos)
        << py.out << "(is the safetensors package missing? scripts/setup.sh installs it)";
  }
}

// --log-with tensorboard: the demo's event files, read by the tensorboard
// package's EventAccumulator, hold every value of the JSON-lines file, at
// the same step, as float32.
TEST(GptAdditionTensorBoard, EveryScalarEqualsItsJsonLinesValue) {
  if (run_process({TANDEM_PEER_PYTHON, "-c", "import tensorboard"}, 60).exit_code != 0) {
    GTEST_SKIP() << TANDEM_PEER_PYTHON << " has no tensorboard package (scripts/setup.sh installs it)";
  }
  TempDir dir;
  const std::string runs = dir.path() + "/runs/gpt_addition";
  auto r = run_process(launch(2, {bin("gpt_addition"), "--max-steps", "60", "--log-every", "20",
                                  "--eval-every", "30", "--train-size", "4096", "--test-size",
                                  "100", "--metrics-file", runs + "/metrics.jsonl",
                                  "--log-with", "tensorboard"}),
                       300);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto dump = run_process({TANDEM_PEER_PYTHON,
                           std::string(TANDEM_SOURCE_DIR) + "/tests/support/tensorboard_dump.py",
                           runs},
                          120);
  ASSERT_EQ(dump.exit_code, 0) << dump.out << dump.err;
  const auto scalars = nlohmann::json::parse(dump.out)["scalars"];
  std::istringstream lines(read_file(runs + "/metrics.jsonl"));
  std::map<std::string, std::size_t> seen;  // per tag, how many events were matched
  int values = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto record = nlohmann::json::parse(line);
    for (const auto& [key, value] : record.items()) {
      if (key == "step" || key == "time") continue;
      ASSERT_TRUE(scalars.contains(key)) << key << " is not in TensorBoard: " << scalars;
      const auto& event = scalars[key].at(seen[key]++);
      EXPECT_EQ(event[0], record["step"]) << key;
      EXPECT_EQ(event[1].get<double>(), static_cast<float>(value.get<double>())) << key;
      ++values;
    }
  }
  EXPECT_GE(values, 8) << "loss and tokens/s at steps 20, 40, 60, accuracy and time twice";
  for (const auto& [tag, events] : scalars.items()) {
    EXPECT_EQ(events.size(), seen[tag]) << tag << " has events the JSON lines lack";
  }
  // The recipe shows in the HParams tab.
  const auto hparams = nlohmann::json::parse(dump.out)["hparams"]["session_start_info"];
  ASSERT_TRUE(hparams.is_object()) << dump.out;
  EXPECT_EQ(hparams["lr"]["number_value"].get<double>(), 1e-3) << hparams;
  EXPECT_EQ(hparams["max_steps"]["number_value"].get<double>(), 60) << hparams;
  EXPECT_EQ(hparams["world_size"]["number_value"].get<double>(), 2) << hparams;
}

TEST(Quickstart, ThePlainLoopAndItsAcceleratedFormBothLearn) {
  auto plain = run_process({bin("quickstart_plain")}, 120);
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  auto accelerated = run_process(launch(2, {bin("quickstart_accelerated")}), 120);
  ASSERT_EQ(accelerated.exit_code, 0) << accelerated.out << accelerated.err;
  EXPECT_NE(accelerated.out.find("[rank1]: final loss"), std::string::npos) << accelerated.out;
}

// Two models and two optimizers on one Accelerator: with the same global
// batch, one rank and two save the same generator and discriminator.
TEST(GanToy, OneRankAndTwoSaveTheSameParameters) {
  TempDir dir;
  std::map<int, nlohmann::json> results;
  for (int world : {1, 2}) {
    const std::string file = dir.path() + "/gan" + std::to_string(world) + ".safetensors";
    auto r = run_process(launch(world, {bin("gan_toy"), "--steps", "150", "--seed", "3",
                                        "--global-batch", "32", "--save", file}),
                         180);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    results[world] = last_json_line(r.out);
    EXPECT_EQ(results[world]["world"], world);
    EXPECT_EQ(results[world]["steps"], 150);
  }
  SafetensorsReader one(dir.path() + "/gan1.safetensors");
  SafetensorsReader two(dir.path() + "/gan2.safetensors");
  ASSERT_EQ(one.entries().size(), two.entries().size());
  int generator = 0, discriminator = 0;
  for (const auto& entry : one.entries()) {
    generator += entry.name.rfind("generator.", 0) == 0 ? 1 : 0;
    discriminator += entry.name.rfind("discriminator.", 0) == 0 ? 1 : 0;
    const auto a = one.read(entry.name);
    const auto b = two.read(entry.name);
    const double scale = a.abs().max().item<double>();
    EXPECT_LE((a - b).abs().max().item<double>(), 1e-4 * scale) << entry.name;
  }
  EXPECT_EQ(generator, 6) << "fc1, fc2, out: weight and bias each";
  EXPECT_EQ(discriminator, 6);
}

TEST(CnnSyncBatchNorm, TwoRanksLearnTheQuadrantTask) {
  auto r = run_process(launch(2, {bin("cnn_syncbn")}), 240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto result = last_json_line(r.out);
  EXPECT_EQ(result["test_images"], 1024) << "gather_for_metrics must count each image once";
  EXPECT_GT(result["accuracy"].get<double>(), 0.9);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// examples/gpt2 at its tiny preset on the CPU: two ranks through the
// launcher train on their own windows of the synthetic tokens, the loss
// falls, and rank 0 alone prints the documented JSON line.
TEST(Gpt2Example, TinyPresetTrainsOnTwoCpuRanksAndReportsTheDocumentedJson) {
  auto r = run_process(launch(2, {bin("gpt2"), "--preset", "tiny", "--device", "cpu",
                                  "--max-steps", "30", "--warmup-measure", "2", "--lr", "3e-3",
                                  "--batch-size", "4", "--accumulation", "2", "--losses"}),
                       240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto result = last_json_line(r.out);
  for (const char* key :
       {"model", "preset", "params", "device", "precision", "cuda_graph", "loss", "layer_norm",
        "residual_add", "steps", "tokens_per_s", "step_ms", "mfu", "flops_per_token", "peak_tflops",
        "peak_memory_mb", "final_loss", "losses"}) {
    EXPECT_TRUE(result.contains(key)) << key << " missing from " << result.dump();
  }
  EXPECT_EQ(result["loss"], "fused-on-aten") << "on a CPU the fused loss is LibTorch's";
  EXPECT_EQ(result["params"], 470528);  // 2 x 128, vocabulary 512, context 64, tied
  EXPECT_EQ(result["processes"], 2);
  EXPECT_EQ(result["accumulation"], 2);
  EXPECT_TRUE(result["mfu"].is_null()) << "no peak is known for a CPU";
  const auto losses = result["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 32u);
  EXPECT_NEAR(losses.front(), std::log(512.0), 0.3) << "an untrained model is uniform";
  EXPECT_LT(losses.back(), 0.85 * losses.front()) << result.dump();
  EXPECT_EQ(r.out.find("[rank1]: {"), std::string::npos) << "only rank 0 reports:\n" << r.out;
}

// Tokens from a file in llm.c's format (a 1024-byte header, then uint16),
// and a token outside the vocabulary refused with the fix.
TEST(Gpt2Example, ReadsAnLlmcTokenFileAndRefusesATokenOutsideTheVocabulary) {
  TempDir dir;
  auto write = [&](const std::string& name, uint16_t largest) {
    std::ofstream out(dir.path() + "/" + name, std::ios::binary);
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    for (int i = 0; i < 4096; ++i) {
      const uint16_t token = static_cast<uint16_t>(i % 64 == 63 ? largest : i % 50);
      out.write(reinterpret_cast<const char*>(&token), 2);
    }
    return dir.path() + "/" + name;
  };
  auto ok = run_process({bin("gpt2"), "--preset", "tiny", "--device", "cpu", "--max-steps", "2",
                         "--warmup-measure", "0", "--data", write("ok.bin", 511)},
                        120);
  ASSERT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  EXPECT_EQ(last_json_line(ok.out)["steps"], 2);
  auto bad = run_process({bin("gpt2"), "--preset", "tiny", "--device", "cpu", "--max-steps", "2",
                          "--data", write("bad.bin", 600)},
                         120);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("token 600 is outside the vocabulary (512); raise --vocab-size"),
            std::string::npos)
      << bad.err;
}

// On a CPU, the fused loss, LayerNorm and residual adds
// (tandem::fused_cross_entropy, tandem::fused_add_layer_norm, the defaults;
// and --layer-norm fused, tandem::fused_layer_norm with the adds apart) are
// LibTorch's ops exactly: under bf16 autocast, the same losses step by step
// as --loss aten --layer-norm aten.
TEST(Gpt2Example, FusedLossAndLayerNormTrainLikeLibTorchsOnTheCpu) {
  auto run = [](std::vector<std::string> flags) {
    // DeepSpeed's warmup gives the first two optimizer steps a learning
    // rate of 0: 5 steps train the model in 2 before the last loss.
    std::vector<std::string> argv = {bin("gpt2"), "--preset", "tiny", "--device", "cpu",
                                     "--max-steps", "5", "--warmup-measure", "0",
                                     "--warmup-steps", "1", "--lr", "3e-2", "--batch-size", "2",
                                     "--mixed-precision", "bf16", "--losses"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto r = run_process(argv, 120);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return last_json_line(r.out);
  };
  const auto fused = run({}), aten = run({"--loss", "aten", "--layer-norm", "aten"});
  const auto adds_apart = run({"--layer-norm", "fused"});
  EXPECT_EQ(fused["loss"], "fused-on-aten");
  EXPECT_EQ(fused["layer_norm"], "fused-on-aten");
  EXPECT_EQ(fused["residual_add"], "fused-on-aten");
  EXPECT_EQ(adds_apart["layer_norm"], "fused-on-aten");
  EXPECT_EQ(adds_apart["residual_add"], "aten");
  EXPECT_EQ(aten["loss"], "aten");
  EXPECT_EQ(aten["layer_norm"], "aten");
  EXPECT_EQ(aten["residual_add"], "aten");
  const auto fused_losses = fused["losses"].get<std::vector<double>>();
  ASSERT_EQ(fused_losses.size(), 5u);
  EXPECT_EQ(fused_losses, aten["losses"].get<std::vector<double>>());
  EXPECT_EQ(adds_apart["losses"].get<std::vector<double>>(), fused_losses);
  auto bad = run_process({bin("gpt2"), "--preset", "tiny", "--device", "cpu", "--loss", "liger"}, 60);
  EXPECT_EQ(bad.exit_code, 105) << "CLI11's code for a value outside the set: " << bad.err;
  EXPECT_NE(bad.err.find("--loss"), std::string::npos) << bad.err;
}

// bench/compare_gpt2.py at the tiny preset on the CPU (the issue's CI smoke
// run): every case of both sides reports, or is skipped for its reason (the
// CUDA-graph ones), and the final JSON line holds every case and the ratios.
TEST(Gpt2Example, CompareGpt2TinyOnTheCpuReportsEveryCase) {
  if (run_process({TANDEM_PEER_PYTHON, "-c", "import torch"}, 60).exit_code != 0) {
    GTEST_SKIP() << TANDEM_PEER_PYTHON << " cannot import torch (scripts/setup.sh installs it)";
  }
  const std::string build = std::string(TANDEM_BIN_DIR) + "/..";
  auto r = run_process({TANDEM_PEER_PYTHON, std::string(TANDEM_SOURCE_DIR) + "/bench/compare_gpt2.py",
                        "--build", build, "--preset", "tiny", "--device", "cpu", "--max-steps",
                        "3", "--warmup-measure", "1", "--threads", "1", "--case-timeout", "280"},
                       900);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto result = last_json_line(r.out);
  const auto& cases = result["cases"];
  for (const char* name : {"python-eager", "python-compile", "python-reduce-overhead",
                           "tandem-eager"}) {
    ASSERT_TRUE(cases.contains(name)) << name << " missing: " << result.dump();
    EXPECT_EQ(cases[name]["status"], "ok") << name << ": " << cases[name].dump();
    EXPECT_GT(cases[name].value("tokens_per_s", 0.0), 0) << name;
  }
  for (const char* name :
       {"python-cuda-graph", "tandem-graph", "tandem-graph-adds-apart", "tandem-graph-aten-loss",
        "tandem-graph-aten-ln", "tandem-graph-aten"}) {
    ASSERT_TRUE(cases.contains(name)) << name << " missing: " << result.dump();
    EXPECT_EQ(cases[name]["status"], "skipped") << name << ": " << cases[name].dump();
  }
  EXPECT_EQ(cases["tandem-eager"]["loss"], "fused-on-aten");
  EXPECT_EQ(cases["tandem-eager"]["residual_add"], "fused-on-aten");
  EXPECT_TRUE(result.contains("ratios")) << result.dump();
}

// --cuda-graph on a CPU run stops before training, naming the reason.
TEST(Gpt2Example, CudaGraphOnTheCpuIsRefusedWithTheReason) {
  auto r = run_process({bin("gpt2"), "--preset", "tiny", "--device", "cpu", "--max-steps", "2",
                        "--cuda-graph"},
                       120);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("cuda_graph: the Accelerator runs on cpu"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
