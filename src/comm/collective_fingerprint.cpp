#include "comm/collective_fingerprint.h"

#include <algorithm>

#include <fmt/format.h>

#include "tandem/comm/process_group.h"

namespace tandem::detail {
namespace {

// Field positions in Fingerprint::fields.
enum Field : int {
  kSequence = 0,
  kOp,
  kDtype,       // ScalarType + 1; 0 without a tensor
  kDevice,      // DeviceType + 1; 0 without a tensor
  kReduceOp,    // tandem::ReduceOp, or -1
  kRoot,        // or -1
  kDims,        // tensor.dim(), or -1
  kShapeHash,   // covers dimensions past kMaxDims
  kNumel,
  kFirstDim,    // kMaxDims sizes follow
};
static_assert(kFirstDim + Fingerprint::kMaxDims == Fingerprint::kFields, "fields must fill the row");

std::int64_t hash_shape(at::IntArrayRef sizes) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the sizes
  for (std::int64_t s : sizes) {
    h ^= static_cast<std::uint64_t>(s);
    h *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(h);
}

}  // namespace

const char* to_string(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce: return "all_reduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kAllGather: return "all_gather";
    case CollectiveOp::kAllGatherInto: return "all_gather_into";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kAllGatherBytes: return "all_gather_bytes";
    case CollectiveOp::kAllToAll: return "all_to_all";
    case CollectiveOp::kAllToAllUneven: return "all_to_all (uneven splits)";
    case CollectiveOp::kGather: return "gather";
    case CollectiveOp::kScatter: return "scatter";
    case CollectiveOp::kNewGroup: return "new_group";
  }
  return "unknown collective";
}

Fingerprint Fingerprint::of(CollectiveOp op, std::uint64_t sequence, const at::Tensor* tensor,
                            std::int64_t reduce_op, std::int64_t root) {
  if (tensor != nullptr) {
    return of(op, sequence, tensor->scalar_type(), tensor->device().type(), tensor->sizes(),
              reduce_op, root);
  }
  Fingerprint fp;
  auto& f = fp.fields;
  f[kSequence] = static_cast<std::int64_t>(sequence);
  f[kOp] = static_cast<std::int64_t>(op);
  f[kReduceOp] = reduce_op;
  f[kRoot] = root;
  f[kDims] = -1;
  return fp;
}

Fingerprint Fingerprint::of(CollectiveOp op, std::uint64_t sequence, at::ScalarType dtype,
                            c10::DeviceType device, at::IntArrayRef sizes, std::int64_t reduce_op,
                            std::int64_t root) {
  Fingerprint fp = of(op, sequence, nullptr, reduce_op, root);
  auto& f = fp.fields;
  const auto dims = static_cast<std::int64_t>(sizes.size());
  f[kDtype] = static_cast<std::int64_t>(dtype) + 1;
  f[kDevice] = static_cast<std::int64_t>(device) + 1;
  f[kDims] = dims;
  f[kShapeHash] = hash_shape(sizes);
  std::int64_t numel = 1;
  for (std::int64_t s : sizes) numel = s < 0 || numel < 0 ? -1 : numel * s;
  f[kNumel] = numel;
  for (std::int64_t d = 0; d < kMaxDims && d < dims; ++d) f[kFirstDim + d] = sizes[d];
  return fp;
}

std::uint64_t Fingerprint::sequence() const {
  return static_cast<std::uint64_t>(fields[kSequence]);
}

std::string Fingerprint::describe(bool with_sequence) const {
  const auto& f = fields;
  const auto op = static_cast<CollectiveOp>(f[kOp]);
  std::string text = to_string(op);
  if (f[kOp] < static_cast<std::int64_t>(CollectiveOp::kAllReduce) ||
      f[kOp] > static_cast<std::int64_t>(CollectiveOp::kLast)) {
    text = fmt::format("collective {}", f[kOp]);  // a different tandem build?
  }
  if (with_sequence) text += fmt::format(" #{}", f[kSequence]);
  if (f[kDims] >= 0) {
    text += fmt::format(" {}[", c10::toString(static_cast<at::ScalarType>(f[kDtype] - 1)));
    for (std::int64_t d = 0; d < f[kDims] && d < kMaxDims; ++d) {
      const std::int64_t size = f[kFirstDim + d];
      text += (d == 0 ? "" : ", ") + (size < 0 ? std::string("*") : std::to_string(size));
    }
    if (f[kDims] > kMaxDims) text += fmt::format(", ... ({}-d, {} elements)", f[kDims], f[kNumel]);
    text += "]";
    const auto device = static_cast<c10::DeviceType>(f[kDevice] - 1);
    if (device != c10::DeviceType::CPU) text += " on " + c10::DeviceTypeName(device, true);
  }
  if (f[kReduceOp] >= 0 && f[kReduceOp] <= static_cast<std::int64_t>(ReduceOp::kMin)) {
    text += fmt::format(" ({})", to_string(static_cast<ReduceOp>(f[kReduceOp])));
  }
  if (f[kRoot] >= 0) text += fmt::format(" (root {})", f[kRoot]);
  return text;
}

std::string find_desync(const std::vector<Fingerprint>& by_rank, const GroupRanks& group) {
  // Groups of ranks with equal fingerprints, in order of their lowest rank.
  std::vector<Fingerprint> kinds;
  std::vector<std::vector<int>> ranks;
  for (int r = 0; r < static_cast<int>(by_rank.size()); ++r) {
    auto it = std::find(kinds.begin(), kinds.end(), by_rank[static_cast<std::size_t>(r)]);
    if (it == kinds.end()) {
      kinds.push_back(by_rank[static_cast<std::size_t>(r)]);
      ranks.emplace_back();
      it = kinds.end() - 1;
    }
    ranks[static_cast<std::size_t>(it - kinds.begin())].push_back(r);
  }
  if (kinds.size() <= 1) return {};
  const bool same_sequence = std::all_of(kinds.begin(), kinds.end(), [&](const Fingerprint& k) {
    return k.sequence() == kinds[0].sequence();
  });
  std::string text = same_sequence ? fmt::format("collective desync at #{}{}: ",
                                                  kinds[0].sequence(), group.suffix())
                                   : fmt::format("collective desync{}: ", group.suffix());
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    const char* joint = i == 0 ? "" : (i == 1 ? " but " : " and ");
    text += fmt::format("{}{} called {}", joint, group.name(ranks[i]),
                        kinds[i].describe(!same_sequence));
  }
  text +=
      ". Every rank must issue the same collectives in the same order, with the same dtypes and "
      "shapes: look for a branch on the rank, or on data that differs between ranks (an uneven "
      "last batch, a parameter used on some ranks only), before this call";
  return text;
}

}  // namespace tandem::detail
