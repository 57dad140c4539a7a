// examples/spawn_quickstart end to end: a program that starts its own
// workers with tandem::spawn, run with no launcher and no rank variables.

#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::bin;
using testing::run_process;

// A clean environment: none of an outer launcher's variables reach the program.
const std::vector<std::string> kNoLauncher = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=",
                                              "MASTER_PORT=", "MASTER_ADDR="};

nlohmann::json last_line_json(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  if (end == std::string::npos) return nullptr;
  auto start = out.rfind('\n', end);
  start = start == std::string::npos ? 0 : start + 1;
  return nlohmann::json::parse(out.substr(start, end + 1 - start), nullptr, false);
}

class SpawnQuickstart : public ::testing::TestWithParam<int> {};

TEST_P(SpawnQuickstart, TrainsOnNWorkersAndRankZeroPrintsTheWorldAndLossLast) {
  const int world = GetParam();
  auto r = run_process({bin("spawn_quickstart"), "--nprocs", std::to_string(world)}, 240,
                       kNoLauncher);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const nlohmann::json result = last_line_json(r.out);
  ASSERT_TRUE(result.is_object()) << "last line is not JSON:\n" << r.out;
  EXPECT_EQ(result["world"], world);
  const double loss = result["loss"].get<double>();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(loss, 0.5) << "the quickstart's own bar for having learned";
}

INSTANTIATE_TEST_SUITE_P(Worlds, SpawnQuickstart, ::testing::Values(2, 3));

TEST(SpawnQuickstart, AFailingRankMakesTheProgramFailWithAMessageNamingIt) {
  auto r = run_process({bin("spawn_quickstart"), "--nprocs", "3", "--fail-rank", "1"}, 240,
                       kNoLauncher);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("rank 1 of 3 failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 fails on purpose"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("\"world\""), std::string::npos) << "no result after a failure:\n" << r.out;
}

}  // namespace
}  // namespace tandem
