#pragma once
// A job started on every host of a TestCluster at once, each host's
// `tandem launch` given its node rank (torchrun's static rendezvous):
//
//   std::string out = run_static_job(cluster, 2, "29651", {}, {bin("worker"), "arg"},
//                                    {"TANDEM_TIMEOUT_S=20"}, 60);

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "support/test_cluster.h"

namespace tandem::testing {

// Runs `nproc` ranks of `program` on each host (launcher options
// `launch_args` before it, `env` added to each launcher's environment with a
// shared store token), waits up to `timeout_s` per host, expects every host
// to exit 0, and returns every host's stdout and stderr, host by host.
// `host_prefix(node)`, when given, is argv put before that host's
// `tandem launch` (inside its namespace), such as a shell that mounts first.
inline std::string run_static_job(
    TestCluster& cluster, int nproc, const std::string& port,
    const std::vector<std::string>& launch_args, const std::vector<std::string>& program,
    std::vector<std::string> env, int timeout_s,
    const std::function<std::vector<std::string>(int)>& host_prefix = nullptr) {
  env.push_back("TANDEM_STORE_TOKEN=" + std::string(64, 's'));
  const int nnodes = cluster.size();
  std::vector<std::unique_ptr<BackgroundProcess>> nodes;
  for (int node = 0; node < nnodes; ++node) {
    std::vector<std::string> argv = {bin("tandem"),   "launch",
                                     "--nnodes",      std::to_string(nnodes),
                                     "--node-rank",   std::to_string(node),
                                     "--nproc-per-node", std::to_string(nproc),
                                     "--master-addr", cluster.address(0),
                                     "--master-port", port};
    argv.insert(argv.end(), launch_args.begin(), launch_args.end());
    argv.insert(argv.end(), program.begin(), program.end());
    if (host_prefix) {
      const std::vector<std::string> prefix = host_prefix(node);
      argv.insert(argv.begin(), prefix.begin(), prefix.end());
    }
    nodes.push_back(std::make_unique<BackgroundProcess>(cluster.on(node, argv), env));
  }
  std::string all;
  for (int node = 0; node < nnodes; ++node) {
    auto r = nodes[static_cast<std::size_t>(node)]->wait(timeout_s);
    EXPECT_EQ(r.exit_code, 0) << "host " << node << ": " << r.out << r.err;
    all += r.out + r.err;
  }
  return all;
}

}  // namespace tandem::testing
