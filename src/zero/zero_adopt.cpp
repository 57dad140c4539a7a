// ZeroLayout's side of tandem::zero::Init: a stage-3 unit that Init cut to
// this rank's shard at construction is adopted as it is when every rank cut
// it in the layout stage 3 uses, gathered back whole when its trainable
// parameters changed since, and refused when the ranks disagree. Parameters
// left holding no memory are refused outside stage 3.

#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "core/torch_internals.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/core/parameters.h"
#include "zero/unit_shard.h"
#include "zero/zero_layout.h"

namespace tandem::detail {

void ZeroLayout::settle_construction_shards(const std::vector<ShardedUnit*>& units,
                                            const std::vector<std::string>& unit_names,
                                            ProcessGroup& pg) {
  // What to do with each unit, agreed by every rank: nothing (built whole),
  // adopt its shard (cut in the layout stage 3 uses), gather it back whole
  // (its trainable parameters changed since the cut), or refuse (cut for
  // another rank or world size). Codes and fingerprints are all-reduced with
  // MAX, negated copies giving the MIN.
  enum Code : int64_t { kWhole = 0, kGatherBack = 1, kAdopt = 2, kOtherLayout = 3 };
  const auto n = static_cast<int64_t>(units.size());
  std::vector<FlatGroup*> group_of_unit(units.size(), nullptr);
  for (auto& group : groups_) {
    auto it = std::find(units.begin(), units.end(), group.unit);
    if (group.unit != nullptr && it != units.end()) group_of_unit[it - units.begin()] = &group;
  }
  constexpr int64_t kSlots = 5;  // code, -code, fingerprint, -fingerprint, written
  at::Tensor votes = at::zeros({kSlots * n}, at::TensorOptions().dtype(at::kLong));
  int64_t* vote = votes.data_ptr<int64_t>();
  for (int64_t u = 0; u < n; ++u) {
    const auto& cut = units[static_cast<std::size_t>(u)]->construction_shard();
    int64_t code = kWhole;
    if (cut != nullptr) {
      FlatGroup* group = group_of_unit[static_cast<std::size_t>(u)];
      bool same_members = group != nullptr && group->members.size() == cut->members.size();
      for (std::size_t k = 0; same_members && k < cut->members.size(); ++k) {
        same_members = params_[group->members[k]].unsafeGetTensorImpl() ==
                       cut->members[k].unsafeGetTensorImpl();
      }
      code = cut->world != world_ || cut->rank != rank_ ? kOtherLayout
             : same_members                             ? kAdopt
                                                        : kGatherBack;
    }
    int64_t* mine = vote + kSlots * u;
    mine[0] = code;
    mine[1] = -code;
    mine[2] = cut != nullptr ? cut->fingerprint : 0;
    mine[3] = cut != nullptr ? -cut->fingerprint : 0;
    mine[4] = cut != nullptr &&
              cut->placeholder->written(cut->full.numel() *
                                        static_cast<int64_t>(cut->full.element_size()));
  }
  pg.all_reduce(votes, ReduceOp::kMax);
  for (int64_t u = 0; u < n; ++u) {
    const std::string& name = unit_names[static_cast<std::size_t>(u)];
    ShardedUnit* unit = units[static_cast<std::size_t>(u)];
    const int64_t* agreed = vote + kSlots * u;
    const int64_t code = agreed[0];
    const auto& cut = unit->construction_shard();
    TANDEM_CHECK_ARG(code != kOtherLayout,
                     "ZeroOptimizer: unit '{}' was cut by tandem::zero::Init for a process group "
                     "other than this optimizer's (rank {} of {} here); make the Init with the "
                     "process group the ZeroOptimizer uses",
                     name, rank_, world_);
    TANDEM_CHECK_ARG(code == -agreed[1],
                     "ZeroOptimizer: unit '{}' was cut by tandem::zero::Init on some ranks and "
                     "built whole on others; make the Init on every rank or on none",
                     name);
    if (code == kWhole) continue;
    TANDEM_CHECK_ARG(agreed[4] == 0,
                     "ZeroOptimizer: parameters of unit '{}' (or of a unit cut before it) were "
                     "written after tandem::zero::Init cut the unit, on some rank; that write "
                     "went nowhere (the unit holds only its shard). A custom initialisation over "
                     "the whole model after the constructors (GPT-2's normal_(0, 0.02) loop, "
                     "for one) must run inside each unit's own constructor instead, or build "
                     "the model without zero::Init",
                     name);
    TANDEM_CHECK_ARG(agreed[2] == -agreed[3],
                     "ZeroOptimizer: the ranks built different values for unit '{}' under "
                     "tandem::zero::Init. Each rank keeps the shard it built itself (there is no "
                     "broadcast from rank 0, as there is without Init), so every rank must build "
                     "the same model: call torch::manual_seed with the same seed on every rank "
                     "before building it",
                     name);
    // From the placeholder back to views of the unit's own (released) buffer.
    for (std::size_t k = 0; k < cut->members.size(); ++k) {
      internals::rebind_parameter_data(cut->members[k], cut->views[k]);
    }
    if (code == kAdopt) {
      group_of_unit[static_cast<std::size_t>(u)]->construction = cut;
    } else {
      // The unit's trainable parameters are no longer the ones cut (one was
      // frozen, or tied outside the unit): make them whole again, then lay
      // the model out as without Init.
      internals::reallocate_storage(cut->full, cut->full.numel() * cut->full.element_size());
      pg.all_gather_into(cut->full, cut->shard);
      log_debug("ZeRO stage 3: unit '{}' changed after zero::Init cut it; gathered it whole",
                name);
    }
    unit->set_construction_shard(nullptr);
  }
}

void ZeroLayout::refuse_memoryless_parameters() const {
  std::vector<bool> adopted_param(params_.size(), false);
  for (const auto& group : groups_) {
    if (group.construction == nullptr) continue;
    for (std::size_t i : group.members) adopted_param[i] = true;
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    TANDEM_CHECK_ARG(adopted_param[i] || holds_memory(params_[i]),
                     "ZeroOptimizer: parameter '{}' holds no memory: its Sharded unit was cut to "
                     "one rank's shard by tandem::zero::Init (or freed by another stage-3 "
                     "ZeroOptimizer). Only a stage-3 ZeroOptimizer adopts a model built under "
                     "zero::Init: set the stage to 3, or build the model without zero::Init",
                     names_[i]);
  }
}

}  // namespace tandem::detail
