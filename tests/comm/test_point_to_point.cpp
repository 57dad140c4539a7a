// send/recv and their async forms at worlds 1-5, on the world group and on a
// subgroup, against the tensor the sender sent; ordering of messages on one
// tag and across tags; mismatched sizes; a timeout that names the peer; on
// both transports (shared memory within a host, Gloo).
// A rank that must "hang" waits on a future the test releases; no sleeps.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>

#include <ATen/ATen.h>

#include "support/group_cases.h"
#include "support/thread_ranks.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::on_group;
using testing::run_ranks;

// What group rank `src` sends with `tag`: n elements, distinct per sender,
// tag and element.
at::Tensor p2p_message(int src, int tag, int64_t n, at::ScalarType dtype = at::kFloat) {
  return at::arange(n, at::kLong).mul(3).add(100 * src + 10 * tag).remainder(251).to(dtype);
}

// (world, shared memory, subgroup). With shared memory on, point to point
// goes through the shared-memory mailbox (all ranks share a host here);
// with it off, through Gloo.
class PointToPoint : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {
 protected:
  void run(const std::function<void(ProcessGroup&)>& fn) {
    const auto [world, shared_memory, subgroup] = GetParam();
    ProcessGroupOptions options;
    options.shared_memory = shared_memory;
    run_ranks(world, [&, subgroup = subgroup](ProcessGroup& pg) { on_group(pg, subgroup, fn); },
              options);
  }
};

TEST_P(PointToPoint, ARingOfSendsAndRecvsDeliversEachSendersTensor) {
  run([](ProcessGroup& group) {
    const int world = group.world_size();
    const int me = group.rank();
    if (world == 1) {
      auto t = at::ones({3});
      EXPECT_THROW(group.send(t, 0), UsageError);  // itself: the only peer there is
      return;
    }
    const int next = (me + 1) % world;
    const int prev = (me + world - 1) % world;
    const auto before = group.sequence_number();
    for (int64_t n : {0, 1, 7, 13, (1 << 20) + 3}) {
      for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
        // Synchronous: even ranks send first, odd ones receive first.
        auto got = at::full({n}, -1, at::TensorOptions().dtype(dtype));
        if (me % 2 == 0) {
          group.send(p2p_message(me, 0, n, dtype), next);
          group.recv(got, prev);
        } else {
          group.recv(got, prev);
          group.send(p2p_message(me, 0, n, dtype), next);
        }
        ASSERT_TRUE(at::equal(got, p2p_message(prev, 0, n, dtype))) << "n " << n;
        // Asynchronous: every rank posts its recv, then sends.
        auto got_async = at::full({n}, -1, at::TensorOptions().dtype(dtype));
        Work receiving = group.recv_async(got_async, prev, 3);
        Work sending = group.send_async(p2p_message(me, 3, n, dtype), next, 3);
        sending.wait();
        receiving.wait();
        ASSERT_TRUE(at::equal(got_async, p2p_message(prev, 3, n, dtype))) << "n " << n;
      }
    }
    EXPECT_EQ(group.sequence_number(), before);  // not collectives: not counted
  });
}

TEST_P(PointToPoint, MessagesOnOneTagArriveInOrderAndTagsAreSeparate) {
  run([](ProcessGroup& group) {
    if (group.world_size() < 2) return;
    const int last = group.world_size() - 1;
    if (group.rank() == 0) {
      std::vector<Work> sends;
      sends.push_back(group.send_async(p2p_message(0, 1, 13), last, 1));  // tag 1 first
      for (int64_t n : {7, 1, 13}) sends.push_back(group.send_async(p2p_message(0, 0, n), last));
      for (auto& w : sends) w.wait();
    } else if (group.rank() == last) {
      // Every recv of tag 0 is posted before any completes, and waited for
      // last to first; tag 1, sent first, is received last.
      std::vector<at::Tensor> got = {at::empty({7}), at::empty({1}), at::empty({13})};
      std::vector<Work> recvs;
      for (auto& t : got) recvs.push_back(group.recv_async(t, 0));
      for (auto it = recvs.rbegin(); it != recvs.rend(); ++it) it->wait();
      for (auto& t : got) ASSERT_TRUE(at::equal(t, p2p_message(0, 0, t.numel())));
      auto tagged = at::empty({13});
      group.recv(tagged, 0, 1);
      ASSERT_TRUE(at::equal(tagged, p2p_message(0, 1, 13)));
    }
  });
}

