// tandem::zero::Init: each Sharded unit cut to this rank's shard as its
// constructor returns (see tandem/zero/init.h). The layout is the stage-3
// engine's (lay_out over the unit's trainable parameters in module order), so
// the ZeroOptimizer adopts the shard as it is (zero_adopt.cpp).

#include "tandem/zero/init.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/torch_internals.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "zero/flat_group.h"
#include "zero/unit_shard.h"

namespace tandem {

struct zero::Init::State {
  int world = 1;
  int rank = 0;
  int64_t persistence_threshold = 0;
  c10::Device device = c10::kCPU;  // where cut units live
  int units_cut = 0;
  std::shared_ptr<detail::Placeholder> placeholder;  // the largest so far
  // Parameters already cut by a unit (a nested one): the outer unit leaves them.
  std::unordered_set<const c10::TensorImpl*> cut;
};

namespace {

// The guards alive on this thread, innermost last.
thread_local std::vector<zero::Init::State*> active_inits;

bool cuttable(const std::vector<at::Tensor>& members) {
  const at::Tensor& first = members.front();
  return std::all_of(members.begin(), members.end(), [&](const at::Tensor& p) {
    return p.scalar_type() == first.scalar_type() && p.device() == first.device() &&
           p.layout() == at::kStrided && p.is_contiguous();
  });
}

}  // namespace

namespace zero {

Init::Init(int world_size, int rank, int64_t param_persistence_threshold, c10::Device device)
    : state_(std::make_unique<State>()) {
  TANDEM_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size,
                   "zero::Init: rank {} of world size {} is not a rank; pass the process "
                   "group's world_size() and rank()",
                   rank, world_size);
  TANDEM_CHECK_ARG(param_persistence_threshold >= 0,
                   "zero::Init: param_persistence_threshold must be >= 0, got {}",
                   param_persistence_threshold);
  state_->world = world_size;
  state_->rank = rank;
  state_->persistence_threshold = param_persistence_threshold;
  state_->device = device;
  active_inits.push_back(state_.get());
}

Init::Init(const ProcessGroup& process_group, int64_t param_persistence_threshold,
           c10::Device device)
    : Init(process_group.world_size(), process_group.rank(), param_persistence_threshold,
           device) {}

Init Init::disabled() { return Init(); }

Init::Init(Init&& other) noexcept = default;

Init::~Init() {
  if (state_ == nullptr) return;
  auto it = std::find(active_inits.begin(), active_inits.end(), state_.get());
  if (it != active_inits.end()) active_inits.erase(it);
}

int Init::units_cut() const { return state_ == nullptr ? 0 : state_->units_cut; }

}  // namespace zero

namespace detail {

Placeholder::Placeholder(int64_t nbytes, c10::Device device)
    : bytes(at::full({nbytes}, kSentinel, at::TensorOptions().dtype(at::kByte).device(device))) {
  mark_placeholder(bytes);
}

Placeholder::~Placeholder() { unmark_placeholder(bytes); }

bool Placeholder::written(int64_t nbytes) const {
  return bytes.narrow(0, 0, nbytes).ne(kSentinel).any().item<bool>();
}

namespace {

// FNV-1a over 8-byte words, then the tail byte by byte, of a byte stream
// fed in pieces: the same value whatever the pieces' sizes.
class StreamFingerprint {
 public:
  void add(const unsigned char* bytes, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      word_[filled_++] = bytes[i];
      if (filled_ == 8) {
        uint64_t word;
        std::memcpy(&word, word_, 8);
        h_ = (h_ ^ word) * 1099511628211ULL;
        filled_ = 0;
      }
    }
  }
  void add_zeros(std::size_t n) {
    static const unsigned char zeros[256] = {};
    for (; n > 0; n -= std::min<std::size_t>(n, sizeof zeros)) {
      add(zeros, std::min<std::size_t>(n, sizeof zeros));
    }
  }
  void add(const at::Tensor& tensor) {
    const at::Tensor host = tensor.to(at::kCPU).contiguous();
    add(static_cast<const unsigned char*>(host.data_ptr()), host.nbytes());
  }
  int64_t value() const {
    uint64_t h = h_;
    for (std::size_t i = 0; i < filled_; ++i) h = (h ^ word_[i]) * 1099511628211ULL;
    return static_cast<int64_t>(h >> 1);  // 63 bits: its negation never overflows
  }

