// `tandem config check`, `tandem config default` and the wizard reading
// its answers from a pipe, end to end.

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch/config_cli_helpers.h"
#include "tandem/config/config.h"

namespace tandem {
namespace {

using testing::file_exists;
using testing::read_file;
using testing::run_process;
using testing::tandem_in;
using testing::TempDir;
using testing::with_stdin;
using testing::write_text;

const char* kAccelerateYaml =
    "compute_environment: LOCAL_MACHINE\n"
    "distributed_type: MULTI_GPU\n"
    "num_processes: 4\n"
    "num_machines: 1\n"
    "machine_rank: 0\n"
    "mixed_precision: bf16\n"
    "gpu_ids: all\n";

TEST(ConfigCheck, ValidFilePrintsTheResolvedConfigAsJson) {
  TempDir home;
  const std::string path = home.path() + "/accelerate.yaml";
  write_text(path, kAccelerateYaml);
  auto r = run_process(tandem_in(home.path(), {"config", "check", path}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["world_size"], 4) << "the file's num_processes is the default world size";
  EXPECT_EQ(json["num_machines"], 1);
  EXPECT_EQ(json["mixed_precision"], "bf16");
  EXPECT_TRUE(json.contains("gradient_accumulation_steps"));
  EXPECT_EQ(json["zero_optimization"]["stage"], 0);
}

// An Accelerate FSDP file: check prints the ZeRO settings it maps to.
TEST(ConfigCheck, FsdpFilePrintsTheZeroSettingsItMapsTo) {
  TempDir home;
  const std::string path = home.path() + "/fsdp.yaml";
  write_text(path,
             "distributed_type: FSDP\nnum_processes: 8\nnum_machines: 2\nfsdp_config:\n"
             "  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\n  fsdp_offload_params: true\n"
             "  fsdp_activation_checkpointing: true\n");
  auto r = run_process(tandem_in(home.path(), {"config", "check", path}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["distributed_type"], "FSDP");
  EXPECT_EQ(json["zero_optimization"]["stage"], 2);
  EXPECT_EQ(json["zero_optimization"]["zero_hpz_partition_size"], "ranks_per_host");
  EXPECT_EQ(json["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(json["zero_optimization"]["offload_param"]["device"], "none");
  EXPECT_EQ(json["activation_checkpointing"]["enabled"], true);
  // ZeRO-2 keeps the parameters on the device, and says so.
  ASSERT_EQ(json["warnings"].size(), 1u) << r.out;
  EXPECT_NE(r.err.find("'fsdp_config.fsdp_offload_params' at ZeRO-2"), std::string::npos)
      << r.err;
}

TEST(ConfigCheck, WorldSizeResolvesTheDeepSpeedBatchTriple) {
  TempDir home;
  const std::string path = home.path() + "/ds.json";
  write_text(path,
             R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                 "zero_optimization": {"stage": 2}})");
  auto r = run_process(tandem_in(home.path(), {"config", "check", path, "--world-size", "4"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["world_size"], 4);
  EXPECT_EQ(json["train_batch_size"], 32);
  EXPECT_EQ(json["gradient_accumulation_steps"], 2);
  EXPECT_EQ(json["zero_optimization"]["stage"], 2);

  auto inconsistent = run_process(tandem_in(home.path(), {"config", "check", path, "--world-size", "3"}), 60);
  EXPECT_EQ(inconsistent.exit_code, 2) << inconsistent.out;
}

TEST(ConfigCheck, UnimplementedKeysAreWarningsOnStderr) {
  TempDir home;
  const std::string path = home.path() + "/ds.json";
  write_text(path, R"({"train_micro_batch_size_per_gpu": 2,
                       "zero_optimization": {"stage": 1, "round_robin_gradients": true}})");
  auto r = run_process(tandem_in(home.path(), {"config", "check", path}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("round_robin_gradients"), std::string::npos) << r.err;
  auto json = nlohmann::json::parse(r.out);  // stdout is the JSON only
  ASSERT_EQ(json["warnings"].size(), 1u) << r.out;
  EXPECT_NE(json["warnings"][0].get<std::string>().find("round_robin_gradients"), std::string::npos);
}

TEST(ConfigCheck, BadFileExitsTwoNamingTheLineColumnAndKey) {
  TempDir home;
  const std::string path = home.path() + "/bad.yaml";
  write_text(path,
             "compute_environment: LOCAL_MACHINE\n"
             "distributed_type: MULTI_GPU\n"
             "mixed_precison: bf16\n");
  auto r = run_process(tandem_in(home.path(), {"config", "check", path}), 60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find(path + ":3:1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mixed_precison"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mixed_precision"), std::string::npos) << "did-you-mean: " << r.err;

  auto missing = run_process(tandem_in(home.path(), {"config", "check", home.path() + "/none.yaml"}), 60);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("none.yaml"), std::string::npos) << missing.err;

  auto no_file = run_process(tandem_in(home.path(), {"config", "check"}), 60);
  EXPECT_EQ(no_file.exit_code, 2);
}


TEST(ConfigCheck, SeveralFilesGiveOneJsonLineEachAndARefusalStopsNoOther) {
  TempDir home;
  const std::string good = home.path() + "/accelerate.yaml";
  const std::string bad = home.path() + "/bad.yaml";
  const std::string ds = home.path() + "/ds.json";
  write_text(good, kAccelerateYaml);
  write_text(bad, "distributed_type: MULTI_GPU\nmixed_precison: bf16\n");
  write_text(ds, R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})");
  auto r = run_process(
      tandem_in(home.path(), {"config", "check", good, bad, ds, "--world-size", "2"}), 60);
  EXPECT_EQ(r.exit_code, 2) << "one refused file makes the exit status 2: " << r.err;
  std::vector<nlohmann::json> lines;
  std::istringstream out(r.out);
  for (std::string line; std::getline(out, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u) << r.out;

  EXPECT_EQ(lines[0]["file"], good);
  EXPECT_EQ(lines[0]["valid"], true);
  EXPECT_EQ(lines[0]["config"]["world_size"], 2) << "--world-size applies to every file";
  EXPECT_EQ(lines[0]["config"]["mixed_precision"], "bf16");

  EXPECT_EQ(lines[1]["file"], bad);
  EXPECT_EQ(lines[1]["valid"], false);
  EXPECT_NE(lines[1]["error"].get<std::string>().find(bad + ":2:1"), std::string::npos)
      << lines[1];
  EXPECT_NE(r.err.find("mixed_precison"), std::string::npos) << "refusals go to stderr too";

  EXPECT_EQ(lines[2]["file"], ds) << "the file after a refused one is still checked";
  EXPECT_EQ(lines[2]["valid"], true);
  EXPECT_EQ(lines[2]["config"]["gradient_accumulation_steps"], 4);

  auto all_good = run_process(tandem_in(home.path(), {"config", "check", good, ds}), 60);
  EXPECT_EQ(all_good.exit_code, 0) << all_good.err;
}
TEST(ConfigDefault, WritesABasicConfigToTheXdgCachePathAndNeverOverwrites) {
  TempDir home;
  const std::string cache = home.path() + "/xdg";
  const std::string path = cache + "/tandem/default_config.yaml";
  auto r = run_process(tandem_in(home.path(), {"config", "default", "--mixed-precision", "bf16"},
                                 {"XDG_CACHE_HOME=" + cache}),
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(path), std::string::npos) << r.out;
  Config written = load_config_file(path);
  EXPECT_EQ(written.mixed_precision, MixedPrecision::kBf16);
  EXPECT_GE(written.num_processes.value_or(0), 1);

  const std::string before = read_file(path);
  auto again = run_process(tandem_in(home.path(), {"config", "default"}, {"XDG_CACHE_HOME=" + cache}), 60);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("already exists"), std::string::npos) << again.err;
  EXPECT_EQ(read_file(path), before) << "an existing config must be left as it was";

  auto forced = run_process(tandem_in(home.path(), {"config", "default", "--force"},
                                      {"XDG_CACHE_HOME=" + cache}),
                            60);
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(load_config_file(path).mixed_precision, MixedPrecision::kNo);
}

// The file tandem writes checks clean, and writing it keeps what the user
// set up: a link is written through (Accelerate opens the path for
// writing), the file keeps its mode, and a failure names the config.
TEST(ConfigDefault, WritesThroughALinkKeepsTheModeAndChecksClean) {
  TempDir home;
  const std::string real = home.path() + "/dot/real.yaml";
  const std::string link = home.path() + "/link.yaml";
  write_text(real, "distributed: MULTI_CPU\n");
  ASSERT_EQ(::chmod(real.c_str(), 0600), 0);
  ASSERT_EQ(::symlink("dot/real.yaml", link.c_str()), 0);
  auto r = run_process(
      tandem_in(home.path(), {"config", "default", "--config-file", link, "--force"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  struct stat link_stat {}, real_stat {};
  ASSERT_EQ(::lstat(link.c_str(), &link_stat), 0);
  EXPECT_TRUE(S_ISLNK(link_stat.st_mode)) << "the link was replaced by a file";
  ASSERT_EQ(::stat(real.c_str(), &real_stat), 0);
  EXPECT_EQ(real_stat.st_mode & 0777, 0600u);
  EXPECT_NE(read_file(real).find("zero_optimization"), std::string::npos) << read_file(real);

  auto check = run_process(tandem_in(home.path(), {"config", "check", link}), 60);
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_EQ(check.err.find("warning"), std::string::npos) << check.err;

  auto failed = run_process(
      tandem_in(home.path(), {"config", "default", "--config-file", "/proc/tandem.yaml"}), 60);
  EXPECT_EQ(failed.exit_code, 2) << failed.err;
  EXPECT_NE(failed.err.find("cannot write the config /proc/tandem.yaml: "), std::string::npos)
      << failed.err;
  EXPECT_EQ(failed.err.find(".tmp"), std::string::npos) << failed.err;
}

TEST(ConfigDefault, FallsBackToHomeCacheAndHonoursConfigFile) {
  TempDir home;
  auto r = run_process(tandem_in(home.path(), {"config", "default"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(file_exists(home.path() + "/.cache/tandem/default_config.yaml")) << r.out;

  const std::string custom = home.path() + "/deep/er/mine.yaml";
  auto c = run_process(tandem_in(home.path(), {"config", "default", "--config-file", custom}), 60);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NO_THROW(load_config_file(custom));

  auto bad = run_process(tandem_in(home.path(), {"config", "default", "--config-file",
                                                 home.path() + "/x.yaml", "--mixed-precision", "fp8"}),
                         60);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_FALSE(file_exists(home.path() + "/x.yaml"));
}

// Without a GPU the file is for the CPU (use_cpu: true), where the
// Accelerator refuses fp16: refused when writing, and when checking a file
// that says both.
TEST(ConfigDefault, Fp16WithoutAGpuIsRefusedAndWritesNothing) {
  TempDir home;
  const std::string path = home.path() + "/def.yaml";
  auto r = run_process(tandem_in(home.path(), {"config", "default", "--config-file", path,
                                               "--mixed-precision", "fp16"},
                                 {"CUDA_VISIBLE_DEVICES="}),
                       60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--mixed-precision fp16 needs a CUDA device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Use --mixed-precision bf16"), std::string::npos) << r.err;
  EXPECT_FALSE(file_exists(path));

  auto bf16 = run_process(tandem_in(home.path(), {"config", "default", "--config-file", path,
                                                  "--mixed-precision", "bf16"},
                                    {"CUDA_VISIBLE_DEVICES="}),
                          60);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_TRUE(load_config_file(path).use_cpu);

  // The contradiction written by hand: config check exits 2 with the fix.
  write_text(path, "use_cpu: true\nmixed_precision: fp16\n");
  auto check = run_process(tandem_in(home.path(), {"config", "check", path}), 60);
  EXPECT_EQ(check.exit_code, 2) << check.out;
  EXPECT_NE(check.err.find(path + ":2:18: mixed_precision fp16 with use_cpu: true"),
            std::string::npos)
      << check.err;
}

// The wizard with answers piped in: one line each, no terminal.
testing::ProcessResult run_wizard(const TempDir& home, const std::string& answers,
                                  const std::string& out_path) {
  const std::string input = home.path() + "/answers.txt";
  write_text(input, answers);
  return run_process(with_stdin(input, tandem_in(home.path(), {"config", "--config-file", out_path})),
                     60);
}

TEST(ConfigWizardPiped, AnswersByLineWithDefaultsAndReAsksBadAnswers) {
  TempDir home;
  const std::string path = home.path() + "/cfg/tandem.yaml";
  auto r = run_wizard(home,
                      "\n"            // compute environment: default (this machine)
                      "multi-cpu\n"   // machine type, by name
                      "two\n"         // refused: not a number
                      "2\n"           // machines
                      "1\n"           // this machine's rank
                      "10.0.0.7\n"    // main process address
                      "70000\n"       // refused: port out of range
                      "29600\n"       // port
                      "3\n"           // refused: 3 processes over 2 machines
                      "4\n"           // processes in total
                      "1\n"           // mixed precision by number: bf16
                      "3\n"           // ZeRO stage 3
                      "cpu\n"         // offload optimizer
                      "\n"            // offload parameters: default none
                      "4\n"           // gradient accumulation
                      "1.0\n",        // clipping
                      path);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("'two' is not a whole number"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("70000 is out of range"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cannot be split evenly over 2 machines"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\x1b"), std::string::npos) << "no escape sequences without a terminal";
  EXPECT_NE(r.out.find("saved at " + path), std::string::npos) << r.out;

  Config config = load_config_file(path);
  EXPECT_EQ(config.distributed_type, DistributedType::kMultiCpu);
  EXPECT_EQ(config.num_processes, 4);
  EXPECT_EQ(config.num_machines, 2);
  EXPECT_EQ(config.machine_rank, 1);
  EXPECT_EQ(config.main_process_ip, "10.0.0.7");
  EXPECT_EQ(config.main_process_port, 29600);
  EXPECT_EQ(config.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(config.zero.stage, 3);
  EXPECT_EQ(config.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(config.zero.offload_param, OffloadDevice::kNone);
  EXPECT_EQ(config.gradient_accumulation_steps, 4);
  EXPECT_DOUBLE_EQ(config.gradient_clipping, 1.0);
}

TEST(ConfigWizardPiped, EmptyLinesTakeEveryDefault) {
  TempDir home;
  const std::string path = home.path() + "/tandem.yaml";
  auto r = run_wizard(home, "\n\n\n\n\n", path);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  Config config = load_config_file(path);
  EXPECT_EQ(config.distributed_type, DistributedType::kNo);
  EXPECT_EQ(config.num_processes.value_or(1), 1);
  EXPECT_EQ(config.mixed_precision, MixedPrecision::kNo);
  EXPECT_EQ(config.zero.stage, 0);
}

TEST(ConfigWizardPiped, WritesTheDefaultPathWhenNoFileIsGiven) {
  TempDir home;
  const std::string input = home.path() + "/answers.txt";
  write_text(input, "\n\n2\n\n\n");
  auto r = run_process(with_stdin(input, tandem_in(home.path(), {"config"},
                                                   {"XDG_CACHE_HOME=" + home.path() + "/c"})),
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(load_config_file(home.path() + "/c/tandem/default_config.yaml").mixed_precision,
            MixedPrecision::kFp16);
}

TEST(ConfigWizardPiped, InputEndingMidWayExitsTwoAndWritesNothing) {
  TempDir home;
  const std::string path = home.path() + "/tandem.yaml";
  auto r = run_wizard(home, "\nmulti-gpu\n2\n", path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("input ended"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank of this machine"), std::string::npos) << "names the question: " << r.err;
  EXPECT_FALSE(file_exists(path));
  EXPECT_FALSE(file_exists(home.path() + "/.cache/tandem/default_config.yaml"));
}

}  // namespace
}  // namespace tandem
