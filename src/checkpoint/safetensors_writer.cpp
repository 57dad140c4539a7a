#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "checkpoint/crc32c.h"
#include "checkpoint/safetensors_header.h"
#include "checkpoint/safetensors_io.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/core/error.h"

namespace tandem {

struct SafetensorsStreamWriter::State {
  std::string path;
  int fd = -1;
  std::vector<detail::SafetensorsHeaderEntry> entries;  // spec order, offsets set
  std::map<std::string, std::string> metadata;
  std::vector<uint32_t> crc32c;
  std::size_t next = 0;          // index of the next tensor to write
  int64_t header_bytes = 0;      // N
  int64_t file_size = 0;
  bool finished = false;
  bool failed = false;
  at::Tensor staging;            // kByte, for non-CPU or non-contiguous tensors
  uint32_t crc = 0;              // of the tensor being written
  int64_t offset = 0;            // file offset of the next byte

  // Closes and unlinks the partial file, then throws.
  [[noreturn]] void fail_io(const std::string& action, int err) {
    abandon();
    detail::throw_file_error(action, path, err);
  }

  void abandon() noexcept {
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
      ::unlink(path.c_str());
    }
    failed = true;
  }

  void write_bytes(const void* data, int64_t size) {
    const char* p = static_cast<const char*>(data);
    const int64_t chunk = detail::safetensors_chunk_bytes();
    while (size > 0) {
      const int64_t n = std::min(size, chunk);
      // Checksum the piece just before writing it, while it is in cache.
      crc = detail::crc32c_extend(crc, p, static_cast<std::size_t>(n));
      if (int err = detail::pwrite_all(fd, p, static_cast<std::size_t>(n), offset)) {
        fail_io("writing", err);
      }
      p += n;
      size -= n;
      offset += n;
    }
  }

  // Copies `t` (at most one chunk) into the staging buffer and writes it.
  void write_staged(const at::Tensor& t, int64_t bytes) {
    const int64_t capacity = std::max(detail::safetensors_chunk_bytes(), bytes);
    if (!staging.defined() || staging.numel() < bytes) {
      staging = at::empty({capacity}, at::TensorOptions().dtype(at::kByte));
    }
    at::Tensor view = staging.narrow(0, 0, bytes).view(t.scalar_type()).view(t.sizes());
    view.copy_(t);
    write_bytes(view.data_ptr(), bytes);
  }

  // Writes `t` in row-major order, in pieces of at most one chunk for
  // tensors that must be staged.
  void write_tensor(const at::Tensor& t) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    if (bytes == 0) return;
    if (t.device().is_cpu() && t.is_contiguous()) {
      write_bytes(t.data_ptr(), bytes);
      return;
    }
    const int64_t chunk = detail::safetensors_chunk_bytes();
    if (bytes <= chunk || t.dim() == 0) {
      write_staged(t, bytes);
      return;
    }
    const int64_t rows = t.size(0);
    const int64_t row_bytes = bytes / rows;
    if (row_bytes > chunk) {
      for (int64_t i = 0; i < rows; ++i) write_tensor(t.select(0, i));
      return;
    }
    const int64_t step = chunk / row_bytes;
    for (int64_t i = 0; i < rows; i += step) write_tensor(t.narrow(0, i, std::min(step, rows - i)));
  }
};

SafetensorsStreamWriter::SafetensorsStreamWriter(std::string path,
                                                 std::vector<SafetensorsSpec> specs,
                                                 std::map<std::string, std::string> metadata)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.path = std::move(path);
  s.metadata = std::move(metadata);
  int64_t data_size = 0;
  std::unordered_set<std::string> names;
  for (auto& spec : specs) {
    TANDEM_CHECK_ARG(names.insert(spec.name).second,
                     "SafetensorsStreamWriter('{}'): tensor '{}' appears twice", s.path, spec.name);
    detail::SafetensorsHeaderEntry e;
    e.name = std::move(spec.name);
    e.dtype = detail::to_safetensors_dtype(spec.dtype);
    e.shape = std::move(spec.shape);
    int64_t bytes = detail::safetensors_dtype_size(e.dtype);
    for (int64_t d : e.shape) {
      TANDEM_CHECK_ARG(d >= 0, "SafetensorsStreamWriter('{}'): tensor '{}' has a negative dimension",
                       s.path, e.name);
      TANDEM_CHECK_ARG(!__builtin_mul_overflow(bytes, std::max<int64_t>(d, 1), &bytes),
                       "SafetensorsStreamWriter('{}'): tensor '{}' is too large", s.path, e.name);
    }
    e.numel = 1;
    for (int64_t d : e.shape) e.numel *= d;
    bytes = e.numel * detail::safetensors_dtype_size(e.dtype);
    e.data_begin = data_size;
    TANDEM_CHECK_ARG(!__builtin_add_overflow(data_size, bytes, &data_size),
                     "SafetensorsStreamWriter('{}'): the tensors are too large", s.path);
    e.data_end = data_size;
    s.entries.push_back(std::move(e));
  }
  s.crc32c.assign(s.entries.size(), 0);
  std::string header;
  try {
    header = detail::build_safetensors_header(s.entries, s.metadata, s.crc32c);
  } catch (const std::invalid_argument& e) {
    TANDEM_THROW(UsageError, "SafetensorsStreamWriter('{}'): {}", s.path, e.what());
  }
  s.header_bytes = static_cast<int64_t>(header.size());
  s.offset = 8 + s.header_bytes;
  s.file_size = s.offset + data_size;

  // O_NONBLOCK: a FIFO at `path` must fail below, not block here.
  const int fd = ::open(s.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) detail::throw_file_error("creating", s.path, errno);
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);  // never unlink what is not our regular file (/dev/full, a FIFO)
    TANDEM_THROW(CheckpointError, "'{}' is not a regular file; write safetensors files to a "
                 "regular file path", s.path);
  }
  s.fd = fd;
  // Reserve the whole file now: a full disk fails here, not gigabytes later.
  if (::fallocate(s.fd, 0, 0, s.file_size) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
    s.fail_io("reserving " + std::to_string(s.file_size) + " bytes for", errno);
  }
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (state_ && !state_->finished) state_->abandon();
}

