// CsvWriter (csv_writer.h): DeepSpeed's csvMonitor file layout.

#include "tandem/accelerate/csv_writer.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

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

void CsvWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  auto it = files_.find(tag);
  if (it == files_.end()) {
    std::string name = tag;
    for (char& c : name) {
      if (c == '/' || c == ' ') c = '_';
    }
    const std::string path = dir_ + "/" + name + ".csv";
    std::FILE* file = std::fopen(path.c_str(), "a");
    if (file == nullptr) {
      TANDEM_THROW(CheckpointError, "CsvWriter: cannot open {}: {}", path, std::strerror(errno));
    }
    const auto slash = tag.rfind('/');
    // csv.writer's default line terminator is \r\n.
    const std::string header =
        "step," + csv_field(slash == std::string::npos ? tag : tag.substr(slash + 1)) + "\r\n";
    std::fputs(header.c_str(), file);
    it = files_.emplace(tag, file).first;
  }
  // Python's csv module writes floats with repr(): the shortest round trip,
  // with ".0" on whole numbers.
  std::string number = fmt::format("{}", value);
  if (number.find_first_not_of("-0123456789") == std::string::npos) number += ".0";
  const std::string row = fmt::format("{},{}\r\n", step, number);
  if (std::fputs(row.c_str(), it->second) < 0 || std::fflush(it->second) != 0) {
    TANDEM_THROW(CheckpointError, "CsvWriter: cannot write to {}/{}: {}", dir_, tag,
                 std::strerror(errno));
  }
}

void CsvWriter::close() {
  for (auto& [tag, file] : files_) std::fclose(file);
  files_.clear();
}

}  // namespace tandem
