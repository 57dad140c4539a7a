#pragma once
// Copies worker output to the console and log files, line by line, with a
// rank prefix. Not thread-safe: owned by the launcher's event loop.

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace tandem::cli {

struct StreamSink {
  bool to_console = true;
  std::string file_path;  // empty: no file
};

class OutputPump {
 public:
  explicit OutputPump(bool prefix_lines);
  ~OutputPump();

  // Registers a readable fd carrying `rank`'s stdout (is_stderr false) or
  // stderr; takes ownership of the fd. Returns a handle for on_readable().
  // With a `host` (a --hostfile job's per-host launcher), lines are labelled
  // "[host:rankN]: " where they came as "[rankN]: ", else "[host]: ".
  int add_stream(int fd, int rank, bool is_stderr, const StreamSink& sink,
                 const std::string& host = "");

  // fds still open, for poll().
  std::vector<int> open_fds() const;

  // Reads what is available on `fd`; closes it at EOF (flushing a partial
  // last line).
  void on_readable(int fd);

  // Flushes partial lines and closes every stream.
  void close_all();

 private:
  struct Stream;
  void emit(Stream& stream, const std::string& line);
  bool prefix_lines_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

}  // namespace tandem::cli
