#include "tandem/accelerate/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace tandem {
namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{:02}:{:02}", s / 60, s % 60);
}

}  // namespace

ProgressBar::ProgressBar(int64_t total, std::string description, bool enabled)
    : total_(std::max<int64_t>(total, 0)), description_(std::move(description)), enabled_(enabled) {
  tty_ = enabled_ && ::isatty(STDERR_FILENO) == 1;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

ProgressBar::ProgressBar(ProgressBar&& other) noexcept
    : total_(other.total_),
      description_(std::move(other.description_)),
      enabled_(other.enabled_),
      tty_(other.tty_),
      open_(other.open_),
      drawn_(other.drawn_),
      count_(other.count_),
      last_mark_(other.last_mark_),
      drawn_count_(other.drawn_count_),
      postfix_(std::move(other.postfix_)),
      start_(other.start_),
      last_draw_(other.last_draw_) {
  other.enabled_ = false;
}

ProgressBar::~ProgressBar() { close(); }

void ProgressBar::update(int64_t n, const std::string& postfix) {
  if (!enabled_ || !open_) return;
  const int64_t before = count_;
  count_ += n;
  if (!postfix.empty()) postfix_ = postfix;
  // Reaching the total is drawn at once; going past it is not news.
  draw(total_ > 0 && before < total_ && count_ >= total_);
}

void ProgressBar::close() {
  if (!enabled_ || !open_) return;
  draw(true);
  if (tty_ && drawn_) std::fputc('\n', stderr);
  std::fflush(stderr);
  open_ = false;
}

// Which line a log (not a terminal) gets next: the tenth of the total the
// count is in (past the total too: 110%, 120%, ...); with an unknown total,
// the last of 1, 2, 5, 10, 20, 50, ... the count reached.
int64_t ProgressBar::log_mark() const {
  if (total_ > 0) return count_ * 10 / total_;
  int64_t mark = 0;
  for (int64_t step = 1; step <= count_ && step > 0; step *= 10) {
    for (int64_t m : {step, 2 * step, 5 * step}) {
      if (m <= count_) mark = m;
    }
  }
  return mark;
}

void ProgressBar::draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (!tty_) {
    // Logs: one line per mark, and a last one on close.
    const int64_t mark = log_mark();
    if (mark == last_mark_ && !(force && count_ != drawn_count_)) return;
    last_mark_ = mark;
  } else if (!force && now - last_draw_ < std::chrono::milliseconds(100)) {
    return;
  }
  last_draw_ = now;
  const double rate = elapsed > 0 ? static_cast<double>(count_) / elapsed : 0.0;
  const std::string timing =
      fmt::format("{:.2f} it/s]{}{}", rate, postfix_.empty() ? "" : " ", postfix_);
  const std::string label = description_ + (description_.empty() ? "" : ": ");
  std::string line;
  if (total_ == 0) {
    // An unknown total: the count and the rate, as tqdm without a total.
    line = fmt::format("{}{} [{}, {}", label, count_, format_duration(elapsed), timing);
  } else {
    const double fraction = static_cast<double>(count_) / static_cast<double>(total_);
    std::string eta = "?";
    if (rate > 0 && count_ <= total_) {
      eta = format_duration(static_cast<double>(total_ - count_) / rate);
    }
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(std::min(1.0, fraction) * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '-');
    line = fmt::format("{}{:3.0f}% [{}] {}/{} [{}<{}, {}", label, fraction * 100, bar, count_,
                       total_, format_duration(elapsed), eta, timing);
  }
  if (tty_) {
    std::fprintf(stderr, "\r%s\x1b[K", line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
  drawn_ = true;
  drawn_count_ = count_;
}

}  // namespace tandem
