#include "comm/progress_monitor.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "tandem/core/logging.h"

namespace tandem::detail {
namespace {

constexpr const char* kJoined = "joined";
// Appended to the last report when the rank's process group is destroyed:
// the rank stopped taking part (its program ended, or threw past it).
constexpr const char* kLeft = " |left";
// Longer lists are cut, as rank_list() cuts ranks: a message must stay readable
// at 1000 ranks.
constexpr std::size_t kMaxNamed = 16;

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string text;
  for (std::size_t i = 0; i < parts.size() && i < kMaxNamed; ++i) {
    text += (i == 0 ? "" : separator) + parts[i];
  }
  if (parts.size() > kMaxNamed) text += fmt::format("{}...", separator);
  return text;
}

std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A published value, "@<unix ms> " and then what the rank reported.
struct Report {
  std::string body;               // "joined" or "<sequence> <description>"
  std::optional<std::int64_t> ms;  // when it was published; none in an unstamped value
  bool left = false;              // its process group was destroyed after it
};

Report read_report(const std::string& value) {
  Report report{value, std::nullopt};
  const std::string left = kLeft;
  if (report.body.size() >= left.size() &&
      report.body.compare(report.body.size() - left.size(), left.size(), left) == 0) {
    report.body.resize(report.body.size() - left.size());
    report.left = true;
  }
  if (report.body.empty() || report.body[0] != '@') return report;
  const auto space = report.body.find(' ');
  char* end = nullptr;
  const long long ms = std::strtoll(report.body.c_str() + 1, &end, 10);
  if (space == std::string::npos || end != report.body.c_str() + space) return report;
  report.ms = ms;
  report.body = report.body.substr(space + 1);
  return report;
}

// The report may be old (a rank frozen by SIGSTOP or a debugger publishes
// nothing more), so each note says when it was made: " (as of its last
// report, 12.3 s ago)".
std::string as_of(const Report& report, std::int64_t now_ms) {
  if (!report.ms) return " (as of its last report)";
  const double age_s = static_cast<double>(std::max<std::int64_t>(0, now_ms - *report.ms)) / 1000;
  return fmt::format(" (as of its last report, {:.1f} s ago)", age_s);
}

// What a report's body says: "joined", "<sequence> <collective>" or, for a
// send or recv, "p2p <collectives issued> <send or recv>".
struct ProgressEntry {
  bool entered = false;  // false for "joined" (or garbage)
  // The last collective the rank entered; none before its first.
  std::optional<std::uint64_t> collective;
  std::string what;  // what it last entered: that collective, or the send/recv
  bool point_to_point = false;
};

ProgressEntry parse_entry(const std::string& body) {
  ProgressEntry entry;
  const char* text = body.c_str();
  constexpr const char* kPointToPoint = "p2p ";
  entry.point_to_point = body.rfind(kPointToPoint, 0) == 0;
  if (entry.point_to_point) text += std::strlen(kPointToPoint);
  char* end = nullptr;
  const std::uint64_t number = std::strtoull(text, &end, 10);
  if (end == text || *end != ' ') return {};
  entry.entered = true;
  entry.what = std::string(end + 1);
  if (!entry.point_to_point) {
    entry.collective = number;
  } else if (number > 0) {
    entry.collective = number - 1;  // issued `number` collectives: entered #number-1
  }
  return entry;
}

// What rank `global`'s report says of where it was.
std::string describe_report(int global, const Report& report, std::int64_t now_ms) {
  const ProgressEntry entry = parse_entry(report.body);
  // A rank that left says no more, so its note needs no age.
  const char* left = " and then left the group: its process group was destroyed (the program "
                     "ended, or an exception ended its training)";
  if (!entry.entered) {
    if (report.left) return fmt::format("rank {} entered no collective{}", global, left);
    return fmt::format("rank {} had entered no collective{}", global, as_of(report, now_ms));
  }
  if (report.left) return fmt::format("rank {} last entered {}{}", global, entry.what, left);
  return fmt::format("rank {} last entered {}{}", global, entry.what,
                     report.ms ? as_of(report, now_ms) : "");
}

}  // namespace

std::string progress_key(int rank) { return "tandem/progress/" + std::to_string(rank); }

ProgressMonitor::ProgressMonitor(compat::StorePtr store, int rank, int world_size,
                                 std::chrono::milliseconds interval, GroupRanks group)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      interval_(interval),
      group_(std::move(group)) {
  latest_ = kJoined;
  dirty_ = true;
  publish_latest();
  publisher_ = std::thread([this] { publish_loop(); });
}

ProgressMonitor::~ProgressMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    // The last word: where this rank was when it left, so a rank still
    // waiting for it says so instead of quoting an older report.
    latest_ += kLeft;
    dirty_ = true;
  }
  wake_.notify_all();
  publisher_.join();
  publish_latest();
}

void ProgressMonitor::entered(std::uint64_t sequence, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  latest_.assign(std::to_string(sequence)).append(" ").append(what);
  dirty_ = true;
}

void ProgressMonitor::entered_point_to_point(std::uint64_t next_sequence,
                                             const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  latest_.assign("p2p ").append(std::to_string(next_sequence)).append(" ").append(what);
  dirty_ = true;
}

void ProgressMonitor::publish_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, interval_, [&] { return stopping_; });
    if (stopping_) break;
    if (!dirty_) continue;
    lock.unlock();
    publish_latest();
    lock.lock();
  }
}

