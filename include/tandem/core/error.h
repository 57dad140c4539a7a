#pragma once
// Error types and the TANDEM_CHECK family of macros.
//
// Library code reports every failure by throwing one of these types and never
// ends the process itself. Only the CLI maps them to exit codes (UsageError -> 2).

#include <stdexcept>
#include <string>
#include <type_traits>

#include <fmt/format.h>

namespace tandem {

// Base class of every error tandem throws. what() is the complete, formatted
// message, already prefixed with "[rank r/N]" when a rank is known.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message);
};

// Bad configuration, bad arguments or bad API usage: the user can fix it.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A collective, the store or the network failed.
class CommError : public Error {
 public:
  using Error::Error;
};

// A checkpoint or tensor file could not be written or read: an I/O error
// (disk full, permission), or a file that is truncated, corrupt or not in the
// expected format. The message names the file.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// A collective or rendezvous did not complete in time.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

namespace detail {

// Builds "[rank r/N] <message> (file:line)", or without " (file:line)"
// when `file` is null. Thread-safe.
std::string decorate_error(const std::string& message, const char* file, int line);

// True for the errors a user fixes from the message alone (bad input, a bad
// file): their messages carry no source location, which would only be noise.
template <typename E>
inline constexpr bool kUserFacingError =
    std::is_base_of_v<UsageError, E> || std::is_base_of_v<CheckpointError, E>;

template <typename E, typename... Args>
[[noreturn]] void throw_error(const char* file, int line, fmt::format_string<Args...> format,
                              Args&&... args) {
  throw E(decorate_error(fmt::format(format, std::forward<Args>(args)...),
                         kUserFacingError<E> ? nullptr : file, line));
}

}  // namespace detail
}  // namespace tandem

// Throws ErrorType with a formatted message, the rank and (for internal
// errors, not UsageError or CheckpointError) the call site.
#define TANDEM_THROW(ErrorType, ...) \
  ::tandem::detail::throw_error<ErrorType>(__FILE__, __LINE__, __VA_ARGS__)

// Throws tandem::Error when `cond` is false. The message says what happened
// and what to do; the macro adds the rank and the call site.
#define TANDEM_CHECK(cond, ...)                   \
  do {                                            \
    if (!(cond)) {                                \
      TANDEM_THROW(::tandem::Error, __VA_ARGS__); \
    }                                             \
  } while (false)

// Like TANDEM_CHECK, for mistakes the caller can fix (throws UsageError).
#define TANDEM_CHECK_ARG(cond, ...)                    \
  do {                                                 \
    if (!(cond)) {                                     \
      TANDEM_THROW(::tandem::UsageError, __VA_ARGS__); \
    }                                                  \
  } while (false)

// Throws tandem::CheckpointError when `cond` is false: a file's content is
// wrong or unsupported. Like TANDEM_CHECK_ARG, the message names the file
// and the fix, with no call site.
#define TANDEM_CHECK_FILE(cond, ...)                        \
  do {                                                      \
    if (!(cond)) {                                          \
      TANDEM_THROW(::tandem::CheckpointError, __VA_ARGS__); \
    }                                                       \
  } while (false)

// Throws tandem::Error printing both values when a != b.
#define TANDEM_CHECK_EQ(a, b, ...)                                                         \
  do {                                                                                     \
    const auto& tandem_a_ = (a);                                                           \
    const auto& tandem_b_ = (b);                                                           \
    if (!(tandem_a_ == tandem_b_)) {                                                       \
      TANDEM_THROW(::tandem::Error, "{} ({}) != {} ({}): {}", #a, tandem_a_, #b, tandem_b_, \
                   fmt::format(__VA_ARGS__));                                              \
    }                                                                                      \
  } while (false)
