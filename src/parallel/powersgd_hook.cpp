#include "tandem/parallel/powersgd_hook.h"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

// Makes the columns of each matrix of `batch` ([b, n, r], r <= n)
// orthonormal, in place, as PyTorch's _orthogonalize does: Gram-Schmidt for
// r <= 2 and half types, Householder QR otherwise. Both give the same
// columns up to sign, and P Q^T does not depend on the signs.
void orthogonalize(const at::Tensor& batch, double epsilon) {
  const std::int64_t rank = batch.size(2);
  const bool half = batch.scalar_type() == at::kHalf || batch.scalar_type() == at::kBFloat16;
  if (rank > 2 && !half) {
    auto [q, r] = at::linalg_qr(batch, "reduced");
    batch.copy_(q);
    return;
  }
  for (std::int64_t i = 0; i < rank; ++i) {
    at::Tensor col = batch.narrow(2, i, 1);
    at::Tensor norm = at::linalg_vector_norm(col, 2, {1}, /*keepdim=*/true);
    if (epsilon == 0) {
      // A zero column stays zero instead of becoming NaN.
      col.div_(at::where(norm == 0, at::ones_like(norm), norm));
    } else {
      col.div_(norm + epsilon);
    }
    if (i + 1 < rank) {
      at::Tensor rest = batch.narrow(2, i + 1, rank - i - 1);
      rest.sub_(at::sum(col * rest, {1}, /*keepdim=*/true) * col);
    }
  }
}

// One start() of a compressed iteration: the bucket's gradients split into
// the matrices to compress (grouped by shape, in order of first appearance,
// as PyTorch orders them, so P and Q are laid out and drawn as there) and
// the gradients sent as they are.
struct Plan {
  at::Tensor buffer;
  std::vector<at::Tensor> uncompressed;  // gradients, any shape
  std::int64_t uncompressed_numel = 0;
  std::vector<at::Tensor> matrices;  // [1, n, m] views of the buffer
  std::vector<at::Tensor> ps;        // [1, n, r] views of `wire`
  std::vector<at::Tensor> qs;        // [1, m, r] views of the bucket's Q
  std::int64_t p_numel = 0, q_numel = 0;
  at::Tensor wire;        // uncompressed gradients, then every P
  at::Tensor input_copy;  // the gradient before compression (error feedback)
};

}  // namespace

PowerSGDHook::PowerSGDHook(PowerSGDOptions options)
    : options_(options), seed_stream_(options.random_seed) {
  TANDEM_CHECK_ARG(options_.matrix_approximation_rank >= 1,
                   "PowerSGD: matrix_approximation_rank must be at least 1, got {}",
                   options_.matrix_approximation_rank);
  TANDEM_CHECK_ARG(options_.start_powerSGD_iter >= 0,
                   "PowerSGD: start_powerSGD_iter must not be negative, got {}",
                   options_.start_powerSGD_iter);
  TANDEM_CHECK_ARG(
      !(options_.use_error_feedback || options_.warm_start) || options_.start_powerSGD_iter >= 2,
      "PowerSGD: start_powerSGD_iter is {}, but with use_error_feedback or warm_start it must be "
      "at least 2: DDP rebuilds its buckets after the first backward, and the state kept per "
      "bucket must start after that. Set start_powerSGD_iter to 2 or more, or turn both "
      "use_error_feedback and warm_start off",
      options_.start_powerSGD_iter);
  TANDEM_CHECK_ARG(options_.min_compression_rate >= 0,
                   "PowerSGD: min_compression_rate must not be negative, got {}",
                   options_.min_compression_rate);
  TANDEM_CHECK_ARG(options_.orthogonalization_epsilon >= 0,
                   "PowerSGD: orthogonalization_epsilon must not be negative, got {}",
                   options_.orthogonalization_epsilon);
}

std::uint64_t PowerSGDHook::next_seed() {
  // numpy's legacy randint(high) for a range within 32 bits: 32-bit draws
  // masked to the smallest 2^k - 1 >= high - 1, rejected above it.
  constexpr std::uint32_t kLargest = 999'999'999;
  constexpr std::uint32_t kMask = (1u << 30) - 1;
  for (;;) {
    const std::uint32_t draw = static_cast<std::uint32_t>(seed_stream_()) & kMask;
    if (draw <= kLargest) return draw;
  }
}

at::Tensor PowerSGDHook::error(std::size_t index) const {
  auto it = buckets_.find(index);
  return it == buckets_.end() ? at::Tensor() : it->second.error;
}

