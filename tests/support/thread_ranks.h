#pragma once
// Runs N ranks as threads in one process over an in-memory c10d::HashStore.
// The fastest way to test collective logic: no processes, no sockets to
// configure, and a failure on any rank fails the test with its message.

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "tandem/comm/process_group.h"

namespace tandem::testing {

// As run_ranks below, with each rank's options from options_for(rank): e.g.
// a host_id per rank, to play ranks on several hosts in one process.
inline void run_ranks_with_options(int world_size, const std::function<void(ProcessGroup&)>& fn,
                                   const std::function<ProcessGroupOptions(int)>& options_for) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mutex;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto options = options_for(rank);
        if (options.timeout == std::chrono::minutes(10)) options.timeout = std::chrono::seconds(30);
        auto pg = ProcessGroup::create(store, rank, world_size, options);
        fn(*pg);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

// Calls fn(pg) on `world_size` threads, each with its own ProcessGroup.
// Rethrows the first exception raised on any rank after all threads finish.
inline void run_ranks(int world_size, const std::function<void(ProcessGroup&)>& fn,
                      ProcessGroupOptions options = {}) {
  run_ranks_with_options(world_size, fn, [&](int) { return options; });
}

// Runs fn on `world_size` thread ranks and returns each rank's message of
// the E it threw ("" for a rank that threw none); any other exception is
// rethrown as by run_ranks.
template <typename E>
std::map<int, std::string> rank_errors(int world_size,
                                       const std::function<void(ProcessGroup&)>& fn,
                                       ProcessGroupOptions options = {}) {
  std::mutex mutex;
  std::map<int, std::string> messages;
  run_ranks(
      world_size,
      [&](ProcessGroup& pg) {
        std::string text;
        try {
          fn(pg);
        } catch (const E& e) {
          text = e.what();
        }
        std::lock_guard<std::mutex> lock(mutex);
        messages[pg.rank()] = text;
      },
      options);
  return messages;
}

}  // namespace tandem::testing
