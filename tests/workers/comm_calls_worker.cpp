// A worker program for the multi-host test of subgroups, the mesh, point to
// point and the exchanges (tests/multinode/test_comm_calls_hosts.cpp). Joins
// the world through `tandem launch`, runs each call on a job that spans
// hosts, checks every result against a closed form, and prints
// "rank R/N comm calls ok" (exit 0) or the first call that differed (exit 1).
// Every rank runs every call, so one wrong result never leaves a peer
// waiting.

#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "tandem/tandem.h"

// One of the programs in tandem_test_workers (workers/main.cpp picks it by
// the name it runs under).
namespace comm_calls_worker {

namespace {

// What rank `src` sends rank `dst` with `tag`: n small integers, exact in
// float, distinct per (src, dst, tag).
at::Tensor message(int src, int dst, int tag, int64_t n) {
  return at::arange(n, at::kLong).mul(7).add(100 * src + 10 * dst + tag).remainder(997).to(at::kFloat);
}

struct Checks {
  std::string first_wrong;
  void expect(bool ok, const std::string& what) {
    if (!ok && first_wrong.empty()) first_wrong = what;
  }
};

// A ring of sends and recvs: to the next rank, from the previous one, at
// sizes below and above the shared-memory channel's ring, sync and async.
void point_to_point(tandem::ProcessGroup& pg, Checks& checks) {
  const int w = pg.world_size();
  const int r = pg.rank();
  const int next = (r + 1) % w;
  const int prev = (r + w - 1) % w;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{(3 << 20) / 4 + 1}}) {
    auto got = at::empty({n});
    tandem::Work receiving = pg.recv_async(got, prev, 2);
    pg.send(message(r, next, 2, n), next, 2);
    receiving.wait();
    checks.expect(at::equal(got, message(prev, r, 2, n)), "send/recv n=" + std::to_string(n));
  }
}

// Equal and uneven all_to_all: rank s sends rank d (s + d) % 3 + 1 rows of 2.
void exchanges(tandem::ProcessGroup& pg, Checks& checks) {
  const int w = pg.world_size();
  const int r = pg.rank();
  auto rows = [](int s, int d) { return int64_t{(s + d) % 3 + 1}; };
  std::vector<at::Tensor> sent, expected;
  std::vector<int64_t> in_splits, out_splits;
  for (int d = 0; d < w; ++d) {
    sent.push_back(message(r, d, 5, rows(r, d) * 2).view({rows(r, d), 2}));
    expected.push_back(message(d, r, 5, rows(d, r) * 2).view({rows(d, r), 2}));
    in_splits.push_back(rows(r, d));
    out_splits.push_back(rows(d, r));
  }
  auto input = at::cat(sent);
  auto want = at::cat(expected);
  auto output = at::empty_like(want);
  pg.all_to_all(output, input, out_splits, in_splits);
  checks.expect(at::equal(output, want), "all_to_all (uneven)");

  std::vector<at::Tensor> blocks, expected_blocks;
  for (int d = 0; d < w; ++d) {
    blocks.push_back(message(r, d, 6, 5));
    expected_blocks.push_back(message(d, r, 6, 5));
  }
  auto equal_out = at::empty({5 * w});
  pg.all_to_all(equal_out, at::cat(blocks));
  checks.expect(at::equal(equal_out, at::cat(expected_blocks)), "all_to_all (equal)");

  const int root = w - 1;
  auto gathered = pg.gather(message(r, root, 7, 9), root);
  if (r == root) {
    bool ok = static_cast<int>(gathered.size()) == w;
    for (int s = 0; ok && s < w; ++s) ok = at::equal(gathered[s], message(s, root, 7, 9));
    checks.expect(ok, "gather");
  }
  std::vector<at::Tensor> pieces;
  if (r == root) {
    for (int d = 0; d < w; ++d) pieces.push_back(message(root, d, 8, 9));
  }
  auto piece = at::empty({9});
  pg.scatter(piece, pieces, root);
  checks.expect(at::equal(piece, message(root, r, 8, 9)), "scatter");
}

// A subgroup of the first and last rank (on different hosts) and the mesh's
// groups, each with an all-reduce whose sum has a closed form.
void groups(const std::shared_ptr<tandem::ProcessGroup>& pg, Checks& checks) {
  const int w = pg->world_size();
  const int r = pg->rank();
  auto ends = pg->new_group({0, w - 1});
  if (ends->is_member()) {
    auto t = at::full({3}, static_cast<double>(r + 1));
    ends->all_reduce(t);
    checks.expect(at::equal(t, at::full({3}, static_cast<double>(w + 1))), "new_group all_reduce");
    point_to_point(*ends, checks);
  }
  tandem::ProcessMesh mesh(pg);
  auto local = mesh.group("local");
  auto across = mesh.group("host");
  auto t = at::full({5}, static_cast<double>(r));
  local->all_reduce(t);
  // The host's ranks are consecutive: h * L .. h * L + L - 1.
  const int per_host = local->world_size();
  const int first = r / per_host * per_host;
  const double local_sum = per_host * first + per_host * (per_host - 1) / 2.0;
  checks.expect(at::equal(t, at::full({5}, local_sum)), "mesh local all_reduce");
  auto u = at::full({5}, static_cast<double>(r));
  across->all_reduce(u);
  const int hosts = across->world_size();
  const double across_sum = hosts * (r % per_host) + per_host * hosts * (hosts - 1) / 2.0;
  checks.expect(at::equal(u, at::full({5}, across_sum)), "mesh host all_reduce");
  exchanges(*across, checks);
}

}  // namespace

int main(int, char**) {
  try {
    auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment());
    Checks checks;
    point_to_point(*pg, checks);
    exchanges(*pg, checks);
    groups(pg, checks);
    pg->barrier();
    std::printf("rank %d/%d comm calls %s\n", pg->rank(), pg->world_size(),
                checks.first_wrong.empty() ? "ok" : ("WRONG: " + checks.first_wrong).c_str());
    return checks.first_wrong.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_calls_worker: %s\n", e.what());
    return 1;
  }
}

}  // namespace comm_calls_worker
