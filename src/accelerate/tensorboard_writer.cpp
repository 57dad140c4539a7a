#include "tandem/accelerate/tensorboard_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "checkpoint/crc32c.h"
#include "tandem/core/error.h"

namespace tandem {
// Named, not anonymous: unity builds share one translation unit.
namespace tensorboard_proto {

// Protobuf wire format, just what Event and Summary need.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

template <typename T>
void put_fixed(std::string& out, int field, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  put_key(out, field, sizeof(T) == 8 ? 1 : 5);
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // little-endian on every platform tandem builds for
  out.append(raw, sizeof(T));
}

double wall_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3;
//         Summary summary = 5; }
std::string event(int64_t step, const std::string& summary) {
  std::string out;
  put_fixed(out, 1, wall_time());
  put_key(out, 2, 0);
  put_varint(out, static_cast<uint64_t>(step));
  put_bytes(out, 5, summary);
  return out;
}

// Summary { repeated Value value = 1; }  Value { string tag = 1;
//   float simple_value = 2; TensorProto tensor = 8; SummaryMetadata metadata = 9; }
std::string scalar_summary(const std::string& tag, double value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_fixed(v, 2, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  return summary;
}

// SummaryMetadata { PluginData plugin_data = 1 { string plugin_name = 1;
//   bytes content = 2; } }
std::string plugin_metadata(const std::string& plugin, const std::string& content) {
  std::string data;
  put_bytes(data, 1, plugin);
  if (!content.empty()) put_bytes(data, 2, content);
  std::string metadata;
  put_bytes(metadata, 1, data);
  return metadata;
}

// The text plugin's value: a scalar DT_STRING tensor (TensorProto { dtype = 1
// (DT_STRING = 7); tensor_shape = 2 (empty: a scalar); string_val = 8 }).
std::string text_summary(const std::string& tag, const std::string& text) {
  std::string tensor;
  put_key(tensor, 1, 0);
  put_varint(tensor, 7);
  put_bytes(tensor, 2, "");
  put_bytes(tensor, 8, text);
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 8, tensor);
  put_bytes(v, 9, plugin_metadata("text", ""));
  std::string summary;
  put_bytes(summary, 1, v);
  return summary;
}

// The hparams plugin's values carry everything in their metadata: content is
// an HParamsPluginData { int32 version = 1 (0: left out); oneof data {
// Experiment experiment = 2; SessionStartInfo session_start_info = 3;
// SessionEndInfo session_end_info = 4; } } (tensorboard/plugins/hparams).
std::string hparams_summary(const std::string& tag, int data_field, const std::string& data) {
  std::string content;
  put_bytes(content, data_field, data);
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 9, plugin_metadata("hparams", content));
  std::string summary;
  put_bytes(summary, 1, v);
  return summary;
}

// google.protobuf.Value { oneof kind { double number_value = 2;
//   string string_value = 3; bool bool_value = 4; } }: a set oneof member is
// written even when it holds its default.
std::string protobuf_value(const HParamValue& value) {
  std::string out;
  switch (value.kind()) {
    case HParamValue::Kind::kNumber: put_fixed(out, 2, value.number()); break;
    case HParamValue::Kind::kString: put_bytes(out, 3, value.text()); break;
    case HParamValue::Kind::kBool:
      put_key(out, 4, 0);
      put_varint(out, value.flag() ? 1 : 0);
      break;
  }
  return out;
}

// SessionStartInfo { map<string, Value> hparams = 1; }: each map entry is a
// message { string key = 1; Value value = 2; }.
std::string session_start_info(const std::map<std::string, HParamValue>& hparams) {
  std::string out;
  for (const auto& [name, value] : hparams) {
    std::string entry;
    put_bytes(entry, 1, name);
    put_bytes(entry, 2, protobuf_value(value));
    put_bytes(out, 1, entry);
  }
  return out;
}

// Experiment { repeated HParamInfo hparam_infos = 4 { string name = 1;
//   DataType type = 4; }; repeated MetricInfo metric_infos = 5 {
//   MetricName name = 1 { string tag = 2; } }; }
// DataType: STRING = 1, BOOL = 2, FLOAT64 = 3.
std::string experiment(const std::map<std::string, HParamValue>& hparams,
                       const std::map<std::string, double>& metrics) {
  std::string out;
  for (const auto& [name, value] : hparams) {
    const int type = value.kind() == HParamValue::Kind::kString ? 1
                     : value.kind() == HParamValue::Kind::kBool ? 2
                                                                : 3;
    std::string info;
    put_bytes(info, 1, name);
    put_key(info, 4, 0);
    put_varint(info, static_cast<uint64_t>(type));
    put_bytes(out, 4, info);
  }
  for (const auto& [tag, value] : metrics) {
    std::string metric_name;
    put_bytes(metric_name, 2, tag);
    std::string info;
    put_bytes(info, 1, metric_name);
    put_bytes(out, 5, info);
  }
  return out;
}

// SessionEndInfo { Status status = 1; } with STATUS_SUCCESS = 1.
std::string session_end_info_success() {
  std::string out;
  put_key(out, 1, 0);
  put_varint(out, 1);
  return out;
}

void make_dirs(const std::string& dir) {
  for (std::size_t pos = dir.find('/', 1);; pos = dir.find('/', pos + 1)) {
    const std::string part = dir.substr(0, pos);
    if (!part.empty() && ::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      TANDEM_THROW(UsageError, "tensorboard: cannot create {}: {}", part, std::strerror(errno));
    }
    if (pos == std::string::npos) break;
  }
}

}  // namespace tensorboard_proto

