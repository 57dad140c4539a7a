// Collective timeouts: the error names the operation, its sequence number and
// the ranks that did not arrive, and nothing hangs afterwards.
//
// A rank that "hangs" blocks on a future the test releases once the others
// have their error; no sleep is used to order the ranks.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/progress_monitor.h"
#include "support/thread_ranks.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

using testing::run_ranks;

ProcessGroupOptions short_timeout(bool shared_memory) {
  ProcessGroupOptions options;
  options.shared_memory = shared_memory;
  options.timeout = std::chrono::milliseconds(1500);
  options.progress_interval = std::chrono::milliseconds(100);
  return options;
}

// Collects the TimeoutError message of each rank that got one.
struct Messages {
  std::mutex mutex;
  std::map<int, std::string> by_rank;
  void add(int rank, const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex);
    by_rank[rank] = text;
  }
};

// Runs `collective` twice on 3 ranks; rank 1 skips the second call and
// stays connected. Returns the TimeoutError messages of ranks 0 and 2.
std::map<int, std::string> skip_second_call_on_rank_1(
    const ProcessGroupOptions& options, const std::function<void(ProcessGroup&)>& collective) {
  Messages messages;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> waiting{2};
  const auto start = std::chrono::steady_clock::now();
  run_ranks(
      3,
      [&](ProcessGroup& pg) {
        collective(pg);  // #0 on every rank
        if (pg.rank() == 1) {
          released.wait();  // skips #1 and stays connected
          return;
        }
        try {
          collective(pg);
          ADD_FAILURE() << "collective #1 completed without rank 1";
        } catch (const TimeoutError& e) {
          messages.add(pg.rank(), e.what());
        }
        // Keep this rank's connections open until the other one has its
        // error too, or that one could see a closed connection instead.
        if (--waiting == 0) release.set_value();
        released.wait();
      },
      options);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  return messages.by_rank;
}

// `described` is the collective as errors name it, without its number:
// "all_reduce #{} Float[4] on shm"; `reported` is what its progress report
// adds (the reduce op or root: " (sum)").
void expect_skipped_call_named(const std::map<int, std::string>& by_rank,
                               const std::string& described, const std::string& reported) {
  ASSERT_EQ(by_rank.size(), 2u);
  for (const auto& [rank, message] : by_rank) {
    EXPECT_NE(message.find(fmt::format("[rank {}/3]", rank)), std::string::npos) << message;
    EXPECT_NE(message.find(fmt::format(fmt::runtime(described), 1) + " timed out after 1500 ms"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("rank 1 did not arrive (rank 1 last entered " +
                           fmt::format(fmt::runtime(described), 0) + reported +
                           " (as of its last report, "),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("TANDEM_TIMEOUT_S"), std::string::npos) << message;
  }
}

// (shared memory, desync check on). With the check on, the timeout happens
// in the fingerprint exchange, which must report the outer collective.
class SkippedCollective : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(SkippedCollective, OthersNameTheRankTheOperationAndTheSequenceNumber) {
  const auto [shared_memory, checked] = GetParam();
  auto options = short_timeout(shared_memory);
  options.desync_check_collectives = checked ? 256 : 0;
  auto messages = skip_second_call_on_rank_1(options, [](ProcessGroup& pg) {
    auto t = at::ones({4});
    pg.all_reduce(t);
  });
  expect_skipped_call_named(messages,
                            std::string("all_reduce #{} Float[4] on ") + (shared_memory ? "shm" : "gloo"),
                            " (sum)");
}

INSTANTIATE_TEST_SUITE_P(
    TransportsAndChecks, SkippedCollective,
    ::testing::Combine(::testing::Bool(), ::testing::Bool()), [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "shm" : "gloo") +
             (std::get<1>(info.param) ? "_checked" : "_unchecked");
    });

// The same for all-gather and reduce-scatter: (reduce-scatter, shared memory),
// with the desync check off so that the collective itself times out.
class SkippedGatherOrScatter : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(SkippedGatherOrScatter, OthersNameTheRankTheOperationAndTheSequenceNumber) {
  const auto [scatter, shared_memory] = GetParam();
  auto options = short_timeout(shared_memory);
  options.desync_check_collectives = 0;
  auto messages = skip_second_call_on_rank_1(options, [scatter = scatter](ProcessGroup& pg) {
    auto shard = at::ones({5}, at::kBFloat16);
    auto whole = at::ones({15}, at::kBFloat16);
    if (scatter) {
      pg.reduce_scatter(shard, whole, ReduceOp::kAvg);
    } else {
      pg.all_gather_into(whole, shard);
    }
  });
  const std::string transport = shared_memory ? "shm" : "gloo";
  expect_skipped_call_named(messages,
                            scatter ? "reduce_scatter #{} BFloat16[15] on " + transport
                                    : "all_gather_into #{} BFloat16[5] on " + transport,
                            scatter ? " (avg)" : "");
}

