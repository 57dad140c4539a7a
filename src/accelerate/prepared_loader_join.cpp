// PreparedLoader's joined passes (Accelerator::join_uneven_inputs()): exact
// per-rank data, and shadow batches on ranks that run out first, so that
// every rank takes the same number of steps.
//
// One all-gather of the batch counts at the start of the pass decides the
// whole pass: batch i is real on rank r iff i < sizes[r], so every rank
// knows K (the ranks with data) and the last step without further
// communication. A per-batch vote would also serve loaders that cannot count
// ahead, but DistributedLoader always can, and this costs one collective per
// epoch instead of one per step.

#include <algorithm>
#include <string>

#include <ATen/ATen.h>

#include "tandem/accelerate/prepared.h"

#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"

namespace tandem {

void PreparedLoader::begin_joined_pass() {
  TANDEM_CHECK_ARG(group_ != nullptr,
                   "PreparedLoader: a join_uneven_inputs() guard is alive, but this loader was "
                   "built without a process group, so the ranks cannot agree on the pass "
                   "length. Prepare the loader with Accelerator::prepare_data()");
  auto& c = *cursor_;
  const at::Tensor mine = at::full({1}, loader_.size(), at::kLong);
  const std::vector<at::Tensor> all = group_->all_gather(mine);
  joined_ = JoinedPass();
  joined_.sizes.reserve(all.size());
  for (const auto& t : all) joined_.sizes.push_back(t.item<int64_t>());
  joined_.length = *std::max_element(joined_.sizes.begin(), joined_.sizes.end());
  std::string empty;
  for (size_t r = 0; r < joined_.sizes.size(); ++r) {
    if (joined_.sizes[r] == 0) empty += (empty.empty() ? "" : ", ") + std::to_string(r);
  }
  // Every rank sees the same sizes, so every rank throws here together.
  TANDEM_CHECK_ARG(empty.empty() || joined_.length == 0,
                   "join_uneven_inputs: rank(s) {} of {} have no batch at all in this "
                   "epoch (the dataset has {} sample(s) per epoch on this rank), so they have "
                   "nothing to run their shadow steps on. Give every rank at least one sample "
                   "(a larger dataset or fewer processes), or train without join mode "
                   "(even_batches = true pads instead)",
                   empty, group_->world_size(), loader_.num_samples());
  joined_.active = true;
  c.position = std::min(c.skip, joined_.length);
  c.size = joined_.length;
}

std::optional<DistributedLoader::Batch> PreparedLoader::next_joined() {
  auto& c = *cursor_;
  const int64_t index = c.position;
  if (index >= joined_.length) {
    end_of_pass();
    return std::nullopt;
  }
  std::optional<DistributedLoader::Batch> batch;
  if (index < loader_.size()) {
    batch = loader_.next();
    TANDEM_CHECK(batch.has_value(),
                 "PreparedLoader: the loader ended its pass at batch {} of {} (internal error)",
                 index, loader_.size());
    joined_.last_real = *batch;
  } else {
    batch = stand_in_batch();
  }
  note_joined_batch(*batch, index);
  ++c.position;
  return batch;
}

DistributedLoader::Batch PreparedLoader::stand_in_batch() {
  if (joined_.last_real) return *joined_.last_real;
  // The pass resumed (skip_first_batches, load_state) past this rank's data:
  // its last batch of the epoch stands in.
  loader_.skip_first_batches(loader_.size() - 1);
  auto batch = loader_.next();
  TANDEM_CHECK(batch.has_value(), "PreparedLoader: no stand-in batch (internal error)");
  joined_.last_real = batch;
  return *batch;
}

void PreparedLoader::note_joined_batch(const DistributedLoader::Batch& batch, int64_t index) {
  detail::BatchReport report;
  report.last_of_pass = index == joined_.length - 1;
  report.rows = batch.empty() ? 0 : batch[0].size(0);
  // No padding in a joined pass: real_rows_per_rank stays empty.
  report.shadow_ranks.assign(joined_.sizes.size(), 0);
  for (size_t r = 0; r < joined_.sizes.size(); ++r) {
    if (index >= joined_.sizes[r]) report.shadow_ranks[r] = 1;
  }
  report.rank = group_->rank();
  controller_->next_batch(std::move(report));
}

}  // namespace tandem
