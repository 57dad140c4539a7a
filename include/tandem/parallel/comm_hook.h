#pragma once
// DDP communication hooks: what DistributedDataParallel does with a bucket
// of gradients once the bucket is complete, as in PyTorch's
// DistributedDataParallel.register_comm_hook.
//
// A hook gets a GradBucket (this rank's flat gradients, their parameters and
// the process group) and must leave in the bucket's buffer what every rank
// agrees the gradient is, usually the average. It starts its collectives and
// returns a HookWork: the collective in flight and the step to run once it
// has finished, which may start another collective. DDP starts each bucket's
// hook as soon as the bucket is complete, during backward, and runs the
// steps at the end of backward, so communication overlaps the rest of
// backward as with the built-in average.
//
//   class Fp16Average : public tandem::CommHook {
//    public:
//     tandem::HookWork start(tandem::GradBucket& bucket) override {
//       at::Tensor wire = bucket.buffer().to(at::kHalf);
//       tandem::Work work = bucket.process_group().all_reduce_async(wire, tandem::ReduceOp::kAvg);
//       return tandem::HookWork(std::move(work), [wire, out = bucket.buffer()] {
//         out.copy_(wire);
//         return tandem::HookWork();  // done
//       });
//     }
//     std::string name() const override { return "fp16_average"; }
//   };
//   ddp.register_comm_hook(std::make_shared<Fp16Average>());
//
// Every rank must issue the same collectives in the same order: a hook's
// decisions may depend on its own state and the bucket's shapes, never on
// values that differ between ranks.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"
#include "tandem/comm/work.h"

namespace tandem {

// One bucket of gradients, as a hook sees it. The buffer is this rank's flat
// gradients; gradients()[k] is parameters()[k]'s gradient, a view of the
// buffer at offsets()[k]. Writing the buffer writes the parameters' .grad.
// A GradBucket lives as long as its bucket's layout: DDP rebuilds its
// buckets once, after the first synchronised backward, so a hook that keeps
// state per bucket index should start keeping it from the second backward.
class GradBucket {
 public:
  // `buffer` is 1-D and holds the parameters' gradients back to back, in
  // order (their numels must add up to its length); `process_group` must
  // outlive the bucket. Tests and hooks may build buckets themselves.
  GradBucket(std::size_t index, std::size_t bucket_count, at::Tensor buffer,
             std::vector<at::Tensor> parameters, std::vector<std::string> parameter_names,
             ProcessGroup& process_group);

  // Position in launch order: 0 is reduced first.
  std::size_t index() const { return index_; }
  std::size_t bucket_count() const { return bucket_count_; }
  // The last bucket of a backward (PyTorch's is_last()): a hook that counts
  // iterations counts here.
  bool is_last() const { return index_ + 1 == bucket_count_; }
  const at::Tensor& buffer() const { return buffer_; }
  const std::vector<at::Tensor>& gradients() const { return gradients_; }
  const std::vector<std::int64_t>& offsets() const { return offsets_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const std::vector<std::string>& parameter_names() const { return names_; }
  ProcessGroup& process_group() const { return *process_group_; }

 private:
  std::size_t index_;
  std::size_t bucket_count_;
  at::Tensor buffer_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> gradients_;
  std::vector<std::int64_t> offsets_;
  ProcessGroup* process_group_;
};

// A hook's reduction of one bucket in flight: a collective (Work) and the
// step to run once it has finished. The step returns what comes next: a
// HookWork with another collective, or HookWork() when the bucket's buffer
// holds its result. Move-only.
class HookWork {
 public:
  // Nothing in flight and nothing left to do.
  HookWork() = default;
  explicit HookWork(Work work, std::function<HookWork()> then = nullptr);
  // A moved-from HookWork is done(). Assigning over one that is not done
  // drops its collective unwaited: let it finish first.
  HookWork(HookWork&& other) noexcept;
  HookWork& operator=(HookWork&& other) noexcept;

  bool done() const { return done_; }
  // Waits for the collective, runs the step and becomes what it returned.
  // No-op when done(). Rethrows what the wait or the step throws.
  void advance();
  // advance() until done().
  void wait();

 private:
  Work work_;
  std::function<HookWork()> then_;
  bool done_ = true;
};

// The interface of a communication hook. DDP calls start() once per bucket
// and synchronised backward, in bucket order, on the thread running
// backward, and the returned steps at the end of that backward, before
// backward() returns; never two calls at once, and under the wrapper's lock
// (a hook must not call its DistributedDataParallel). A hook object belongs
// to one DistributedDataParallel (it may keep per-bucket state); the wrapper
// shares its ownership.
class CommHook {
 public:
  // The built-in hooks, chosen by DDPOptions::comm_hook (tandem YAML:
  // `ddp.comm_hook`); DDP builds one for itself.
  enum Builtin {
    kAverage,       // the average in the gradients' dtype (AllReduceHook)
    kFp16Compress,  // averaged as fp16 (CompressHook: where bytes halve)
    kBf16Compress,  // averaged as bf16, fp32's range (CompressHook)
    kPowerSGD,      // low-rank compression with error feedback (PowerSGDHook)
  };

  virtual ~CommHook() = default;
  // Starts reducing `bucket`; see HookWork. The bucket stays valid until
  // the returned work is done.
  virtual HookWork start(GradBucket& bucket) = 0;
  // Short name for logs and errors ("average", "fp16_compress", ...).
  virtual std::string name() const = 0;
};

// kAverage: one all-reduce (kAvg) of the buffer, in place.
class AllReduceHook : public CommHook {
 public:
  HookWork start(GradBucket& bucket) override;
  std::string name() const override { return "average"; }
};

// kFp16Compress / kBf16Compress: the buffer is cast to `wire_dtype`,
// averaged, and cast back. What travels depends on the transport, which
// reduces 16-bit tensors as it reduces them for any caller:
//   NCCL (CUDA tensors): 16-bit on the wire, half the bytes; NCCL sums in
//     16 bits, then the sum is divided by the world size.
//   shared memory (CPU, every rank on one host, the default there): 16-bit
//     copies through the segment, half the bytes; summed in fp32 and
//     rounded once.
//   Gloo (CPU across hosts, the hierarchical path, or TANDEM_SHM=0):
//     widened to fp32 before the reduction, so the bytes on the wire are
//     fp32's, not halved; summed in fp32 and rounded once.
// PyTorch's fp16_compress_hook divides by the world size in fp16 first and
// sums in fp16, so results differ from tandem's CPU paths in the last bits
// (tandem's round once, at the end).
class CompressHook : public CommHook {
 public:
  // `wire_dtype` must be a floating type (at::kHalf or at::kBFloat16).
  explicit CompressHook(at::ScalarType wire_dtype);
  HookWork start(GradBucket& bucket) override;
  std::string name() const override;

 private:
  at::ScalarType wire_dtype_;
};

// A CommHook that calls `hook`, for hooks written as a lambda.
class FunctionHook : public CommHook {
 public:
  explicit FunctionHook(std::function<HookWork(GradBucket&)> hook, std::string name = "function");
  HookWork start(GradBucket& bucket) override { return hook_(bucket); }
  std::string name() const override { return name_; }

 private:
  std::function<HookWork(GradBucket&)> hook_;
  std::string name_;
};

}  // namespace tandem