PowerSGDState PowerSGDHook::state() const {
  PowerSGDState out;
  out.iteration = iteration_;
  std::ostringstream stream;
  stream << seed_stream_;
  out.seed_stream = stream.str();
  out.numel_before_compression = numel_before_;
  out.numel_after_compression = numel_after_;
  for (const auto& [index, bucket] : buckets_) {
    if (bucket.error.defined()) out.errors.emplace(index, bucket.error.clone());
    if (bucket.q.defined()) out.qs.emplace(index, bucket.q.clone());
  }
  return out;
}

void PowerSGDHook::load_state(const PowerSGDState& state) {
  TANDEM_CHECK_ARG(state.iteration >= 0,
                   "PowerSGDHook::load_state: the iteration must not be negative, got {}",
                   state.iteration);
  std::mt19937 seed_stream = seed_stream_;
  if (!state.seed_stream.empty()) {
    std::istringstream stream(state.seed_stream);
    stream >> seed_stream;
    TANDEM_CHECK_ARG(!stream.fail(),
                     "PowerSGDHook::load_state: the seed stream '{:.40}...' is not a "
                     "std::mt19937 state; pass what PowerSGDHook::state() returned",
                     state.seed_stream);
  }
  std::map<std::size_t, BucketState> buckets;
  // Copies: the hook writes them in place, and the caller's state stays as
  // it was (it may be loaded again).
  if (options_.use_error_feedback) {
    for (const auto& [index, error] : state.errors) {
      buckets[index].error = error.reshape({-1}).clone();
    }
  }
  if (options_.warm_start) {
    for (const auto& [index, q] : state.qs) buckets[index].q = q.reshape({-1}).clone();
  }
  iteration_ = state.iteration;
  seed_stream_ = seed_stream;
  numel_before_ = state.numel_before_compression;
  numel_after_ = state.numel_after_compression;
  buckets_ = std::move(buckets);
}