TEST_P(PointToPoint, AMismatchedRecvNamesBothSidesAndTheChannelStaysUsable) {
  run([](ProcessGroup& group) {
    if (group.world_size() < 2) return;
    const int last = group.world_size() - 1;
    const std::string sender = "rank " + std::to_string(group.global_ranks()[0]);
    if (group.rank() == 0) {
      group.send(p2p_message(0, 0, 13), last);
      group.send(p2p_message(0, 0, 7, at::kDouble), last);
      group.send(p2p_message(0, 0, 7), last);
    } else if (group.rank() == last) {
      auto small = at::empty({7});
      try {
        group.recv(small, 0);
        ADD_FAILURE() << "a recv of 7 elements took a message of 13";
      } catch (const UsageError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("sent 13 element(s) of Float but this rank receives 7 "
                               "element(s) of Float"),
                  std::string::npos)
            << message;
        EXPECT_NE(message.find("recv from " + sender), std::string::npos) << message;
      }
      EXPECT_THROW(group.recv(small, 0), UsageError);  // Double sent, Float expected
      group.recv(small, 0);
      EXPECT_TRUE(at::equal(small, p2p_message(0, 0, 7)));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsTransportsGroups, PointToPoint,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return testing::group_case_name(std::get<0>(info.param),
                                                           std::get<1>(info.param),
                                                           std::get<2>(info.param));
                         });

class PointToPointTimeout : public ::testing::TestWithParam<bool> {};

TEST_P(PointToPointTimeout, ARecvNamesThePeerAndWhereItLastWas) {
  ProcessGroupOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  options.progress_interval = std::chrono::milliseconds(100);
  options.shared_memory = GetParam();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::string message;
  run_ranks(
      2,
      [&](ProcessGroup& pg) {
        pg.barrier();  // #0
        if (pg.rank() == 1) {
          released.wait();  // never sends, stays connected
          return;
        }
        auto t = at::empty({4});
        try {
          pg.recv(t, 1, 5);
          ADD_FAILURE() << "recv completed without a send";
        } catch (const TimeoutError& e) {
          message = e.what();
        }
        release.set_value();
      },
      options);
  const std::string transport = GetParam() ? "shm" : "gloo";
  EXPECT_NE(message.find("recv from rank 1, tag 5, Float[4] on " + transport +
                         " timed out after 1500 ms: rank 1 last entered barrier #0"),
            std::string::npos)
      << message;
}

// Before any collective: each rank waits in a recv from the other, on
// different tags, and each one's timeout says where the other waits.
TEST_P(PointToPointTimeout, BeforeAnyCollectiveTheTimeoutNamesThePeersRecvAndTag) {
  ProcessGroupOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  options.progress_interval = std::chrono::milliseconds(100);
  options.shared_memory = GetParam();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> waiting{2};
  std::mutex mutex;
  std::map<int, std::string> messages;
  run_ranks(
      2,
      [&](ProcessGroup& pg) {
        auto t = at::empty({3});
        try {
          pg.recv(t, 1 - pg.rank(), 5 + pg.rank());
          ADD_FAILURE() << "recv completed without a send";
        } catch (const TimeoutError& e) {
          std::lock_guard<std::mutex> lock(mutex);
          messages[pg.rank()] = e.what();
        }
        // Stay connected until both have their error.
        if (--waiting == 0) release.set_value();
        released.wait();
      },
      options);
  const std::string transport = GetParam() ? "shm" : "gloo";
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_NE(messages[0].find("recv from rank 1, tag 5, Float[3] on " + transport +
                             " timed out after 1500 ms: rank 1 last entered recv from rank 0, "
                             "tag 6, Float[3] on " + transport),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[1].find("rank 0 last entered recv from rank 1, tag 5"), std::string::npos)
      << messages[1];
}

INSTANTIATE_TEST_SUITE_P(Transports, PointToPointTimeout, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "gloo"; });

// Within a host, messages go through shared memory; the channels' segments
// are unlinked once both ends have mapped them, so none is left behind.
TEST(PointToPointShm, MessagesLargerThanTheRingArriveAndNoSegmentIsLeftInDevShm) {
  const std::string mine = "tandem-" + std::to_string(::getpid()) + "-";
  auto leftover = [&] {
    int count = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
      count += entry.path().filename().string().rfind(mine, 0) == 0 ? 1 : 0;
    }
    return count;
  };
  run_ranks(3, [](ProcessGroup& pg) {
    // 3 MiB of floats: more than one ring's worth, on two tags at once.
    const int64_t n = (3 << 20) / 4 + 5;
    const int next = (pg.rank() + 1) % 3;
    const int prev = (pg.rank() + 2) % 3;
    std::vector<Work> sends;
    for (int tag : {0, 9}) sends.push_back(pg.send_async(p2p_message(pg.rank(), tag, n), next, tag));
    for (int tag : {9, 0}) {
      auto got = at::empty({n});
      pg.recv(got, prev, tag);
      ASSERT_TRUE(at::equal(got, p2p_message(prev, tag, n))) << "tag " << tag;
    }
    for (auto& w : sends) w.wait();
  });
  EXPECT_EQ(leftover(), 0);
}

}  // namespace
}  // namespace tandem