void ProgressMonitor::publish_latest() {
  std::lock_guard<std::mutex> order(publish_mutex_);
  std::string value;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!dirty_) return;
    value = fmt::format("@{} {}", unix_ms_now(), latest_);
    dirty_ = false;
  }
  try {
    store_->set(progress_key(rank_), std::vector<std::uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    // Progress is diagnostic only: a store that went away must not fail
    // training here; the collective that needs it will report the failure.
    log_debug("could not publish progress to the store: {}", e.what());
  }
}

std::string ProgressMonitor::explain_timeout(std::uint64_t sequence) {
  publish_latest();  // others timing out now should see where this rank is
  std::vector<std::optional<std::string>> values(static_cast<std::size_t>(world_size_));
  try {
    for (int r = 0; r < world_size_; ++r) {
      const std::string key = progress_key(r);
      if (!store_->check({key})) continue;
      auto bytes = store_->get(key);
      values[static_cast<std::size_t>(r)] = std::string(bytes.begin(), bytes.end());
    }
  } catch (const std::exception& e) {
    std::string reason = e.what();
    reason.resize(std::min(reason.find('\n'), reason.size()));
    return fmt::format("the ranks' progress could not be read from the store ({})", reason);
  }
  return explain_progress(sequence, rank_, values, group_);
}

std::string ProgressMonitor::explain_peer(int peer) {
  publish_latest();
  const int global = group_.global(peer);
  try {
    const std::string key = progress_key(peer);
    if (!store_->check({key})) return fmt::format("rank {} never reported", global);
    auto bytes = store_->get(key);
    return describe_report(global, read_report(std::string(bytes.begin(), bytes.end())),
                           unix_ms_now());
  } catch (const std::exception& e) {
    std::string reason = e.what();
    reason.resize(std::min(reason.find('\n'), reason.size()));
    return fmt::format("rank {}'s progress could not be read from the store ({})", global, reason);
  }
}

std::string explain_progress(std::uint64_t sequence, int self,
                             const std::vector<std::optional<std::string>>& values,
                             const GroupRanks& group, std::int64_t now_unix_ms) {
  if (now_unix_ms == 0) now_unix_ms = unix_ms_now();
  std::vector<int> missing;
  std::vector<int> ahead;
  std::vector<std::string> missing_notes;
  std::vector<std::string> ahead_notes;
  // The ranks in collective `sequence` (this one too), grouped by the call
  // they entered: past the desync check's window, two ranks at the same
  // number in different calls wait for each other until the timeout.
  std::vector<std::string> calls;
  std::vector<std::vector<int>> callers;
  for (int r = 0; r < static_cast<int>(values.size()); ++r) {
    const auto& value = values[static_cast<std::size_t>(r)];
    const int global = group.global(r);  // notes name the rank its own log shows
    if (!value) {
      if (r == self) continue;
      missing.push_back(r);
      missing_notes.push_back(fmt::format("rank {} never reported", global));
      continue;
    }
    const Report report = read_report(*value);
    const ProgressEntry entry = parse_entry(report.body);
    if (entry.collective && *entry.collective == sequence && !entry.point_to_point) {
      auto it = std::find(calls.begin(), calls.end(), entry.what);
      if (it == calls.end()) {
        calls.push_back(entry.what);
        callers.emplace_back();
        it = calls.end() - 1;
      }
      callers[static_cast<std::size_t>(it - calls.begin())].push_back(r);
    }
    if (r == self) continue;
    if (!entry.collective || *entry.collective < sequence) {
      missing.push_back(r);
      missing_notes.push_back(describe_report(global, report, now_unix_ms));
    } else if (*entry.collective > sequence) {
      ahead.push_back(r);
      ahead_notes.push_back(describe_report(global, report, now_unix_ms));
    }
  }
  std::string text;
  if (!missing.empty()) {
    text = fmt::format("{} did not arrive ({})", group.name(missing), join(missing_notes, "; "));
  }
  if (!ahead.empty()) {
    text += fmt::format(
        "{}{} {} already past it ({}): the ranks issued different collectives; "
        "TANDEM_DEBUG=DETAIL checks every collective and names the first difference",
        text.empty() ? "" : "; ", group.name(ahead), ahead.size() == 1 ? "is" : "are",
        join(ahead_notes, "; "));
  }
  if (calls.size() > 1) {
    std::string who;
    for (std::size_t i = 0; i < calls.size() && i < kMaxNamed; ++i) {
      who += fmt::format("{}{} entered {}", i == 0 ? "" : (i == 1 ? " but " : " and "),
                         group.name(callers[i]), calls[i]);
    }
    text += fmt::format(
        "{} #{} {}: {}. A collective desync: every rank must issue the same collectives in the "
        "same order, with the same dtypes, shapes, reduce ops and roots. Only the first "
        "collectives are checked (ProcessGroupOptions::desync_check_collectives); "
        "TANDEM_DEBUG=DETAIL checks every collective and names the first difference",
        text.empty() ? "every rank entered" : "; the ranks that entered", sequence,
        text.empty() ? "but not the same call" : "are not in the same call", who);
  }
  if (text.empty()) {
    text = "every rank entered it, so the transport itself stalled (or a rank arrived only "
           "at the last moment)";
  }
  return text;
}

}  // namespace tandem::detail
