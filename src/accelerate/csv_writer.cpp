// CsvWriter (csv_writer.h): DeepSpeed's csvMonitor file layout.

#include "tandem/accelerate/csv_writer.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "tandem/core/error.h"
#include "tandem/core/file_system.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

// A field as Python's csv.writer (DeepSpeed's csv_monitor) writes it: in
// double quotes, with quotes doubled, when it holds a comma, a quote or a
// line break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

CsvWriter::CsvWriter(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) dir_ = ".";
  fs::create_directories(dir_);
}

CsvWriter::~CsvWriter() { close(); }

// The tag's file: its sanitised name, or that name with "_2", "_3", ...
// when another tag took it (here, or in an earlier run's file with another
// header), so that every file holds one column under one header.
std::FILE* CsvWriter::file_of(const std::string& tag) {
  const auto found = files_.find(tag);
  if (found != files_.end()) return found->second;
  std::string base = tag;
  for (char& c : base) {
    if (c == '/' || c == ' ') c = '_';
  }
  const auto slash = tag.rfind('/');
  // csv.writer's default line terminator is \r\n.
  const std::string header =
      "step," + csv_field(slash == std::string::npos ? tag : tag.substr(slash + 1));
  std::string name = base;
  std::string path;
  bool resumed = false;  // an earlier run's file of this column: no second header
  for (int n = 2;; ++n) {
    path = dir_ + "/" + name + ".csv";
    if (owners_.count(name) == 0) {
      std::string first;
      std::ifstream existing(path);
      std::getline(existing, first);
      if (!first.empty() && first.back() == '\r') first.pop_back();
      resumed = first == header;
      if (first.empty() || resumed) break;
    }
    name = fmt::format("{}_{}", base, n);
  }
  if (name != base) {
    const auto owner = owners_.find(base);
    log_warn("CsvWriter: tag \"{}\" would be {}/{}.csv, which {}; it goes to {} instead", tag,
             dir_, base,
             owner != owners_.end() ? "tag \"" + owner->second + "\" writes"
                                    : std::string("holds another column"),
             path);
  }
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) {
    TANDEM_THROW(CheckpointError, "CsvWriter: cannot open {}: {}", path, std::strerror(errno));
  }
  if (!resumed) std::fputs((header + "\r\n").c_str(), file);
  owners_.emplace(name, tag);
  return files_.emplace(tag, file).first->second;
}

void CsvWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::FILE* file = file_of(tag);
  // Python's csv module writes floats with repr(): the shortest round trip,
  // with ".0" on whole numbers.
  std::string number = fmt::format("{}", value);
  if (number.find_first_not_of("-0123456789") == std::string::npos) number += ".0";
  const std::string row = fmt::format("{},{}\r\n", step, number);
  if (std::fputs(row.c_str(), file) < 0 || std::fflush(file) != 0) {
    TANDEM_THROW(CheckpointError, "CsvWriter: cannot write to {}/{}: {}", dir_, tag,
                 std::strerror(errno));
  }
}

void CsvWriter::close() {
  for (auto& [tag, file] : files_) std::fclose(file);
  files_.clear();
  owners_.clear();
}

}  // namespace tandem
