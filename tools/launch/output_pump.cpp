#include "launch/output_pump.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem::cli {

struct OutputPump::Stream {
  int fd = -1;
  int rank = 0;
  bool is_stderr = false;
  bool to_console = true;
  FILE* file = nullptr;
  std::string pending;
  std::string own_prefix;  // "[rank r/" : lines from tandem's logger already say who they are
  std::string host;        // a host's launcher: its lines are relabelled
};

namespace {

void write_all(int fd, const std::string& data) {
  // An error means the console is gone (e.g. a closed pipe): keep running the job.
  (void)fs::write_all(fd, data.data(), data.size());
}

}  // namespace

OutputPump::OutputPump(bool prefix_lines) : prefix_lines_(prefix_lines) {}

OutputPump::~OutputPump() { close_all(); }

int OutputPump::add_stream(int fd, int rank, bool is_stderr, const StreamSink& sink,
                           const std::string& host) {
  auto stream = std::make_unique<Stream>();
  stream->host = host;
  stream->fd = fd;
  stream->rank = rank;
  stream->is_stderr = is_stderr;
  stream->to_console = sink.to_console;
  stream->own_prefix = "[rank " + std::to_string(rank) + "/";
  if (!sink.file_path.empty()) {
    stream->file = std::fopen(sink.file_path.c_str(), "w");
    TANDEM_CHECK_ARG(stream->file != nullptr, "cannot write log file {}: {}", sink.file_path,
                     std::strerror(errno));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  streams_.push_back(std::move(stream));
  return fd;
}

std::vector<int> OutputPump::open_fds() const {
  std::vector<int> fds;
  for (const auto& s : streams_) {
    if (s->fd >= 0) fds.push_back(s->fd);
  }
  return fds;
}

void OutputPump::emit(Stream& stream, const std::string& line) {
  if (stream.file != nullptr) {
    std::fwrite(line.data(), 1, line.size(), stream.file);
    std::fputc('\n', stream.file);
    std::fflush(stream.file);
  }
  if (!stream.to_console) return;
  std::string out;
  if (!stream.host.empty()) {
    // "[rank3]: text" from a host's launcher becomes "[host:rank3]: text".
    const bool ranked = line.rfind("[rank", 0) == 0 && line.find("]: ") != std::string::npos;
    out = ranked ? "[" + stream.host + ":" + line.substr(1) + "\n"
                 : "[" + stream.host + "]: " + line + "\n";
    write_all(stream.is_stderr ? STDERR_FILENO : STDOUT_FILENO, out);
    return;
  }
  if (prefix_lines_ && line.rfind(stream.own_prefix, 0) != 0) {
    out = "[rank" + std::to_string(stream.rank) + "]: ";
  }
  out += line;
  out += '\n';
  write_all(stream.is_stderr ? STDERR_FILENO : STDOUT_FILENO, out);
}

void OutputPump::on_readable(int fd) {
  for (auto& s : streams_) {
    if (s->fd != fd) continue;
    char buffer[65536];
    for (;;) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return;  // EAGAIN: nothing more for now
      if (n == 0) {
        if (!s->pending.empty()) emit(*s, s->pending);
        s->pending.clear();
        ::close(fd);
        s->fd = -1;
        if (s->file != nullptr) std::fclose(s->file);
        s->file = nullptr;
        return;
      }
      s->pending.append(buffer, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = s->pending.find('\n', start)) != std::string::npos; start = nl + 1) {
        emit(*s, s->pending.substr(start, nl - start));
      }
      s->pending.erase(0, start);
    }
  }
}

void OutputPump::close_all() {
  for (auto& s : streams_) {
    if (s->fd >= 0) {
      on_readable(s->fd);  // drain what is buffered
      if (s->fd >= 0) {
        if (!s->pending.empty()) emit(*s, s->pending);
        ::close(s->fd);
        s->fd = -1;
      }
    }
    if (s->file != nullptr) std::fclose(s->file);
    s->file = nullptr;
  }
}

}  // namespace tandem::cli
