#pragma once
// Error files: how a worker tells `tandem launch` why it failed.
//
// The launcher gives every worker a path in TANDEM_ERROR_FILE (and, for
// programs written against torchrun, the same path in
// TORCHELASTIC_ERROR_FILE). RankEnv::from_environment() installs a
// std::terminate handler that writes an uncaught exception there, as one
// JSON object, before the process aborts. Programs that catch exceptions in
// main() call record_error() themselves. The launcher reads the files of the
// failed ranks and names the earliest failure as the root cause.

#include <exception>
#include <optional>
#include <string>

namespace tandem {

struct RankEnv;

struct ErrorRecord {
  int rank = -1;
  int local_rank = -1;
  int restart_count = 0;
  std::string host;
  int pid = 0;
  std::string type;     // "tandem::TimeoutError", "std::runtime_error", ...
  std::string message;  // what()
  double time = 0;      // seconds since the Unix epoch
  // Filled in by the launcher, which sees how the process ended.
  int exit_code = -1;
  int signal = 0;
};

std::string to_json(const ErrorRecord& record);

// Reads an error file written by tandem, or by torchelastic's @record
// ({"message": {"message": ..., "extraInfo": {"timestamp": ...}}}).
// nullopt when the file is missing or unreadable.
std::optional<ErrorRecord> read_error_file(const std::string& path);

// Writes `error` to this process's error file, when the launcher asked for
// one; does nothing otherwise. Never throws.
void record_error(const std::exception& error);

namespace detail {

// Remembers `env`'s error file and rank, and installs the terminate handler
// (once per process). A no-op when env has no error file.
void install_error_file_handler(const RankEnv& env);

}  // namespace detail
}  // namespace tandem