void SafetensorsStreamWriter::write(const std::string& name, const at::Tensor& tensor) {
  State& s = *state_;
  TANDEM_CHECK_ARG(!s.failed && !s.finished,
                   "SafetensorsStreamWriter('{}').write('{}'): the writer has {}", s.path, name,
                   s.finished ? "finished" : "failed and removed its file");
  TANDEM_CHECK_ARG(s.next < s.entries.size(),
                   "SafetensorsStreamWriter('{}').write('{}'): all {} tensors were already written",
                   s.path, name, s.entries.size());
  const auto& e = s.entries[s.next];
  TANDEM_CHECK_ARG(name == e.name,
                   "SafetensorsStreamWriter('{}'): got tensor '{}' where tensor {} of {} is '{}'; "
                   "write the tensors in the order of the specs",
                   s.path, name, s.next, s.entries.size(), e.name);
  TANDEM_CHECK_ARG(tensor.defined() && tensor.layout() == at::kStrided,
                   "SafetensorsStreamWriter('{}'): tensor '{}' is undefined or not dense", s.path,
                   name);
  TANDEM_CHECK_ARG(detail::to_safetensors_dtype(tensor.scalar_type()) == e.dtype &&
                       tensor.numel() == e.numel,
                   "SafetensorsStreamWriter('{}'): tensor '{}' is {} with {} elements; its spec "
                   "says {} with {}",
                   s.path, name, safetensors_dtype_name(tensor.scalar_type()), tensor.numel(),
                   detail::safetensors_dtype_string(e.dtype), e.numel);
  at::NoGradGuard no_grad;
  s.crc = 0;
  s.offset = 8 + s.header_bytes + e.data_begin;
  try {
    s.write_tensor(tensor);
  } catch (const CheckpointError&) {
    throw;  // fail_io already removed the file
  } catch (const std::exception& ex) {
    s.abandon();
    TANDEM_THROW(CheckpointError, "writing tensor '{}' to '{}' failed: {}", name, s.path, ex.what());
  }
  s.crc32c[s.next++] = s.crc;
}

SafetensorsWriteResult SafetensorsStreamWriter::finish(bool sync) {
  State& s = *state_;
  TANDEM_CHECK_ARG(!s.failed && !s.finished, "SafetensorsStreamWriter('{}').finish(): the writer has {}",
                   s.path, s.finished ? "already finished" : "failed and removed its file");
  TANDEM_CHECK_ARG(s.next == s.entries.size(),
                   "SafetensorsStreamWriter('{}').finish(): only {} of {} tensors were written; "
                   "the next is '{}'",
                   s.path, s.next, s.entries.size(), s.entries[std::min(s.next, s.entries.size() - 1)].name);
  const std::string header = detail::build_safetensors_header(s.entries, s.metadata, s.crc32c);
  TANDEM_CHECK(static_cast<int64_t>(header.size()) == s.header_bytes,
               "safetensors header changed length ({} -> {} bytes) once the checksums were known",
               s.header_bytes, header.size());
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((s.header_bytes >> (8 * i)) & 0xff);
  prefix += header;
  if (int err = detail::pwrite_all(s.fd, prefix.data(), prefix.size(), 0)) s.fail_io("writing", err);
  struct stat st{};
  if (::fstat(s.fd, &st) != 0) s.fail_io("checking", errno);
  TANDEM_CHECK(st.st_size == s.file_size, "'{}' is {} bytes after writing; expected {}", s.path,
               static_cast<int64_t>(st.st_size), s.file_size);
  if (sync && ::fsync(s.fd) != 0) s.fail_io("flushing (fsync)", errno);
  const int fd = s.fd;
  s.fd = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(s.path.c_str());
    s.failed = true;
    detail::throw_file_error("closing", s.path, err);
  }
  s.finished = true;
  return {s.file_size, detail::crc32c(prefix.data(), prefix.size())};
}

SafetensorsWriteResult write_safetensors(
    const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata, bool sync) {
  std::vector<SafetensorsSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    TANDEM_CHECK_ARG(t.defined(), "write_safetensors('{}'): tensor '{}' is undefined", path, name);
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  SafetensorsStreamWriter writer(path, std::move(specs), metadata);
  for (const auto& [name, t] : tensors) writer.write(name, t);
  return writer.finish(sync);
}

}  // namespace tandem
