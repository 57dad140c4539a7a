#pragma once
// CsvWriter: scalars as DeepSpeed's csv_monitor writes them, one file per
// tag under a folder: DIR/<tag with '/' and ' ' as '_'>.csv, a header row
// "step,<the tag's last '/' part>" and then one "step,value" row per call.
//
//   tandem::CsvWriter csv("runs/exp1");
//   csv.add_scalar("Train/Samples/lr", 3e-4, /*step=*/256);  // runs/exp1/Train_Samples_lr.csv
//
// Every file is one valid CSV with one header, where DeepSpeed's are not:
// - Tags that make the same name ("a/b", "a b", "a_b") get a file each: the
//   first seen keeps a_b.csv, the next a_b_2.csv, ..., and a warning names
//   both tags.
// - A file an earlier run left with the same header (a resumed run) is
//   appended to without a second header; one with another header is
//   another column's, and the tag takes the next free name (warned).
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

  // Appends a row to the tag's file (opening it, with its header unless the
  // file has it already, the first time this writer sees the tag). Throws
  // CheckpointError on a write error.
  void add_scalar(const std::string& tag, double value, int64_t step);
  void close();
  const std::string& dir() const { return dir_; }

 private:
  std::FILE* file_of(const std::string& tag);

  std::string dir_;
  std::map<std::string, std::FILE*> files_;   // by tag
  std::map<std::string, std::string> owners_;  // file name (no .csv) -> its tag
};

}  // namespace tandem