uint32_t detail::tfrecord_masked_crc32c(const void* data, std::size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  using namespace tensorboard_proto;
  make_dirs(dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto seconds = static_cast<int64_t>(wall_time());
  // Two writers in one process and second get distinct names.
  static std::atomic<int> counter{0};
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}.{}", dir, seconds, host, ::getpid(),
                      counter++);
  file_ = std::fopen(path_.c_str(), "wb");
  TANDEM_CHECK_ARG(file_ != nullptr, "tensorboard: cannot open {} for writing: {}", path_,
                   std::strerror(errno));
  std::string first;
  put_fixed(first, 1, wall_time());
  put_bytes(first, 3, "brain.Event:2");
  write_record(first);
}

TensorBoardWriter::~TensorBoardWriter() { close(); }

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_record(tensorboard_proto::event(step, tensorboard_proto::scalar_summary(tag, value)));
}

void TensorBoardWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  write_record(tensorboard_proto::event(step, tensorboard_proto::text_summary(tag, text)));
}

void TensorBoardWriter::add_hparams(const std::map<std::string, HParamValue>& hparams,
                                    const std::map<std::string, double>& metrics, int64_t step) {
  using namespace tensorboard_proto;
  // The tags and record order of torch.utils.tensorboard's add_hparams.
  if (!metrics.empty()) {
    write_record(event(step, hparams_summary("_hparams_/experiment", 2,
                                             experiment(hparams, metrics))));
  }
  write_record(event(step, hparams_summary("_hparams_/session_start_info", 3,
                                           session_start_info(hparams))));
  write_record(event(step, hparams_summary("_hparams_/session_end_info", 4,
                                           session_end_info_success())));
  for (const auto& [tag, value] : metrics) add_scalar(tag, value, step);
}

void TensorBoardWriter::close() {
  if (file_ != nullptr) std::fclose(file_);
  file_ = nullptr;
}

void TensorBoardWriter::write_record(const std::string& event) {
  TANDEM_CHECK_ARG(file_ != nullptr, "tensorboard: {} is closed", path_);
  const uint64_t length = event.size();
  const uint32_t length_crc = detail::tfrecord_masked_crc32c(&length, sizeof length);
  const uint32_t data_crc = detail::tfrecord_masked_crc32c(event.data(), event.size());
  const bool ok = std::fwrite(&length, sizeof length, 1, file_) == 1 &&
                  std::fwrite(&length_crc, sizeof length_crc, 1, file_) == 1 &&
                  std::fwrite(event.data(), 1, event.size(), file_) == event.size() &&
                  std::fwrite(&data_crc, sizeof data_crc, 1, file_) == 1 &&
                  std::fflush(file_) == 0;
  TANDEM_CHECK(ok, "tensorboard: writing {} failed: {}", path_, std::strerror(errno));
}

}  // namespace tandem
