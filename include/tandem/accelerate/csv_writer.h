#pragma once
// CsvWriter: scalars as DeepSpeed's csv_monitor writes them, one file per
// tag under a folder: DIR/<tag with '/' and ' ' as '_'>.csv, a header row
// "step,<the tag's last '/' part>" and then one "step,value" row per call.
//
//   tandem::CsvWriter csv("runs/exp1");
//   csv.add_scalar("Train/Samples/lr", 3e-4, /*step=*/256);  // runs/exp1/Train_Samples_lr.csv
//
// Each row is flushed as written. Not thread-safe.

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

namespace tandem {

class CsvWriter {
 public:
  // Creates `dir` (and its parents). Throws CheckpointError when it cannot.
  explicit CsvWriter(std::string dir);
  ~CsvWriter();
  CsvWriter(const CsvWriter&) = delete;
  CsvWriter& operator=(const CsvWriter&) = delete;

  // Appends a row to the tag's file (opening it, with its header, the first
  // time this writer sees the tag). Throws CheckpointError on a write error.
  void add_scalar(const std::string& tag, double value, int64_t step);
  void close();
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::map<std::string, std::FILE*> files_;
};

}  // namespace tandem
