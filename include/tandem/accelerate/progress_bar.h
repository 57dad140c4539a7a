#pragma once
// A progress bar for training loops, drawn on stderr.
//
// On a terminal it redraws one line in place (at most ~10 times a second);
// when stderr is a file or a pipe it prints a plain line at every tenth of
// the way instead (past the total too: 110%, 120%, ...), so logs stay
// readable. A total of 0 means unknown: the line shows the count and rate
// without a percentage ("train: 37 [00:05, 7.20 it/s]"), and a log gets a
// line at counts 1, 2, 5, 10, 20, 50, 100, ... A disabled bar (every rank
// but the local main one, see Accelerator::progress_bar) does nothing at
// all.
//
// Not thread-safe: update it from the training thread.

#include <chrono>
#include <cstdint>
#include <string>

namespace tandem {

class ProgressBar {
 public:
  // `total` <= 0: unknown.
  ProgressBar(int64_t total, std::string description, bool enabled);
  // Finishes the line if anything was drawn.
  ~ProgressBar();
  ProgressBar(ProgressBar&&) noexcept;
  ProgressBar& operator=(ProgressBar&&) = delete;
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Advances by `n` and shows `postfix` (e.g. "loss 0.12 | 5.1k tok/s").
  void update(int64_t n = 1, const std::string& postfix = "");
  // Ends the line; later updates do nothing.
  void close();

  int64_t count() const { return count_; }
  bool enabled() const { return enabled_; }

 private:
  void draw(bool force);
  int64_t log_mark() const;

  int64_t total_;
  std::string description_;
  bool enabled_;
  bool tty_ = false;
  bool open_ = true;
  bool drawn_ = false;
  int64_t count_ = 0;
  int64_t last_mark_ = -1;
  int64_t drawn_count_ = -1;
  std::string postfix_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace tandem
