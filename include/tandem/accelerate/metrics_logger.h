#pragma once
// MetricsLogger: training metrics as JSON lines, one object per log() call:
//   {"step": 100, "loss": 0.0123, "tokens_per_s": 51234.5, "time": 12.34}
// "time" is seconds since open() (on a resumed run, added to the last kept
// line's). Only an enabled logger (the main process) touches the file;
// others do nothing. Each line is flushed as written, so a crash loses at
// most the line being written.
//
// A new run starts the file over. A resumed one (resume_from, which
// Accelerator::load_state calls) keeps the earlier run's lines up to the
// resumed step and appends after them, so neither the history nor a step
// is lost or written twice.
//
// Not thread-safe.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

namespace tandem {

class MetricsLogger {
 public:
  MetricsLogger() = default;
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Names the file and, when `enabled`, creates its folder and checks that
  // `path` can be written (UsageError naming it otherwise). The file's
  // contents change at the first log() or close(): a new run truncates it;
  // a resumed one (resume_from, before or after open) keeps its lines up to
  // the resumed step.
  void open(const std::string& path, bool enabled);
  // The run resumed from a checkpoint at `step`, in log()'s step unit (the
  // Accelerator passes its optimizer steps). The file keeps the lines whose
  // "step" is <= `step`; the lines past it were written by the interrupted
  // run after its last checkpoint, and the resumed run logs those steps
  // again, so they are dropped (an info line says how many). Lines that do
  // not parse (one torn by a crash) are dropped too. The file is rewritten
  // through a temporary one and a rename, so a crash keeps the old or the
  // new, never half. May be called before or after open(), and again.
  void resume_from(int64_t step);
  // Writes one line. UsageError, on every process, for a key "step" or
  // "time": each line holds those itself (pass the step as `step`; log a
  // time of your own under another name, e.g. "time_s").
  void log(const std::map<std::string, double>& values, int64_t step);
  void close();
  // Between open() (enabled) and close().
  bool is_open() const { return !path_.empty(); }

 private:
  // Truncates the file, or keeps its lines up to resume_step_; then appends.
  void start();

  std::string path_;        // empty: not open, or not enabled
  std::FILE* file_ = nullptr;  // null until start()
  std::optional<int64_t> resume_step_;
  double time_offset_ = 0;  // the last kept line's "time"
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tandem
