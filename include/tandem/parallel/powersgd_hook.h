#pragma once
// PowerSGD gradient compression (Vogels et al., 2019) as a DDP communication
// hook, with the semantics of PyTorch's powerSGD_hook
// (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook).
//
// Each gradient of a bucket is viewed as a matrix M (its first dimension
// by the rest). Those that compress enough are sent as two thin matrices:
//   Q: M's columns by r, random at first (the same on every rank), then
//      reused across iterations (warm start);
//   P = M Q, summed over ranks, orthogonalised;
//   Q = M^T P, averaged over ranks;
//   M is replaced by P Q^T.
// The rest (biases, small or square-ish matrices) are averaged as they are.
// With error feedback, what compression lost on this rank (the gradient it
// put in minus P Q^T) is added to its next gradient for the same bucket.
// Before `start_powerSGD_iter` iterations, buckets are plainly averaged.
//
//   tandem::DDPOptions options;
//   options.comm_hook = tandem::CommHook::kPowerSGD;
//   options.powersgd.matrix_approximation_rank = 2;
//   tandem::DistributedDataParallel ddp(model, pg, options);
//
// Differences from PyTorch, which change nothing in the result beyond
// rounding: the uncompressed gradients and the P matrices travel in one
// all-reduce instead of two; a column that is all zeros orthogonalises to
// zeros (PyTorch's Gram-Schmidt divides by its zero norm and yields NaN).
// batch_tensors_with_same_shape is not offered.

#include <cstdint>
#include <map>
#include <random>
#include <string>

#include <ATen/core/Tensor.h>

#include "tandem/parallel/comm_hook.h"

namespace tandem {

// PyTorch's PowerSGDState hyperparameters, same names and defaults.
struct PowerSGDOptions {
  // r: the columns of P and Q; lower compresses more. Typically 1 to 4.
  std::int64_t matrix_approximation_rank = 1;
  // Iterations (synchronised backwards) plainly averaged before compression
  // starts. At least 2 with error feedback or warm start: DDP rebuilds its
  // buckets after the first backward, and per-bucket state must not predate
  // the rebuild (PyTorch has the same rule).
  std::int64_t start_powerSGD_iter = 1000;
  // A matrix n x m is compressed only when
  // (n + m) * r * min_compression_rate < n * m; otherwise averaged as is.
  double min_compression_rate = 2.0;
  bool use_error_feedback = true;
  // Reuse each bucket's Q from the previous iteration instead of drawing a
  // new random one.
  bool warm_start = true;
  // Added to each column's norm in Gram-Schmidt (0: none).
  double orthogonalization_epsilon = 0.0;
  // Seeds the draws of Q. PyTorch's seed stream: a numpy RandomState(seed)
  // draws randint(1e9) per fresh Q, which seeds a CPU generator for
  // torch.randn; tandem draws the same numbers, so the same seed gives the
  // same Q as PyTorch.
  std::uint32_t random_seed = 0;
};

// What a PowerSGDHook carries from one backward to the next (what PyTorch's
// PowerSGDState pickles): for a checkpoint, so that training resumes as if
// it had never stopped. Everything but `errors` is the same on every rank.
struct PowerSGDState {
  // Synchronised backwards seen (PowerSGDHook::iteration()).
  std::int64_t iteration = 0;
  // The position in the seed stream of fresh Qs (std::mt19937's text form):
  // a resumed run draws the Qs the uninterrupted one would have drawn.
  std::string seed_stream;
  std::int64_t numel_before_compression = 0;
  std::int64_t numel_after_compression = 0;
  // By bucket index, 1-D: this rank's error feedback (it differs between
  // ranks) and the warm-start Q (averaged, so equal on every rank). Only the
  // buckets that have been compressed have them.
  std::map<std::size_t, at::Tensor> errors;
  std::map<std::size_t, at::Tensor> qs;
};

class PowerSGDHook : public CommHook {
 public:
  // Throws UsageError for a rank below 1, a negative start iteration, a
  // start iteration below 2 with error feedback or warm start, or a
  // compression rate or epsilon below 0.
  explicit PowerSGDHook(PowerSGDOptions options = {});

  HookWork start(GradBucket& bucket) override;
  std::string name() const override { return "powersgd"; }

  const PowerSGDOptions& options() const { return options_; }
  // Synchronised backwards seen so far (PyTorch's state.iter).
  std::int64_t iteration() const { return iteration_; }
  // Elements of the gradients that went through compressed iterations, and
  // what was sent for them (P, Q and the uncompressed gradients); their
  // ratio is the compression rate (PyTorch's compression_stats()).
  std::int64_t numel_before_compression() const { return numel_before_; }
  std::int64_t numel_after_compression() const { return numel_after_; }
  // This rank's error feedback for bucket `index` (undefined before the
  // bucket's first compressed iteration). For tests and inspection.
  at::Tensor error(std::size_t index) const;

  // A copy of the hook's state (tensors cloned). Call between backwards.
  PowerSGDState state() const;
  // Continues from `state` (a state() of a hook with the same options): the
  // iteration count, the seed stream and, per bucket, the error feedback
  // and Q, which must belong to the same bucket layout
  // (DistributedDataParallel::bucket_parameter_names(); restore it with
  // set_bucket_layout()): a bucket whose sizes differ throws at its next
  // start(). Errors are ignored without use_error_feedback, Qs without
  // warm_start. Call between backwards, on every rank, with each rank's own
  // state (same world size) or with empty `errors` and `qs`, which then
  // start afresh as at compression's start. UsageError for a negative
  // iteration or an unreadable seed stream; nothing changes then.
  void load_state(const PowerSGDState& state);

 private:
  struct BucketState {
    at::Tensor error;       // what compression lost, added to the next gradient
    at::Tensor q;           // every Q of the bucket, back to back (warm start)
    at::Tensor input_copy;  // the gradient before compression, reused each time
  };

  // Next seed for a fresh set of Qs, as numpy's RandomState.randint(1e9).
  std::uint64_t next_seed();

  PowerSGDOptions options_;
  std::int64_t iteration_ = 0;
  std::int64_t numel_before_ = 0;
  std::int64_t numel_after_ = 0;
  std::map<std::size_t, BucketState> buckets_;
  std::mt19937 seed_stream_;  // numpy's RandomState(random_seed) draws from the same
};

}  // namespace tandem
