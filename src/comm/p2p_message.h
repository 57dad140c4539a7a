#pragma once
// What travels before a point-to-point message's data, on every transport:
// a magic number, the dtype and the element count, so that a recv whose
// tensor disagrees with the send is reported instead of truncating or
// overrunning it (c10d_point_to_point.cpp, shm_mailbox.cpp).

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace tandem::detail {

constexpr std::int64_t kP2pMagic = 0x74616e64656d5032;  // "tandemP2"

struct P2pHeader {
  std::int64_t magic = 0;
  std::int64_t dtype = 0;
  std::int64_t numel = 0;

  static P2pHeader of(const at::Tensor& tensor) {
    return {kP2pMagic, static_cast<std::int64_t>(tensor.scalar_type()), tensor.numel()};
  }
  at::ScalarType scalar_type() const { return static_cast<at::ScalarType>(dtype); }
  // Bytes of data that follow the header.
  std::int64_t data_bytes() const {
    return numel * static_cast<std::int64_t>(c10::elementSize(scalar_type()));
  }
  bool fits(const at::Tensor& tensor) const {
    return scalar_type() == tensor.scalar_type() && numel == tensor.numel();
  }
};
static_assert(sizeof(P2pHeader) == 3 * sizeof(std::int64_t));

// Throws CommError: the message from `peer` does not start with kP2pMagic.
[[noreturn]] void throw_foreign_p2p(const std::string& what, const std::string& peer);
// Throws UsageError: `peer` sent `header` but this rank receives `tensor`.
[[noreturn]] void throw_p2p_mismatch(const std::string& what, const std::string& peer,
                                     const P2pHeader& header, const at::Tensor& tensor);

}  // namespace tandem::detail
