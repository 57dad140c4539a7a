#pragma once
// TensorBoardWriter: scalars, text and hyperparameters as a TensorBoard event
// file, written by tandem itself (no TensorFlow, no protobuf library), like
// PyTorch's torch.utils.tensorboard.SummaryWriter:
//
//   tandem::TensorBoardWriter tb("runs/exp1");
//   tb.add_hparams({{"lr", 3e-4}, {"batch_size", 64}, {"optimizer", "adamw"}});
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
#include <map>
#include <string>
#include <type_traits>
#include <utility>

namespace tandem {

// One hyperparameter's value as TensorBoard's HParams plugin holds it (a
// google.protobuf.Value): a number (integers too, as a double), a string or
// a bool. Converts implicitly, so a map of them reads
//   {{"lr", 3e-4}, {"batch_size", 64}, {"optimizer", "adamw"}, {"amp", true}}.
class HParamValue {
 public:
  enum class Kind { kNumber, kString, kBool };

  template <typename T,
            std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, int> = 0>
  HParamValue(T number) : kind_(Kind::kNumber), number_(static_cast<double>(number)) {}
  HParamValue(bool flag) : kind_(Kind::kBool), flag_(flag) {}
  HParamValue(std::string text) : kind_(Kind::kString), text_(std::move(text)) {}
  HParamValue(const char* text) : HParamValue(std::string(text)) {}

  Kind kind() const { return kind_; }
  // The value of its kind; the others read as 0, "" and false.
  double number() const { return number_; }
  const std::string& text() const { return text_; }
  bool flag() const { return flag_; }

 private:
  Kind kind_;
  double number_ = 0;
  std::string text_;
  bool flag_ = false;
};

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
  // The run's hyperparameters for TensorBoard's HParams tab, as PyTorch's
  // SummaryWriter.add_hparams writes them (plugin "hparams"): a
  // session_start_info with `hparams`, a session_end_info with status
  // SUCCESS and, when `metrics` is not empty, an experiment naming the
  // hparams and metrics, followed by each metric as a scalar at `step`.
  // Unlike PyTorch, the records go into this writer's own run, not a new
  // sub-folder, and no empty experiment is written without metrics:
  // TensorBoard then takes the run's scalars (loss, ...) as the metric
  // columns. Bools stay bools (PyTorch stores them as numbers). Call once
  // per run; TensorBoard keeps the first session_start_info it reads.
  void add_hparams(const std::map<std::string, HParamValue>& hparams,
                   const std::map<std::string, double>& metrics = {}, int64_t step = 0);
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
