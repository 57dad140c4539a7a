#pragma once
// What the data layer's worker pools (BatchWorkers, StreamWorkers) share:
// stopping and joining their threads, and the text of a worker's error.

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem::detail {

// Sets `stop` under `mutex`, wakes every waiter on `changed` and joins
// `threads`. The pool's threads must leave their loop once they see `stop`.
inline void stop_and_join(std::mutex& mutex, bool& stop, std::condition_variable& changed,
                          std::vector<std::thread>& threads) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stop = true;
  }
  changed.notify_all();
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
}

// what() of the exception `error` holds, without a final full stop (the
// loaders quote it inside a sentence of their own), or a placeholder for one
// that is not a std::exception.
inline std::string exception_message(const std::exception_ptr& error) {
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception that is not a std::exception";
  }
  while (!what.empty() && (what.back() == '.' || what.back() == '\n')) what.pop_back();
  return what;
}

}  // namespace tandem::detail
