// CsvWriter (csv_writer.h): DeepSpeed's csvMonitor file layout.

#include "tandem/accelerate/csv_writer.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem {

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
    std::fprintf(file, "step,%s\n", slash == std::string::npos ? tag.c_str()
                                                               : tag.c_str() + slash + 1);
    it = files_.emplace(tag, file).first;
  }
  // Python's csv module writes floats with repr(): the shortest round trip,
  // with ".0" on whole numbers.
  std::string number = fmt::format("{}", value);
  if (number.find_first_not_of("-0123456789") == std::string::npos) number += ".0";
  const std::string row = fmt::format("{},{}\n", step, number);
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