INSTANTIATE_TEST_SUITE_P(
    OpsAndTransports, SkippedGatherOrScatter,
    ::testing::Combine(::testing::Bool(), ::testing::Bool()), [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "reduce_scatter" : "all_gather_into") +
             (std::get<1>(info.param) ? "_shm" : "_gloo");
    });

TEST(Timeouts, ARankThatEnteredNoCollectiveIsNamedAtABarrier) {
  Messages messages;
  std::promise<void> release;
  auto released = release.get_future();
  run_ranks(
      2,
      [&](ProcessGroup& pg) {
        if (pg.rank() == 1) {
          released.wait();
          return;
        }
        try {
          pg.barrier();
        } catch (const TimeoutError& e) {
          messages.add(0, e.what());
        }
        release.set_value();
      },
      short_timeout(false));
  ASSERT_EQ(messages.by_rank.size(), 1u);
  const std::string& message = messages.by_rank[0];
  EXPECT_NE(message.find("barrier #0 timed out after 1500 ms: rank 1 did not arrive (rank 1 "
                         "had entered no collective (as of its last report, "),
            std::string::npos)
      << message;
}

// Unwaited async work and the group itself must not block past the timeout
// once a collective has timed out.
class TeardownAfterTimeout : public ::testing::TestWithParam<bool> {};

