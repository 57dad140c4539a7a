#include <gtest/gtest.h>

#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

TEST(Error, CheckMessageCarriesRankAndCallSite) {
  set_thread_rank_label(1, 4);
  try {
    TANDEM_CHECK(1 + 1 == 3, "bucket {} is too small", 7);
    FAIL() << "TANDEM_CHECK did not throw";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_EQ(what.rfind("[rank 1/4] bucket 7 is too small (test_error.cpp:", 0), 0u) << what;
  }
  clear_thread_rank_label();
}

TEST(Error, UserFacingErrorsCarryNoCallSite) {
  set_thread_rank_label(0, 2);
  auto message_of = [](auto thrower) {
    try {
      thrower();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("did not throw");
  };
  EXPECT_EQ(message_of([] { TANDEM_CHECK_ARG(false, "batch size {} is odd", 3); }),
            "[rank 0/2] batch size 3 is odd");
  EXPECT_EQ(message_of([] { TANDEM_THROW(CheckpointError, "ckpt/meta.json is truncated"); }),
            "[rank 0/2] ckpt/meta.json is truncated");
  EXPECT_NE(message_of([] { TANDEM_THROW(CommError, "peer closed"); }).find("(test_error.cpp:"),
            std::string::npos);
  clear_thread_rank_label();
}

TEST(Error, CheckEqPrintsBothValues) {
  int expected = 3;
  int got = 4;
  try {
    TANDEM_CHECK_EQ(expected, got, "shapes differ");
    FAIL();
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("expected (3) != got (4): shapes differ"), std::string::npos) << what;
  }
}

TEST(Error, CheckArgThrowsUsageError) {
  EXPECT_THROW(TANDEM_CHECK_ARG(false, "bad"), UsageError);
  EXPECT_NO_THROW(TANDEM_CHECK_ARG(true, "fine"));
}

TEST(Error, TimeoutIsACommErrorIsAnError) {
  try {
    TANDEM_THROW(TimeoutError, "late");
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("late"), std::string::npos);
  }
}

TEST(Logging, ParsesLevelsAndRejectsUnknownOnes) {
  EXPECT_EQ(parse_log_level("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("warning"), LogLevel::kWarn);
  EXPECT_EQ(parse_log_level("off"), LogLevel::kOff);
  EXPECT_THROW(parse_log_level("verbose"), UsageError);
}

TEST(Logging, PrefixFollowsThreadLabelThenProcessLabel) {
  clear_thread_rank_label();
  set_process_rank_label(2, 8);
  EXPECT_EQ(rank_prefix(), "[rank 2/8] ");
  EXPECT_FALSE(is_main_process_label());
  set_thread_rank_label(0, 8);
  EXPECT_EQ(rank_prefix(), "[rank 0/8] ");
  EXPECT_TRUE(is_main_process_label());
  clear_thread_rank_label();
  set_process_rank_label(-1, 0);
  EXPECT_EQ(rank_prefix(), "");
}

}  // namespace
}  // namespace tandem
