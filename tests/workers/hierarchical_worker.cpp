// A worker program for the multi-host hierarchical collectives test.
// Usage: hierarchical_test_worker FORM, FORM being the hierarchical form this
// rank's world group must take ("split", "leader", or "none" for the flat
// path). Joins the world, checks that form, then all_reduce (sum, max),
// reduce_scatter (sum) and all_gather_into against closed forms at sizes 1,
// 7 and one past the shared-memory chunk per rank, and prints
// "rank R/N hierarchical=FORM checks ok" (exit 0) or what differed (exit 1).

#include <cstdio>
#include <string>

#include <ATen/ATen.h>

#include "tandem/tandem.h"

// One of the programs in tandem_test_workers (workers/main.cpp picks it by
// the name it runs under).
namespace hierarchical_test_worker {

namespace {

// Rank r's element i: (r + 1) * (i % 5 + 1), small integers exact in float.
at::Tensor values(int rank, int64_t n) {
  return at::arange(n, at::kLong).remainder(5).add(1).mul(rank + 1).to(at::kFloat);
}

// Returns a description of the first wrong result, or "".
std::string check(tandem::ProcessGroup& pg, int64_t n) {
  const int r = pg.rank();
  const int w = pg.world_size();
  const auto base = at::arange(n, at::kLong).remainder(5).add(1).to(at::kFloat);

  auto sum = values(r, n);
  pg.all_reduce(sum);
  if (!at::equal(sum, base.mul(w * (w + 1) / 2))) return "all_reduce sum";

  auto most = values(r, n).to(at::kLong);
  pg.all_reduce(most, tandem::ReduceOp::kMax);
  if (!at::equal(most, base.mul(w).to(at::kLong))) return "all_reduce max";

  auto shard = at::empty({n}, at::kFloat);
  pg.reduce_scatter(shard, values(r, n * w), tandem::ReduceOp::kSum);
  auto whole = at::arange(n * w, at::kLong).remainder(5).add(1).to(at::kFloat);
  if (!at::equal(shard, whole.narrow(0, r * n, n).mul(w * (w + 1) / 2))) return "reduce_scatter";

  auto gathered = at::empty({w * n}, at::kFloat);
  pg.all_gather_into(gathered, values(r, n));
  for (int k = 0; k < w; ++k) {
    if (!at::equal(gathered.narrow(0, k * n, n), values(k, n))) {
      return "all_gather_into entry " + std::to_string(k);
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: hierarchical_test_worker split|leader|none\n");
    return 2;
  }
  try {
    auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment());
    const std::string form = pg->uses_hierarchical() ? pg->hierarchical_form() : "none";
    std::string wrong = form == argv[1] ? "" : "the form is " + form + ", expected " + argv[1];
    // One past the 4 MiB shared-memory chunk per rank, so rounds repeat.
    // Every rank runs every check (the same collectives), keeping the first failure.
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{(4 << 20) / 4 + 3}}) {
      const std::string failed = check(*pg, n);
      if (wrong.empty() && !failed.empty()) wrong = failed + " (n=" + std::to_string(n) + ")";
    }
    pg->barrier();
    std::printf("rank %d/%d hierarchical=%s checks %s\n", pg->rank(), pg->world_size(),
                form.c_str(), wrong.empty() ? "ok" : ("WRONG: " + wrong).c_str());
    return wrong.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hierarchical_test_worker: %s\n", e.what());
    return 1;
  }
}

}  // namespace hierarchical_test_worker
