#pragma once
// TensorBoardWriter: scalars and text as a TensorBoard event file, written
// by tandem itself (no TensorFlow, no protobuf library), like PyTorch's
// torch.utils.tensorboard.SummaryWriter:
//
//   tandem::TensorBoardWriter tb("runs/exp1");
//   tb.add_scalar("loss", 0.25, /*step=*/100);
//   tb.add_text("notes", "lr 3e-4, batch 64", 0);
//
// The file is <dir>/events.out.tfevents.<unix time>.<host>.<pid>.<n>: TFRecord
// framing (length, masked CRC-32C of the length, an Event protobuf, masked
// CRC-32C of the data) around Event/Summary messages encoded by hand. Every
// call appends one record and flushes it, so `tensorboard --logdir runs`
// sees values as they come and a crash loses at most the record being
// written. Scalars are stored as float32 (TensorBoard's simple_value).
//
// Not thread-safe.

#include <cstdint>
#include <cstdio>
#include <string>

namespace tandem {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it, starting
  // with the file-version record. UsageError naming the path when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  // Text shown in TensorBoard's Text tab (markdown).
  void add_text(const std::string& tag, const std::string& text, int64_t step);
  void close();

  const std::string& path() const { return path_; }

 private:
  // Appends one Event (serialized) as a record and flushes.
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

namespace detail {
// TFRecord's masked CRC-32C: rotate right by 15 bits, add 0xa282ead8.
uint32_t tfrecord_masked_crc32c(const void* data, std::size_t size);
}  // namespace detail

}  // namespace tandem
