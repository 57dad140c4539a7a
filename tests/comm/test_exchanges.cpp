// all_to_all (equal and uneven splits), gather and scatter at worlds 1-5, on
// both transports (shared memory, the default on one host, and Gloo), on the
// world group and on a subgroup, against a single-process reference: the
// blocks every rank should end up with, built from the same closed form.
//
// Element k of what group rank `src` sends group rank `dst` is
// exchange_value(src, dst, k): an integer in [-8, 8] that changes with src,
// dst and k, exact in every dtype, so a misplaced or stale block shows.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "comm/shm_transport.h"
#include "support/group_cases.h"
#include "support/thread_ranks.h"

namespace tandem {
namespace {

using testing::on_group;
using testing::run_ranks;

// Rows [begin, begin + rows) of the block src sends dst, `width` elements a
// row (0: a 1-D block).
at::Tensor exchange_block(int src, int dst, int64_t rows, int64_t width, at::ScalarType dtype) {
  const int64_t n = rows * std::max<int64_t>(width, 1);
  auto k = at::arange(n, at::kLong);
  auto block = k.add(5 * src + 3 * dst).remainder(17).sub(8).to(dtype);
  return width > 0 ? block.view({rows, width}) : block;
}

// Rows rank src sends rank dst in the uneven case: 0 to 3, zero for some
// pairs at every world size above 1; `extra` is added to every non-zero one.
int64_t uneven_rows(int src, int dst, int64_t extra) {
  const int64_t rows = (3 * src + 5 * dst + 1) % 4;
  return rows == 0 ? 0 : rows + extra;
}

// Runs fn(group, dtype) on every rank of the group under test.
class Exchanges : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {
 protected:
  void run(const std::function<void(ProcessGroup&, at::ScalarType)>& fn) {
    const auto [world, shared_memory, subgroup] = GetParam();
    ProcessGroupOptions options;
    options.shared_memory = shared_memory;
    run_ranks(
        world,
        [&, shared_memory = shared_memory](ProcessGroup& pg) {
          on_group(pg, subgroup, [&](ProcessGroup& group) {
            ASSERT_EQ(group.uses_shared_memory(), shared_memory && group.world_size() > 1);
            for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) fn(group, dtype);
          });
        },
        options);
  }
};

TEST_P(Exchanges, AllToAllWithEqualSplitsMatchesTheReference) {
  run([](ProcessGroup& group, at::ScalarType dtype) {
    const int world = group.world_size();
    const int me = group.rank();
    for (int64_t rows : {1, 7, 13}) {
      for (int64_t width : {0, 3}) {
        std::vector<at::Tensor> sent, expected;
        for (int r = 0; r < world; ++r) {
          sent.push_back(exchange_block(me, r, rows, width, dtype));
          expected.push_back(exchange_block(r, me, rows, width, dtype));
        }
        auto input = at::cat(sent);
        auto output = at::full_like(input, 99);
        const auto before = group.sequence_number();
        group.all_to_all(output, input);
        ASSERT_TRUE(at::equal(output, at::cat(expected)))
            << "rows " << rows << " width " << width << " " << c10::toString(dtype);
        if (world > 1) {
          ASSERT_EQ(group.sequence_number(), before + 1);
        }
      }
    }
  });
}

TEST_P(Exchanges, AllToAllWithUnevenSplitsIncludingEmptyOnesMatchesTheReference) {
  run([](ProcessGroup& group, at::ScalarType dtype) {
    const int world = group.world_size();
    const int me = group.rank();
    // extra 0: a few rows per pair; the large one spans several rounds of
    // the shared-memory transport (a round carries 1/world of a chunk per pair).
    const int64_t large =
        static_cast<int64_t>(detail::ShmTransport::kChunkBytes / world / c10::elementSize(dtype)) + 5;
    for (int64_t extra : {int64_t{0}, int64_t{12}, large}) {
      for (int64_t width : {0, 3}) {
        if (extra == large && width != 0) continue;
        std::vector<int64_t> input_splits, output_splits;
        std::vector<at::Tensor> sent, expected;
        for (int r = 0; r < world; ++r) {
          input_splits.push_back(uneven_rows(me, r, extra));
          output_splits.push_back(uneven_rows(r, me, extra));
          sent.push_back(exchange_block(me, r, input_splits.back(), width, dtype));
          expected.push_back(exchange_block(r, me, output_splits.back(), width, dtype));
        }
        auto input = at::cat(sent);
        auto want = at::cat(expected);
        auto output = at::full_like(want, 99);
        const auto before = group.sequence_number();
        group.all_to_all(output, input, output_splits, input_splits);
        ASSERT_TRUE(at::equal(output, want))
            << "extra " << extra << " width " << width << " " << c10::toString(dtype);
        if (world > 1) {
          ASSERT_EQ(group.sequence_number(), before + 1);
        }
      }
    }
  });
}

TEST_P(Exchanges, GatherAndScatterFromEveryRootMatchTheReference) {
  run([](ProcessGroup& group, at::ScalarType dtype) {
    const int world = group.world_size();
    const int me = group.rank();
    for (int root = 0; root < world; ++root) {
      for (int64_t n : {0, 7, 13}) {
        auto mine = exchange_block(me, root, n, 0, dtype);
        auto gathered = group.gather(mine, root);
        if (me == root) {
          ASSERT_EQ(static_cast<int>(gathered.size()), world);
          for (int r = 0; r < world; ++r) {
            ASSERT_TRUE(at::equal(gathered[static_cast<size_t>(r)],
                                  exchange_block(r, root, n, 0, dtype)))
                << "gather root " << root << " from " << r << " n " << n;
          }
        } else {
          ASSERT_TRUE(gathered.empty());
        }
        std::vector<at::Tensor> inputs;
        if (me == root) {
          for (int r = 0; r < world; ++r) inputs.push_back(exchange_block(root, r, n, 0, dtype));
        }
        auto output = at::full({n}, 99, at::TensorOptions().dtype(dtype));
        group.scatter(output, inputs, root);
        ASSERT_TRUE(at::equal(output, exchange_block(root, me, n, 0, dtype)))
            << "scatter root " << root << " n " << n;
      }
    }
    // Large enough for several rounds of the shared-memory transport.
    const int64_t n = static_cast<int64_t>(detail::ShmTransport::kChunkBytes /
                                           c10::elementSize(dtype) / world) * 2 + 3;
    auto gathered = group.gather(exchange_block(me, 0, n, 0, dtype), 0);
    for (size_t r = 0; r < gathered.size(); ++r) {
      ASSERT_TRUE(at::equal(gathered[r], exchange_block(static_cast<int>(r), 0, n, 0, dtype)));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsTransportsGroups, Exchanges,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return testing::group_case_name(std::get<0>(info.param),
                                                           std::get<1>(info.param),
                                                           std::get<2>(info.param));
                         });

}  // namespace
}  // namespace tandem
