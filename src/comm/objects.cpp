#include "tandem/comm/objects.h"

#include <cstdint>
#include <cstring>

#include <ATen/ATen.h>

#include "tandem/core/error.h"

namespace tandem {
namespace {

using Bytes = std::vector<std::uint8_t>;

// A tensor as bytes: dtype, rank, sizes (int64 each), then the elements.
Bytes encode_tensor(const at::Tensor& tensor) {
  TANDEM_CHECK_ARG(tensor.defined(), "gather_object/broadcast_object: the tensor is undefined");
  TANDEM_CHECK_ARG(tensor.device().is_cpu(),
                   "gather_object/broadcast_object: the tensor is on {}; objects travel from the "
                   "CPU, so pass tensor.cpu() (or use ProcessGroup::all_gather for same-shape "
                   "tensors on the device)",
                   tensor.device().str());
  TANDEM_CHECK_ARG(tensor.layout() == at::kStrided && !tensor.is_quantized(),
                   "gather_object/broadcast_object: only dense tensors are supported; call "
                   ".to_dense() (or .dequantize()) first");
  const at::Tensor dense = tensor.detach().resolve_conj().resolve_neg().contiguous();
  std::vector<std::int64_t> header = {static_cast<std::int64_t>(dense.scalar_type()),
                                      dense.dim()};
  for (std::int64_t size : dense.sizes()) header.push_back(size);
  const size_t data_bytes = dense.numel() * dense.element_size();
  Bytes bytes(header.size() * sizeof(std::int64_t) + data_bytes);
  std::memcpy(bytes.data(), header.data(), header.size() * sizeof(std::int64_t));
  if (data_bytes > 0) {
    std::memcpy(bytes.data() + header.size() * sizeof(std::int64_t), dense.data_ptr(), data_bytes);
  }
  return bytes;
}

at::Tensor decode_tensor(const Bytes& bytes) {
  auto read = [&](size_t index) {
    std::int64_t value = 0;
    TANDEM_CHECK((index + 1) * sizeof(value) <= bytes.size(),
                 "gather_object/broadcast_object: a tensor record of {} bytes is truncated",
                 bytes.size());
    std::memcpy(&value, bytes.data() + index * sizeof(value), sizeof(value));
    return value;
  };
  const auto dtype = static_cast<at::ScalarType>(read(0));
  const std::int64_t dim = read(1);
  std::vector<std::int64_t> sizes;
  for (std::int64_t d = 0; d < dim; ++d) sizes.push_back(read(2 + static_cast<size_t>(d)));
  at::Tensor tensor = at::empty(sizes, at::TensorOptions().dtype(dtype));
  const size_t offset = (2 + static_cast<size_t>(dim)) * sizeof(std::int64_t);
  const size_t data_bytes = tensor.numel() * tensor.element_size();
  TANDEM_CHECK_EQ(offset + data_bytes, bytes.size(),
                  "gather_object/broadcast_object: a tensor record does not match its header");
  if (data_bytes > 0) std::memcpy(tensor.data_ptr(), bytes.data() + offset, data_bytes);
  return tensor;
}

Bytes json_bytes(const nlohmann::json& object) { return nlohmann::json::to_msgpack(object); }

// Replaces `bytes` on every rank with src's: its length first, then the
// bytes themselves (skipped when empty, which every rank then knows).
void broadcast_bytes(ProcessGroup& group, Bytes& bytes, int src) {
  TANDEM_CHECK_ARG(src >= 0 && src < group.world_size(),
                   "broadcast_object: src {} is not a rank of this group (world size {}); pass "
                   "0 to {}",
                   src, group.world_size(), group.world_size() - 1);
  if (group.world_size() == 1) return;
  const bool is_src = group.rank() == src;
  at::Tensor length =
      at::full({1}, is_src ? static_cast<std::int64_t>(bytes.size()) : 0, at::kLong);
  group.broadcast(length, src);
  const std::int64_t n = length.item<std::int64_t>();
  if (n == 0) {
    bytes.clear();
    return;
  }
  at::Tensor buffer = at::empty({n}, at::kByte);
  if (is_src) std::memcpy(buffer.data_ptr(), bytes.data(), bytes.size());
  group.broadcast(buffer, src);
  if (!is_src) {
    const auto* data = buffer.data_ptr<std::uint8_t>();
    bytes.assign(data, data + n);
  }
}

}  // namespace

std::vector<std::string> gather_object(ProcessGroup& group, const std::string& object) {
  return group.all_gather_strings(object);
}

std::vector<std::string> gather_object(ProcessGroup& group, const char* object) {
  TANDEM_CHECK_ARG(object != nullptr, "gather_object: the string is a null pointer");
  return group.all_gather_strings(object);
}

std::vector<nlohmann::json> gather_object(ProcessGroup& group, const nlohmann::json& object) {
  std::vector<nlohmann::json> out;
  for (const Bytes& bytes : group.all_gather_bytes(json_bytes(object))) {
    out.push_back(nlohmann::json::from_msgpack(bytes));
  }
  return out;
}

std::vector<at::Tensor> gather_object(ProcessGroup& group, const at::Tensor& object) {
  std::vector<at::Tensor> out;
  for (const Bytes& bytes : group.all_gather_bytes(encode_tensor(object))) {
    out.push_back(decode_tensor(bytes));
  }
  return out;
}

void broadcast_object(ProcessGroup& group, std::string& object, int src) {
  Bytes bytes = group.rank() == src ? Bytes(object.begin(), object.end()) : Bytes();
  broadcast_bytes(group, bytes, src);
  if (group.rank() != src) object.assign(bytes.begin(), bytes.end());
}

void broadcast_object(ProcessGroup& group, nlohmann::json& object, int src) {
  // Only src's object is encoded; the others are about to be replaced.
  Bytes bytes = group.rank() == src ? json_bytes(object) : Bytes();
  broadcast_bytes(group, bytes, src);
  if (group.rank() != src) object = nlohmann::json::from_msgpack(bytes);
}

void broadcast_object(ProcessGroup& group, at::Tensor& object, int src) {
  Bytes bytes = group.rank() == src ? encode_tensor(object) : Bytes();
  broadcast_bytes(group, bytes, src);
  if (group.rank() != src) object = decode_tensor(bytes);
}

}  // namespace tandem
