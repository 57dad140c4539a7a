#include "tandem/core/logging.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "tandem/core/error.h"

namespace tandem {
namespace {

struct RankLabel {
  int rank = -1;
  int world_size = 0;
};

std::mutex& output_mutex() {
  static std::mutex m;
  return m;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{[] {
    const char* env = std::getenv("TANDEM_LOG_LEVEL");
    if (env == nullptr || *env == '\0') return static_cast<int>(LogLevel::kInfo);
    try {
      return static_cast<int>(parse_log_level(env));
    } catch (const Error&) {
      std::fprintf(stderr, "tandem: ignoring TANDEM_LOG_LEVEL=%s (use debug, info, warn, error or off)\n", env);
      return static_cast<int>(LogLevel::kInfo);
    }
  }()};
  return level;
}

RankLabel process_label;
std::mutex process_label_mutex;
thread_local RankLabel thread_label;

RankLabel current_label() {
  if (thread_label.rank >= 0) return thread_label;
  std::lock_guard<std::mutex> lock(process_label_mutex);
  return process_label;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warning";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "?";
}

}  // namespace

LogLevel parse_log_level(const std::string& text) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "debug") return LogLevel::kDebug;
  if (t == "info") return LogLevel::kInfo;
  if (t == "warn" || t == "warning") return LogLevel::kWarn;
  if (t == "error") return LogLevel::kError;
  if (t == "off" || t == "none") return LogLevel::kOff;
  throw UsageError(fmt::format("unknown log level '{}': use debug, info, warn, error or off", text));
}

LogLevel log_level() { return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed)); }

void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }

void set_process_rank_label(int rank, int world_size) {
  std::lock_guard<std::mutex> lock(process_label_mutex);
  process_label = RankLabel{rank, world_size};
}

void set_thread_rank_label(int rank, int world_size) { thread_label = RankLabel{rank, world_size}; }

void clear_thread_rank_label() { thread_label = RankLabel{}; }

std::pair<int, int> thread_rank_label() { return {thread_label.rank, thread_label.world_size}; }

std::string rank_prefix() {
  RankLabel label = current_label();
  if (label.rank < 0) return "";
  return fmt::format("[rank {}/{}] ", label.rank, label.world_size);
}

bool is_main_process_label() { return current_label().rank <= 0; }

void log_line(LogLevel level, const std::string& message) {
  std::string line = fmt::format("{}tandem {}: {}\n", rank_prefix(), level_name(level), message);
  std::lock_guard<std::mutex> lock(output_mutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void print_main_line(const std::string& message) {
  std::lock_guard<std::mutex> lock(output_mutex());
  std::fwrite(message.data(), 1, message.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace tandem