HookWork PowerSGDHook::start(GradBucket& bucket) {
  ProcessGroup& pg = bucket.process_group();
  const bool compress = iteration_ >= options_.start_powerSGD_iter;
  if (bucket.is_last()) ++iteration_;  // every start() of this iteration decided already
  if (!compress) return HookWork(pg.all_reduce_async(bucket.buffer(), ReduceOp::kAvg));
  if (iteration_ == options_.start_powerSGD_iter + 1 && bucket.is_last()) {
    log_debug("PowerSGD: compression starts at iteration {}", options_.start_powerSGD_iter);
  }

  auto plan = std::make_shared<Plan>();
  plan->buffer = bucket.buffer();
  BucketState& state = buckets_[bucket.index()];
  // Loaded state (load_state) comes as the checkpoint holds it: on the CPU.
  const auto on_bucket = [&](at::Tensor& t) {
    if (t.defined() && (t.device() != plan->buffer.device() ||
                        t.scalar_type() != plan->buffer.scalar_type())) {
      t = t.to(plan->buffer.options());
    }
  };
  on_bucket(state.error);
  on_bucket(state.q);
  if (options_.use_error_feedback) {
    if (state.error.defined()) {
      TANDEM_CHECK(state.error.numel() == plan->buffer.numel(),
                   "PowerSGD: bucket {} holds {} elements, but its error feedback {}: the "
                   "buckets changed after compression started. PowerSGD keeps its state per "
                   "bucket index: give it the same buckets in every iteration",
                   bucket.index(), plan->buffer.numel(), state.error.numel());
      plan->buffer.add_(state.error);
    } else {
      state.error = at::zeros_like(plan->buffer);
    }
    // Kept between iterations: a fresh bucket-sized tensor every step costs
    // its page faults again (30 ms for 50 MB here).
    if (!state.input_copy.defined()) state.input_copy = at::empty_like(plan->buffer);
    plan->input_copy = state.input_copy;
    plan->input_copy.copy_(plan->buffer);
  }

  // Which gradients to compress; Ps and Qs are laid out shape group by
  // shape group.
  std::vector<std::pair<std::vector<std::int64_t>, std::vector<at::Tensor>>> groups;
  const std::int64_t rank_cap = options_.matrix_approximation_rank;
  for (const at::Tensor& grad : bucket.gradients()) {
    if (grad.numel() == 0) continue;
    const std::int64_t n = grad.dim() == 0 ? 1 : grad.size(0);
    const std::int64_t m = grad.numel() / n;
    const std::int64_t r = std::min({n, m, rank_cap});
    numel_before_ += n * m;
    if (static_cast<double>((n + m) * r) * options_.min_compression_rate <
        static_cast<double>(n * m)) {
      numel_after_ += (n + m) * r;
      std::vector<std::int64_t> shape{n, m};
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& group) { return group.first == shape; });
      if (it == groups.end()) {
        it = groups.insert(groups.end(), std::make_pair(shape, std::vector<at::Tensor>()));
      }
      it->second.push_back(grad.view({1, n, m}));
      plan->p_numel += n * r;
      plan->q_numel += m * r;
    } else {
      numel_after_ += n * m;
      plan->uncompressed.push_back(grad);
      plan->uncompressed_numel += grad.numel();
    }
  }
  for (auto& group : groups) {
    for (auto& matrix : group.second) plan->matrices.push_back(std::move(matrix));
  }

  bool fresh_q = !options_.warm_start || !state.q.defined();
  if (!fresh_q && state.q.numel() != plan->q_numel) {
    TANDEM_THROW(Error,
                 "PowerSGD: bucket {} needs {} elements of Q, but kept {}: the buckets changed "
                 "after compression started. PowerSGD keeps its state per bucket index: give it "
                 "the same buckets in every iteration",
                 bucket.index(), plan->q_numel, state.q.numel());
  }
  if (fresh_q) state.q = at::empty({plan->q_numel}, plan->buffer.options());
  plan->wire = at::empty({plan->uncompressed_numel + plan->p_numel}, plan->buffer.options());
  std::int64_t p_offset = plan->uncompressed_numel, q_offset = 0;
  for (const at::Tensor& matrix : plan->matrices) {
    const std::int64_t n = matrix.size(1), m = matrix.size(2), r = std::min({n, m, rank_cap});
    plan->ps.push_back(plan->wire.narrow(0, p_offset, n * r).view({1, n, r}));
    plan->qs.push_back(state.q.narrow(0, q_offset, m * r).view({1, m, r}));
    p_offset += n * r;
    q_offset += m * r;
  }

  // Q: fresh from PyTorch's seed stream (the same on every rank), or last
  // iteration's, orthogonalised again either way.
  at::Generator generator;
  if (fresh_q) generator = at::detail::createCPUGenerator(next_seed());
  for (const at::Tensor& q : plan->qs) {
    if (fresh_q) q.copy_(at::randn(q.sizes(), generator, q.options().device(at::kCPU)));
    orthogonalize(q, options_.orthogonalization_epsilon);
  }
  for (std::size_t k = 0; k < plan->matrices.size(); ++k) {
    at::bmm_out(plan->ps[k], plan->matrices[k], plan->qs[k]);
  }
  std::int64_t offset = 0;
  for (const at::Tensor& grad : plan->uncompressed) {
    plan->wire.narrow(0, offset, grad.numel()).copy_(grad.reshape({-1}));
    offset += grad.numel();
  }

  // The uncompressed gradients and the Ps are summed in one all-reduce;
  // then Q = M^T P is averaged, and M becomes P Q^T.
  const std::size_t index = bucket.index();
  const double epsilon = options_.orthogonalization_epsilon;
  Work sum_ps = pg.all_reduce_async(plan->wire, ReduceOp::kSum);
  return HookWork(std::move(sum_ps), [this, plan, index, epsilon, &pg] {
    const int world = pg.world_size();
    std::int64_t offset = 0;
    at::Tensor averaged = plan->wire.narrow(0, 0, plan->uncompressed_numel).div_(world);
    for (const at::Tensor& grad : plan->uncompressed) {
      grad.copy_(averaged.narrow(0, offset, grad.numel()).view(grad.sizes()));
      offset += grad.numel();
    }
    for (std::size_t k = 0; k < plan->matrices.size(); ++k) {
      orthogonalize(plan->ps[k], epsilon);
      // Q = M^T P, computed as (P^T M)^T: a product over M's rows as
      // stored, about 20x faster on the CPU than over its transpose
      // (2048 x 2048, rank 4, one thread: 1 ms against 21).
      plan->qs[k].copy_(at::bmm(plan->ps[k].transpose(1, 2), plan->matrices[k]).transpose(1, 2));
    }
    at::Tensor q = buckets_.at(index).q;
    Work sum_qs = pg.all_reduce_async(q, ReduceOp::kSum);
    return HookWork(std::move(sum_qs), [this, plan, index, q, world] {
      q.div_(world);
      for (std::size_t k = 0; k < plan->matrices.size(); ++k) {
        at::bmm_out(plan->matrices[k], plan->ps[k], plan->qs[k].transpose(1, 2));
      }
      BucketState& state = buckets_.at(index);
      if (options_.use_error_feedback) at::sub_out(state.error, plan->input_copy, plan->buffer);
      if (!options_.warm_start) state.q = at::Tensor();
      return HookWork();
    });
  });
}

}  // namespace tandem
