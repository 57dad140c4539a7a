#include "launch/failure_report.h"

#include <csignal>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace tandem::cli {
namespace {

// Indents every line after the first, so a multi-line message stays
// readable under its worker.
std::string indent(const std::string& text, const std::string& prefix) {
  std::string out;
  for (char c : text) {
    out += c;
    if (c == '\n') out += prefix;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '\n')) out.pop_back();
  return out;
}

std::string describe_failure(const WorkerFailure& f) {
  std::string text = fmt::format("rank {} (pid {}", f.exit.global_rank, f.exit.pid);
  if (f.error && !f.error->host.empty()) text += ", host " + f.error->host;
  text += fmt::format(") {} after {:.2f} s", describe_exit(f.exit), f.exit.seconds);
  if (f.error && !f.error->message.empty()) {
    text += fmt::format("\n    {}: {}", f.error->type.empty() ? "error" : f.error->type,
                        indent(f.error->message, "    "));
  }
  return text;
}

}  // namespace

std::string describe_exit(const WorkerExit& exit) {
  if (exit.signal != 0) {
    const char* name = sigabbrev_np(exit.signal);
    return fmt::format("was killed by signal {} (SIG{})", exit.signal, name ? name : "?");
  }
  return fmt::format("exited with code {}", exit.exit_code);
}

std::string error_file_path(const std::string& attempt_dir, int rank) {
  return fmt::format("{}/rank_{}/error.json", attempt_dir, rank);
}

bool is_consequence(const WorkerFailure& failure) {
  if (failure.error) return failure.error->type == "tandem::CommError";
  return failure.exit.signal == SIGPIPE;
}

FailureReport make_failure_report(const GroupResult& result, const std::string& attempt_dir) {
  std::vector<WorkerFailure> all;
  for (const WorkerExit& exit : result.exits) {
    WorkerFailure f;
    f.exit = exit;
    f.error_file = error_file_path(attempt_dir, exit.global_rank);
    f.error = read_error_file(f.error_file);
    all.push_back(std::move(f));
  }
  // The root cause is the earliest failure, except that a consequence (a
  // CommError, "a peer went away", or SIGPIPE) comes after any other
  // failure. A worker the launcher stopped counts only if it reported an
  // error itself.
  auto rank_of = [](const WorkerFailure& f) {
    return std::make_pair(is_consequence(f) ? 1 : 0, f.time());
  };
  size_t root = all.size();
  for (size_t i = 0; i < all.size(); ++i) {
    const bool candidate = all[i].error || (all[i].exit.failed() && !all[i].exit.stopped);
    if (candidate && (root == all.size() || rank_of(all[i]) < rank_of(all[root]))) root = i;
  }
  if (root == all.size()) root = 0;  // nothing stands out: the first to end
  FailureReport report;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i == root) {
      report.root_cause = all[i];
    } else {
      report.others.push_back(all[i]);
    }
  }
  return report;
}

std::string render_failure_report(const FailureReport& report, const std::string& logs) {
  std::string text = "Root cause: " + describe_failure(report.root_cause);
  if (!logs.empty()) {
    if (report.root_cause.error) text += "\n    error file: " + report.root_cause.error_file;
    text += "\n    logs: " + logs;
  }
  if (!report.others.empty()) {
    text += "\nOther workers:";
    for (const WorkerFailure& f : report.others) text += "\n  " + describe_failure(f);
  }
  return text;
}

std::string failure_before_signal(const GroupResult& result, const std::string& attempt_dir,
                                  bool logs_kept) {
  if (!result.has_first_failure) return "";
  const FailureReport report = make_failure_report(result, attempt_dir);
  const std::string logs =
      logs_kept ? fmt::format("{}/rank_{}/", attempt_dir, report.root_cause.exit.global_rank)
                : "";
  return ". Before it, the job had failed: " + render_failure_report(report, logs);
}

}  // namespace tandem::cli
