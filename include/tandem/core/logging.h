#pragma once
// Rank-aware logging.
//
// Every line is prefixed with "[rank r/N] " once the rank is known. The level
// comes from TANDEM_LOG_LEVEL (debug, info, warn, error, off; default info),
// read once on first use, and can be changed with set_log_level().
// All functions are thread-safe; lines from different threads never interleave.

#include <string>
#include <utility>

#include <fmt/format.h>

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// Parses "debug", "info", "warn"/"warning", "error", "off" (any case).
// Throws UsageError naming the accepted values on anything else.
LogLevel parse_log_level(const std::string& text);

LogLevel log_level();
void set_log_level(LogLevel level);

// Sets the rank shown in log lines and error messages. The label is per
// thread when set_thread_rank_label is used (ranks-as-threads tests) and
// falls back to the process-wide label otherwise.
void set_process_rank_label(int rank, int world_size);
void set_thread_rank_label(int rank, int world_size);
void clear_thread_rank_label();
// The calling thread's own label as {rank, world_size}, {-1, 0} when it has
// none: a helper thread started by a rank thread sets it on itself, so its
// messages and errors carry that rank.
std::pair<int, int> thread_rank_label();

// "[rank r/N] ", or "" when no rank is known.
std::string rank_prefix();

// True on global rank 0, or when no rank is known.
bool is_main_process_label();

// Writes one line to stderr at `level`, with the rank prefix.
void log_line(LogLevel level, const std::string& message);

// Writes one line to stdout, with no prefix, on the main process only.
void print_main_line(const std::string& message);

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kDebug) log_line(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kInfo) log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kWarn) log_line(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kError) log_line(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}

// Prints on the main process (rank 0) only; a no-op on other ranks.
template <typename... Args>
void print_main(fmt::format_string<Args...> f, Args&&... args) {
  if (is_main_process_label()) print_main_line(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tandem