TEST_P(TeardownAfterTimeout, UnwaitedWorkAndTheGroupAreDestroyedPromptly) {
  auto options = short_timeout(GetParam());
  options.desync_check_collectives = 0;  // let the async calls start at once
  std::string message;
  std::promise<void> release;
  auto released = release.get_future();
  std::chrono::steady_clock::duration teardown{};
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::thread other([&] {
    auto pg = ProcessGroup::create(store, 1, 2, options);
    released.wait();
  });
  {
    auto pg = ProcessGroup::create(store, 0, 2, options);
    auto a = at::ones({8});
    auto b = at::ones({1 << 16});
    Work first = pg->all_reduce_async(a);
    Work second = pg->all_reduce_async(b);
    try {
      first.wait();
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    const auto start = std::chrono::steady_clock::now();
    { Work dropped = std::move(second); }  // destroyed unwaited
    pg.reset();
    teardown = std::chrono::steady_clock::now() - start;
  }
  // Creating a group on this thread labelled it "[rank 0/2]": the tests that
  // follow on gtest's thread must not inherit that prefix.
  clear_thread_rank_label();
  release.set_value();
  other.join();
  EXPECT_NE(message.find("all_reduce #0 Float[8]"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 did not arrive"), std::string::npos) << message;
  // At most one more timeout for the second collective, never a hang.
  EXPECT_LT(teardown, std::chrono::milliseconds(1500 + 2000));
}

INSTANTIATE_TEST_SUITE_P(Transports, TeardownAfterTimeout, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "gloo"; });

TEST(Timeouts, TandemTimeoutSSetsTheGroupTimeout) {
  auto env = RankEnv::from_map({{"TANDEM_TIMEOUT_S", "3"}});
  EXPECT_EQ(env.timeout_s, 3);
  EXPECT_EQ(ProcessGroup::init(env)->timeout(), std::chrono::seconds(3));
  EXPECT_EQ(RankEnv::from_map({}).timeout_s, 0);
  EXPECT_EQ(ProcessGroup::init(RankEnv::from_map({}))->timeout(), std::chrono::minutes(10));
  EXPECT_THROW(RankEnv::from_map({{"TANDEM_TIMEOUT_S", "0"}}), UsageError);
  EXPECT_THROW(RankEnv::from_map({{"TANDEM_TIMEOUT_S", "2.5"}}), UsageError);
}

// explain_progress, the pure part: what each published value says.
TEST(ProgressExplanation, NamesMissingRanksWithWhereTheyLastWere) {
  std::vector<std::optional<std::string>> values = {
      std::string("12 all_reduce #12 Float[4, 8] on gloo"), std::string("9 barrier #9"),
      std::string("12 all_reduce #12 Float[4, 8] on gloo"), std::nullopt};
  EXPECT_EQ(detail::explain_progress(12, 0, values),
            "ranks 1, 3 did not arrive (rank 1 last entered barrier #9; rank 3 never reported)");
}

// A published value is only what the rank said when it last published: a
// rank frozen (SIGSTOP) before its publisher ran again still shows "joined"
// after 28 collectives. The note gives the report's age, never "yet".
TEST(ProgressExplanation, NotesSayHowOldEachRanksLastReportIs) {
  const std::int64_t now = 1'800'000'000'000;
  std::vector<std::optional<std::string>> values = {
      std::string("@" + std::to_string(now) + " 29 barrier #29"),
      std::string("@" + std::to_string(now - 12'000) + " joined"),
      std::string("@" + std::to_string(now - 3'500) + " 20 all_reduce #20 Float[2] on gloo")};
  EXPECT_EQ(detail::explain_progress(29, 0, values, {}, now),
            "ranks 1, 2 did not arrive (rank 1 had entered no collective (as of its last "
            "report, 12.0 s ago); rank 2 last entered all_reduce #20 Float[2] on gloo (as of its "
            "last report, 3.5 s ago))");
}

// A rank whose process group was destroyed (its program ended after fewer
// batches than the others) published where it was as it left.
TEST(ProgressExplanation, ARankThatLeftIsSaidToHaveLeftAfterItsLastCollective) {
  const std::int64_t now = 1'800'000'000'000;
  std::vector<std::optional<std::string>> values = {
      std::string("@" + std::to_string(now) + " 5 all_gather #5"),
      std::string("@" + std::to_string(now - 9'000) + " 4 all_gather #4 Int[1] on shm |left"),
      std::string("@" + std::to_string(now - 9'000) + " joined |left")};
  EXPECT_EQ(detail::explain_progress(5, 0, values, {}, now),
            "ranks 1, 2 did not arrive (rank 1 last entered all_gather #4 Int[1] on shm and "
            "then left the group: its process group was destroyed (the program ended, or an "
            "exception ended its training); rank 2 entered no collective and then left the "
            "group: its process group was destroyed (the program ended, or an exception ended "
            "its training))");
}

// End to end: ranks 1 and 2 run out of work and end while rank 0 waits in
// a shared-memory collective, where no closed connection tells it (Gloo's
// TCP pairs do: "Connection closed by peer").
TEST(Timeouts, RanksThatEndedAreNamedAsGoneNotAsStillOnTheirWay) {
  Messages messages;
  ProcessGroupOptions options = short_timeout(/*shared_memory=*/true);
  options.progress_interval = std::chrono::seconds(60);  // only the last word is published
  run_ranks(
      3,
      [&](ProcessGroup& pg) {
        at::Tensor t = at::ones({2});
        pg.all_reduce(t);  // #0 on every rank
        if (pg.rank() != 0) return;  // ranks 1 and 2 end; their groups are destroyed
        try {
          pg.all_reduce(t);
          ADD_FAILURE() << "the all_reduce completed without ranks 1 and 2";
        } catch (const TimeoutError& e) {
          messages.add(pg.rank(), e.what());
        }
      },
      options);
  const std::string& text = messages.by_rank[0];
  EXPECT_NE(text.find("ranks 1, 2 did not arrive (rank 1 last entered all_reduce #0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("and then left the group"), std::string::npos) << text;
}

TEST(ProgressExplanation, RanksAlreadyPastTheCollectiveMeanADesync) {
  std::vector<std::optional<std::string>> values = {std::string("3 barrier #3"),
                                                    std::string("5 all_reduce #5 Float[2] on shm")};
  const std::string text = detail::explain_progress(3, 0, values);
  EXPECT_NE(text.find("rank 1 is already past it (rank 1 last entered all_reduce #5 Float[2] on "
                      "shm): the ranks issued different collectives"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("TANDEM_DEBUG=DETAIL"), std::string::npos) << text;
}

TEST(ProgressExplanation, EveryRankPresentBlamesTheTransport) {
  std::vector<std::optional<std::string>> values = {std::string("2 barrier #2"),
                                                    std::string("2 barrier #2")};
  EXPECT_NE(detail::explain_progress(2, 1, values).find("every rank entered it"),
            std::string::npos);
}

// Past the desync check's window, ranks at the same number in different
// calls wait for each other: the numbers agree, the calls do not.
TEST(ProgressExplanation, RanksAtTheSameNumberInDifferentCallsAreADesync) {
  std::vector<std::optional<std::string>> values = {
      std::string("300 all_reduce #300 Float[4] on shm (sum)"),
      std::string("300 broadcast #300 Float[4] on gloo (root 0)"),
      std::string("300 all_reduce #300 Float[4] on shm (sum)")};
  const std::string text = detail::explain_progress(300, 0, values);
  EXPECT_NE(text.find("every rank entered #300 but not the same call: ranks 0, 2 entered "
                      "all_reduce #300 Float[4] on shm (sum) but rank 1 entered broadcast #300 "
                      "Float[4] on gloo (root 0). A collective desync"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("transport itself stalled"), std::string::npos) << text;
  // The same operation with another shape, or another reduce op.
  values = {std::string("7 all_reduce #7 Float[1000] on shm (sum)"),
            std::string("7 all_reduce #7 Float[1001] on shm (sum)")};
  EXPECT_NE(detail::explain_progress(7, 1, values)
                .find("rank 0 entered all_reduce #7 Float[1000] on shm (sum) but rank 1 entered "
                      "all_reduce #7 Float[1001] on shm (sum)"),
            std::string::npos);
  values = {std::string("7 all_reduce #7 Float[4] on shm (sum)"),
            std::string("7 all_reduce #7 Float[4] on shm (max)")};
  EXPECT_NE(detail::explain_progress(7, 0, values).find("not the same call"), std::string::npos);
  // With a rank missing, the others' difference is still named.
  values = {std::string("7 barrier #7"), std::string("7 all_gather #7 Int[2] on shm"),
            std::string("5 barrier #5")};
  const std::string partial = detail::explain_progress(7, 0, values);
  EXPECT_NE(partial.find("rank 2 did not arrive (rank 2 last entered barrier #5); the ranks that "
                         "entered #7 are not in the same call: rank 0 entered barrier #7 but "
                         "rank 1 entered all_gather #7 Int[2] on shm"),
            std::string::npos)
      << partial;
}

// A rank that went on from collective #4 to a send is not in a different
// call of #4: it entered #4 and is past it.
TEST(ProgressExplanation, ASendAfterTheCollectiveIsNotADifferentCall) {
  std::vector<std::optional<std::string>> values = {
      std::string("4 all_reduce #4 Float[2] on shm (sum)"),
      std::string("p2p 5 send to rank 0, tag 1, Float[2] on shm")};
  EXPECT_NE(detail::explain_progress(4, 0, values).find("every rank entered it"),
            std::string::npos);
  // Before any collective, a send or recv is still where the rank is.
  values = {std::string("0 barrier #0"), std::string("p2p 0 recv from rank 0, tag 6, Float[3] on gloo")};
  EXPECT_EQ(detail::explain_progress(0, 0, values),
            "rank 1 did not arrive (rank 1 last entered recv from rank 0, tag 6, Float[3] on "
            "gloo)");
}

// End to end, past the window: rank 0 all-reduces while rank 1 broadcasts,
// both at #1. Each times out naming both calls.
TEST(Timeouts, RanksInDifferentCallsPastTheCheckedWindowAreNamedAsADesync) {
  Messages messages;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> waiting{2};
  auto options = short_timeout(/*shared_memory=*/true);
  options.desync_check_collectives = 1;  // #0 only
  run_ranks(
      2,
      [&](ProcessGroup& pg) {
        auto t = at::ones({4});
        pg.all_reduce(t);  // #0, checked
        try {
          if (pg.rank() == 0) {
            pg.all_reduce(t);
          } else {
            pg.broadcast(t, 0);
          }
          ADD_FAILURE() << "#1 completed on rank " << pg.rank();
        } catch (const TimeoutError& e) {
          messages.add(pg.rank(), e.what());
        }
        if (--waiting == 0) release.set_value();
        released.wait();
      },
      options);
  ASSERT_EQ(messages.by_rank.size(), 2u);
  for (const auto& [rank, message] : messages.by_rank) {
    EXPECT_NE(message.find("every rank entered #1 but not the same call: rank 0 entered "
                           "all_reduce #1 Float[4] on shm (sum) but rank 1 entered broadcast #1 "
                           "Float[4] on gloo (root 0). A collective desync"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
}

}  // namespace
}  // namespace tandem
