#pragma once
// Fingerprints of collectives, compared across ranks to catch a desync (one
// rank calling a different collective, shape or dtype than the others)
// before it hangs or silently mixes unrelated tensors.
//
// A fingerprint is a fixed-size row of int64 fields, so that its exchange is
// itself the same collective on every rank, whatever the ranks called:
// operation, sequence number, dtype, device type, reduce op, root, and the
// first dimensions of the shape plus a hash of the whole shape. Everything
// needed to describe the call in an error travels in the row.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group_ranks.h"

namespace tandem::detail {

enum class CollectiveOp : std::int64_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGather,
  kAllGatherInto,
  kReduceScatter,
  kBarrier,
  kAllGatherBytes,
  kAllToAll,
  kAllToAllUneven,  // dim 0 differs between ranks by design; it reads "*"
  kGather,
  kScatter,
  kNewGroup,  // new_group and split_group
  kLast = kNewGroup,
};

const char* to_string(CollectiveOp op);

struct Fingerprint {
  static constexpr int kFields = 16;
  static constexpr int kMaxDims = 7;  // dims stored; more are covered by the hash
  std::array<std::int64_t, kFields> fields{};

  // `tensor` may be null (barrier, byte gathers); `reduce_op` and `root` are
  // -1 when the operation has none.
  static Fingerprint of(CollectiveOp op, std::uint64_t sequence, const at::Tensor* tensor,
                        std::int64_t reduce_op = -1, std::int64_t root = -1);
  // From a tensor's description instead of the tensor; a size of -1 stands
  // for a dimension that may differ between ranks (shown as "*").
  static Fingerprint of(CollectiveOp op, std::uint64_t sequence, at::ScalarType dtype,
                        c10::DeviceType device, at::IntArrayRef sizes, std::int64_t reduce_op = -1,
                        std::int64_t root = -1);

  std::uint64_t sequence() const;
  // "all_reduce Float[10] (sum)"; with_sequence adds "#7" after the name.
  std::string describe(bool with_sequence) const;
  bool operator==(const Fingerprint& other) const { return fields == other.fields; }
};

// Empty when every rank's fingerprint is equal. Otherwise the UsageError
// message naming the ranks and what each group of them called, e.g.
// "collective desync at #7: rank 0 called all_reduce Float[10] (sum) but
// rank 1 called broadcast Float[12] (root 0)", followed by the likely cause.
// `group` names the ranks (group ranks index `by_rank`).
std::string find_desync(const std::vector<Fingerprint>& by_rank, const GroupRanks& group = {});

}  // namespace tandem::detail
