// A multi-rank smoke run: every rank joins the group, checks an all-reduce
// and an all-gather, and rank 0 prints a one-line verdict.
//
//   tandem launch --nproc-per-node 2 build/bin/smoke

#include <unistd.h>

#include <ATen/ATen.h>

#include "tandem/tandem.h"

int main() {
  try {
    auto env = tandem::RankEnv::from_environment();
    auto pg = tandem::ProcessGroup::init(env);
    const int world = pg->world_size();

    auto ones = at::full({1 << 16}, static_cast<float>(pg->rank() + 1));
    pg->all_reduce(ones);
    const float want = world * (world + 1) / 2.0f;
    TANDEM_CHECK(ones.eq(want).all().item<bool>(), "all_reduce gave {}, expected {}",
                 ones[0].item<float>(), want);

    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    auto hosts = pg->all_gather_strings(host);
    pg->barrier();
    tandem::print_main("tandem smoke: {} rank(s) OK on {} (all_reduce sum={}, backend {}, "
                       "LibTorch {})",
                       world, hosts.front(), want, pg->backend_name(), tandem::torch_version());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smoke: %s\n", e.what());
    return 1;
  }
}
