// MetricsLogger (metrics_logger.h): JSON lines, started over or resumed.

#include "tandem/accelerate/metrics_logger.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/file_system.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

void make_parent_dirs(const std::string& path) {
  for (size_t i = 1; i < path.size(); ++i) {
    if (path[i] != '/') continue;
    const std::string dir = path.substr(0, i);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      TANDEM_THROW(UsageError, "metrics: cannot create folder {}: {}", dir, std::strerror(errno));
    }
  }
}

// JSON has no NaN or infinity; write them as null rather than break the line.
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  return fmt::format("{}", value);
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::FILE* open_file(const std::string& path, const char* mode) {
  std::FILE* file = std::fopen(path.c_str(), mode);
  TANDEM_CHECK_ARG(file != nullptr, "metrics: cannot open {} for writing: {}", path,
                   std::strerror(errno));
  return file;
}

}  // namespace

MetricsLogger::~MetricsLogger() {
  try {
    close();
  } catch (const Error& e) {
    log_warn("{}", e.what());
  }
}

void MetricsLogger::open(const std::string& path, bool enabled) {
  close();
  start_ = std::chrono::steady_clock::now();
  if (!enabled) return;
  make_parent_dirs(path);
  // Only a check ("a" changes nothing): what the file keeps is decided at
  // the first write.
  std::fclose(open_file(path, "a"));
  path_ = path;
}

void MetricsLogger::resume_from(int64_t step) {
  resume_step_ = step;
  if (file_ == nullptr) return;  // start() applies it
  std::fclose(file_);
  file_ = nullptr;
  start();
}

void MetricsLogger::start() {
  if (!resume_step_) {
    file_ = open_file(path_, "w");
    return;
  }
  // Why a line past the resumed step is dropped rather than kept: the
  // checkpoint was saved at that step, so every later line came from work
  // the resumed run repeats and logs again.
  std::vector<std::string> kept;
  int64_t dropped = 0;
  double last_time = 0;
  {
    std::ifstream in(path_);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const bool keep = row.is_object() && row.contains("step") &&
                        row["step"].is_number_integer() &&
                        row["step"].get<int64_t>() <= *resume_step_;
      if (!keep) {
        ++dropped;
        continue;
      }
      if (row.contains("time") && row["time"].is_number()) last_time = row["time"].get<double>();
      kept.push_back(std::move(line));
    }
  }
  const std::string temporary = path_ + ".tmp";
  std::FILE* out = open_file(temporary, "w");
  bool written = true;
  for (const std::string& line : kept) {
    written = written && std::fputs(line.c_str(), out) >= 0 && std::fputc('\n', out) != EOF;
  }
  written = written && std::fflush(out) == 0 && ::fsync(::fileno(out)) == 0;
  std::fclose(out);
  TANDEM_CHECK_ARG(written, "metrics: cannot write {}: {}", temporary, std::strerror(errno));
  fs::rename(temporary, path_);
  if (!kept.empty() || dropped > 0) {
    log_info("metrics: resumed at step {}: {} keeps its {} line(s) up to that step{}",
             *resume_step_, path_, kept.size(),
             dropped > 0 ? fmt::format(" and drops {} (past it: the interrupted run's, which "
                                       "this run logs again; or torn by a crash)",
                                       dropped)
                         : "");
  }
  // "time" continues the earlier run's clock.
  time_offset_ = last_time;
  file_ = open_file(path_, "a");
}

void MetricsLogger::log(const std::map<std::string, double>& values, int64_t step) {
  for (const char* own : {"step", "time"}) {
    TANDEM_CHECK_ARG(values.count(own) == 0,
                     "metrics: log() got a value named \"{}\", the name of a field every JSON "
                     "line holds itself ({}); log it under another name, e.g. \"{}\"",
                     own,
                     std::string(own) == "step" ? "pass the step as log()'s step argument"
                                                : "seconds since init_trackers()",
                     std::string(own) == "step" ? "train/step" : "time_s");
  }
  if (path_.empty()) return;
  if (file_ == nullptr) start();
  const double elapsed =
      time_offset_ +
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = fmt::format("{{\"step\": {}", step);
  for (const auto& [key, value] : values) {
    line += fmt::format(", {}: {}", json_string(key), json_number(value));
  }
  line += fmt::format(", \"time\": {:.3f}}}\n", elapsed);
  std::fputs(line.c_str(), file_);
  std::fflush(file_);
}

void MetricsLogger::close() {
  if (!path_.empty() && file_ == nullptr) start();  // nothing logged: still start the file
  if (file_ != nullptr) std::fclose(file_);
  file_ = nullptr;
  path_.clear();
  time_offset_ = 0;
}

}  // namespace tandem