 private:
  uint64_t h_ = 1469598103934665603ULL;
  unsigned char word_[8] = {};
  std::size_t filled_ = 0;
};

}  // namespace

int64_t fingerprint_of(const at::Tensor& tensor) {
  StreamFingerprint fingerprint;
  fingerprint.add(tensor);
  return fingerprint.value();
}

void cut_at_construction(ShardedUnit& unit, torch::nn::Module& module) {
  if (active_inits.empty()) return;
  zero::Init::State& init = *active_inits.back();
  std::vector<at::Tensor> members;
  std::vector<int64_t> numels;
  for (const auto& item : unique_named_parameters(module)) {
    if (!item.tensor.requires_grad() || item.tensor.numel() < init.persistence_threshold ||
        init.cut.count(item.tensor.unsafeGetTensorImpl())) {
      continue;
    }
    members.push_back(item.tensor);
    numels.push_back(item.tensor.numel());
  }
  // A unit of mixed dtypes or devices stays whole: the ZeroOptimizer refuses
  // it with the reason when it lays the model out.
  if (members.empty() || !cuttable(members)) return;
  // The unit was built on the host; its cut parameters move to the training
  // device first, so that the shard and the placeholder are made there.
  for (const at::Tensor& member : members) internals::move_parameter_to(member, init.device);
  FlatGroup layout;
  for (std::size_t k = 0; k < members.size(); ++k) layout.members.push_back(k);
  lay_out(layout, numels, init.world, init.rank);

  torch::NoGradGuard no_grad;
  auto shard = std::make_shared<UnitShard>();
  shard->world = init.world;
  shard->rank = init.rank;
  shard->shard_begin = layout.shard_begin;
  // The flat buffer's shape only: nothing touches its memory before it is
  // released, so the unit is never held twice. This rank's slice and the
  // fingerprint of the whole (padding as zeros) are read from the members.
  shard->full = at::empty({layout.padded}, members.front().options().requires_grad(false));
  shard->shard = at::zeros({layout.shard_numel}, shard->full.options());
  StreamFingerprint fingerprint;
  const std::size_t element = shard->full.element_size();
  int64_t written = 0;  // flat elements fingerprinted so far
  const int64_t shard_end = layout.shard_begin + layout.shard_numel;
  for (std::size_t k = 0; k < members.size(); ++k) {
    const int64_t begin = layout.offsets[k];
    const int64_t end = begin + numels[k];
    fingerprint.add_zeros(static_cast<std::size_t>(begin - written) * element);
    const at::Tensor flat = members[k].detach().reshape({-1});
    fingerprint.add(flat);
    written = end;
    const int64_t lo = std::max(begin, layout.shard_begin);
    const int64_t hi = std::min(end, shard_end);
    if (lo < hi) {
      shard->shard.narrow(0, lo - layout.shard_begin, hi - lo)
          .copy_(flat.narrow(0, lo - begin, hi - lo));
    }
    shard->views.push_back(
        internals::flat_alias(shard->full, layout.offsets[k], members[k].sizes()));
    init.cut.insert(members[k].unsafeGetTensorImpl());
  }
  fingerprint.add_zeros(static_cast<std::size_t>(layout.padded - written) * element);
  shard->fingerprint = fingerprint.value();
  internals::release_storage(shard->full);
  // The members point into the placeholder until adoption (see Placeholder);
  // rebinding them frees their own memory.
  const int64_t nbytes = layout.padded * static_cast<int64_t>(shard->full.element_size());
  if (init.placeholder == nullptr || init.placeholder->bytes.numel() < nbytes ||
      init.placeholder->bytes.device() != shard->full.device()) {
    init.placeholder = std::make_shared<Placeholder>(nbytes, shard->full.device());
  }
  shard->placeholder = init.placeholder;
  const at::Tensor typed =
      init.placeholder->bytes.narrow(0, 0, nbytes).view(shard->full.scalar_type());
  for (std::size_t k = 0; k < members.size(); ++k) {
    internals::rebind_parameter_data(
        members[k], internals::flat_alias(typed, layout.offsets[k], members[k].sizes()));
  }
  shard->members = std::move(members);
  unit.set_construction_shard(std::move(shard));
  ++init.units_cut;
}

}  // namespace detail
}  // namespace tandem
