// `tandem estimate-memory`: the ZeRO model-state formulas, the --params
// parser, and the command end to end.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimate/estimate_memory.h"
#include "support/subprocess.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using cli::estimate_model_states;
using cli::MemoryEstimateOptions;
using cli::parse_param_count;
using cli::StrategyEstimate;
using testing::bin;
using testing::run_process;

std::map<std::string, StrategyEstimate> estimate(int64_t params, int64_t world_size,
                                                 MixedPrecision precision, bool offload = false) {
  MemoryEstimateOptions options;
  options.params = params;
  options.world_size = world_size;
  options.mixed_precision = precision;
  options.offload = offload;
  std::map<std::string, StrategyEstimate> by_key;
  for (auto& e : estimate_model_states(options)) by_key[e.key] = e;
  return by_key;
}

// --- The formulas ----------------------------------------------------------

TEST(EstimateMemory, ReproducesTheZeroPaperFigures) {
  // ZeRO paper, figure 1: 7.5B parameters, 64 GPUs, mixed precision, K = 12.
  for (MixedPrecision precision : {MixedPrecision::kFp16, MixedPrecision::kBf16}) {
    auto e = estimate(7'500'000'000, 64, precision);
    EXPECT_EQ(e["ddp"].device.total(), 120'000'000'000);    // 120 GB
    EXPECT_EQ(e["zero1"].device.total(), 31'406'250'000);   // 31.4 GB
    EXPECT_EQ(e["zero2"].device.total(), 16'640'625'000);   // 16.6 GB
    EXPECT_EQ(e["zero3"].device.total(), 1'875'000'000);    // 1.9 GB
    for (const char* key : {"ddp", "zero1", "zero2", "zero3"}) {
      EXPECT_EQ(e[key].host.total(), 0) << key << ": nothing on the host without offload";
    }
  }
}

TEST(EstimateMemory, Fp32FollowsFourFourEightForWorldSizesOneTwoFour) {
  const int64_t p = 1'000'000;
  for (int64_t n : {1, 2, 4}) {
    auto e = estimate(p, n, MixedPrecision::kNo);
    EXPECT_EQ(e["ddp"].device.total(), 16 * p) << "N=" << n;
    EXPECT_EQ(e["zero1"].device.total(), 4 * p + 4 * p + 8 * p / n) << "N=" << n;
    EXPECT_EQ(e["zero2"].device.total(), 4 * p + 12 * p / n) << "N=" << n;
    EXPECT_EQ(e["zero3"].device.total(), 16 * p / n) << "N=" << n;
    // No separate master copy in fp32: the optimizer states are the moments.
    EXPECT_EQ(e["zero1"].device.optimizer_states, 8 * p / n);
    EXPECT_EQ(e["zero1"].device.params, 4 * p);
  }
  // With one rank every stage is DDP.
  auto one = estimate(p, 1, MixedPrecision::kFp16);
  for (const char* key : {"zero1", "zero2", "zero3"}) {
    EXPECT_EQ(one[key].device.total(), one["ddp"].device.total()) << key;
  }
}

TEST(EstimateMemory, ShardsRoundUpToWholeElements) {
  // 10 parameters over 4 ranks: ZeRO pads to 12, so each rank holds 3.
  auto e = estimate(10, 4, MixedPrecision::kNo);
  EXPECT_EQ(e["zero3"].device.total(), 16 * 3);
  EXPECT_EQ(e["zero2"].device.total(), 4 * 10 + 12 * 3);
}

TEST(EstimateMemory, FormulasNameEachTermInBytesPerParameter) {
  auto mixed = estimate(1000, 8, MixedPrecision::kFp16, /*offload=*/true);
  EXPECT_EQ(mixed["ddp"].device_formula, "2P + 2P + 12P");
  EXPECT_EQ(mixed["zero1"].device_formula, "2P + 2P + 12P/N");
  EXPECT_EQ(mixed["zero2"].device_formula, "2P + 2P/N + 12P/N");
  EXPECT_EQ(mixed["zero3"].device_formula, "2P/N + 2P/N + 12P/N");
  EXPECT_EQ(mixed["zero3"].host_formula, "0");
  EXPECT_EQ(mixed["zero2_offload"].device_formula, "2P");
  EXPECT_EQ(mixed["zero2_offload"].host_formula, "4P/N + 12P/N");
  EXPECT_EQ(mixed["zero3_offload_param"].device_formula, "0");
  EXPECT_EQ(mixed["zero3_offload_param"].host_formula, "2P/N + 4P/N + 12P/N");
  auto fp32 = estimate(1000, 8, MixedPrecision::kNo);
  EXPECT_EQ(fp32["zero2"].device_formula, "4P + 4P/N + 8P/N");
}

TEST(EstimateMemory, OffloadVariantsOnlyWhenAsked) {
  MemoryEstimateOptions options;
  options.params = 1000;
  options.world_size = 2;
  std::vector<std::string> keys;
  for (const auto& e : estimate_model_states(options)) keys.push_back(e.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"ddp", "zero1", "zero2", "zero3"}));
  options.offload = true;
  keys.clear();
  for (const auto& e : estimate_model_states(options)) keys.push_back(e.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"ddp", "zero1", "zero2", "zero3", "zero1_offload",
                                            "zero2_offload", "zero3_offload",
                                            "zero3_offload_param"}));
}

TEST(EstimateMemory, OffloadMovesOptimizerStatesAndTheFp32GradientShardToTheHost) {
  const int64_t p = 7'500'000'000;
  const int64_t shard = p / 64;
  auto e = estimate(p, 64, MixedPrecision::kFp16, /*offload=*/true);
  // The host keeps per rank the fp32 gradient shard (4) and fp32 weights +
  // Adam moments (12) for every stage.
  for (const char* key : {"zero1_offload", "zero2_offload", "zero3_offload"}) {
    EXPECT_EQ(e[key].host.gradients, 4 * shard) << key;
    EXPECT_EQ(e[key].host.optimizer_states, 12 * shard) << key;
    EXPECT_EQ(e[key].host.params, 0) << key;
    EXPECT_EQ(e[key].device.optimizer_states, 0) << key;
  }
  // Stage 1 does not shard gradients: the full fp16 gradient stays on the device.
  EXPECT_EQ(e["zero1_offload"].device.total(), 2 * p + 2 * p);  // 30 GB
  EXPECT_EQ(e["zero2_offload"].device.total(), 2 * p);          // 15 GB
  EXPECT_EQ(e["zero3_offload"].device.total(), 2 * shard);
  EXPECT_EQ(e["zero3_offload_param"].device.total(), 0);
  EXPECT_EQ(e["zero3_offload_param"].host.total(), 18 * shard);  // DeepSpeed's 18 bytes

  // fp32 training: the host still keeps 12 bytes of optimizer state (its own
  // fp32 copy to step on + the moments), and the parameter shard is 4 bytes.
  auto fp32 = estimate(p, 64, MixedPrecision::kNo, /*offload=*/true);
  EXPECT_EQ(fp32["zero2_offload"].device.total(), 4 * p);
  EXPECT_EQ(fp32["zero2_offload"].host.total(), 16 * shard);
  EXPECT_EQ(fp32["zero3_offload_param"].host.total(), 20 * shard);
}

TEST(EstimateMemory, RejectsAnEmptyModelOrWorld) {
  MemoryEstimateOptions options;
  options.params = 0;
  EXPECT_THROW(estimate_model_states(options), UsageError);
  options.params = 10;
  options.world_size = 0;
  EXPECT_THROW(estimate_model_states(options), UsageError);
}

// --- --params ----------------------------------------------------------------

TEST(EstimateMemoryParams, ReadsEveryWrittenForm) {
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"7.5e9", 7'500'000'000}, {"7B", 7'000'000'000},   {"7.5B", 7'500'000'000},
      {"125M", 125'000'000},    {"350m", 350'000'000},   {"1.3b", 1'300'000'000},
      {"13k", 13'000},          {"13K", 13'000},         {"1e6", 1'000'000},
      {"1000000", 1'000'000},   {"1E6", 1'000'000},      {"2.5e+3", 2'500},
      {"1T", 1'000'000'000'000}, {"0.5k", 500},           {".5k", 500},
      {"1", 1},                 {"1.23456789B", 1'234'567'890},
      {"120000e-4", 12},        {"1e15", 1'000'000'000'000'000}, {"007B", 7'000'000'000},
  };
  for (const auto& [text, expected] : cases) {
    EXPECT_EQ(parse_param_count(text), expected) << text;
  }
}

// The message for `text`, which must be rejected.
std::string rejection(const std::string& text) {
  try {
    int64_t value = parse_param_count(text);
    ADD_FAILURE() << "'" << text << "' was accepted as " << value;
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(EstimateMemoryParams, RejectsJunkNamingTheFlagWithAnExample) {
  for (const char* text : {"", "abc", "7BB", "7 B", " 7B", "1e", "1e+", "7Q", "1e3k", "0x10",
                           "nan", "inf", "B", ".", "1.2.3", "+5", "1,000"}) {
    std::string message = rejection(text);
    EXPECT_NE(message.find("--params"), std::string::npos) << text << ": " << message;
    EXPECT_NE(message.find("7.5e9"), std::string::npos) << text << ": " << message;
  }
}

TEST(EstimateMemoryParams, SaysWhyANumberIsOutOfRange) {
  EXPECT_NE(rejection("-5").find("positive"), std::string::npos) << rejection("-5");
  EXPECT_NE(rejection("-7B").find("positive"), std::string::npos);
  for (const char* zero : {"0", "0.0B", "0e9", "000"}) {
    EXPECT_NE(rejection(zero).find("at least 1"), std::string::npos) << zero;
  }
  for (const char* fraction : {"1.5", "1.2345k", "1e-1", "7.0000000001B"}) {
    EXPECT_NE(rejection(fraction).find("whole number"), std::string::npos) << fraction;
  }
  for (const char* huge : {"1.000000000000001e15", "1e16", "2000T", "99999999999999999999999",
                           "1e999999999999", "9223372036854775808"}) {
    EXPECT_NE(rejection(huge).find("1e15"), std::string::npos) << huge << ": " << rejection(huge);
  }
}

// --- The command, end to end --------------------------------------------------

TEST(EstimateMemoryCli, TableShowsThePaperFiguresInGigabytes) {
  auto r = run_process({bin("tandem"), "estimate-memory", "--params", "7.5e9", "--world-size", "64",
                        "--mixed-precision", "fp16"},
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* figure : {"120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB", "2P + 2P + 12P/N"}) {
    EXPECT_NE(r.out.find(figure), std::string::npos) << figure << " in\n" << r.out;
  }
  EXPECT_EQ(r.out.find("offload optimizer"), std::string::npos) << "offload rows need --offload";
}

TEST(EstimateMemoryCli, JsonHasEveryStrategyAndTheInputs) {
  auto r = run_process({bin("tandem"), "estimate-memory", "--params", "7.5B", "--world-size", "64",
                        "--mixed-precision", "bf16", "--offload", "--gpus-per-node", "8", "--json"},
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["params"], 7'500'000'000);
  EXPECT_EQ(json["world_size"], 64);
  EXPECT_EQ(json["mixed_precision"], "bf16");
  EXPECT_EQ(json["gpus_per_node"], 8);
  for (const char* key : {"ddp", "zero1", "zero2", "zero3", "zero1_offload", "zero2_offload",
                          "zero3_offload", "zero3_offload_param"}) {
    ASSERT_TRUE(json.contains(key)) << key;
    EXPECT_TRUE(json[key]["model_state_bytes"].is_number_integer()) << key;
    EXPECT_TRUE(json[key]["host_bytes"].is_number_integer()) << key;
  }
  EXPECT_EQ(json["zero1"]["model_state_bytes"], 31'406'250'000);
  EXPECT_EQ(json["zero3"]["host_bytes"], 0);
  EXPECT_EQ(json["zero2_offload"]["model_state_bytes"], 15'000'000'000);
  EXPECT_EQ(json["zero2_offload"]["host_bytes"], 1'875'000'000);
  EXPECT_EQ(json["zero2_offload"]["host_bytes_per_node"], 8 * 1'875'000'000LL);
  EXPECT_EQ(json["zero3_offload_param"]["device"]["params"], 0);
  EXPECT_EQ(json["zero3_offload_param"]["host"]["params"], 2 * 117'187'500LL);
}

TEST(EstimateMemoryCli, BadInputExitsTwoWithAClearMessage) {
  auto bad_params = run_process({bin("tandem"), "estimate-memory", "--params", "7X"}, 60);
  EXPECT_EQ(bad_params.exit_code, 2) << bad_params.out;
  EXPECT_NE(bad_params.err.find("--params"), std::string::npos) << bad_params.err;
  EXPECT_NE(bad_params.err.find("7B"), std::string::npos) << bad_params.err;
  EXPECT_TRUE(bad_params.out.empty()) << bad_params.out;

  auto negative = run_process({bin("tandem"), "estimate-memory", "--params", "-5"}, 60);
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_NE(negative.err.find("positive"), std::string::npos) << negative.err;

  auto precision = run_process({bin("tandem"), "estimate-memory", "--params", "1B",
                                "--mixed-precision", "fp8"},
                               60);
  EXPECT_EQ(precision.exit_code, 2);
  EXPECT_NE(precision.err.find("--mixed-precision"), std::string::npos) << precision.err;

  const std::vector<std::vector<std::string>> others = {
      {},                                                   // --params is required
      {"--params", "1B", "--world-size", "0"},
      {"--params", "1B", "--world-size", "four"},
      {"--params", "1B", "--world-size", "64", "--offload", "--gpus-per-node", "3"},
      {"--params", "1B", "--bogus"},
  };
  for (const auto& args : others) {
    std::vector<std::string> argv = {bin("tandem"), "estimate-memory"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run_process(argv, 60);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(args) << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << ::testing::PrintToString(args);
  }

  // Without --offload the flag would change nothing: refused, not ignored.
  auto per_node = run_process({bin("tandem"), "estimate-memory", "--params", "1B",
                               "--world-size", "16", "--gpus-per-node", "8"},
                              60);
  EXPECT_EQ(per_node.exit_code, 2) << per_node.out;
  EXPECT_NE(per_node.err.find("add --offload to see them, or drop --gpus-per-node"),
            std::string::npos)
      << per_node.err;
}

}  // namespace
}  // namespace tandem
