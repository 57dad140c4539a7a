#include <algorithm>

#include "tandem/accelerate/prepared.h"

#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "tandem/core/error.h"

namespace tandem {

PreparedLoader::PreparedLoader(DistributedLoader loader,
                               std::shared_ptr<detail::StepController> controller,
                               std::shared_ptr<detail::LoaderCursor> cursor,
                               std::shared_ptr<ProcessGroup> group)
    : loader_(std::move(loader)),
      controller_(std::move(controller)),
      cursor_(std::move(cursor)),
      group_(std::move(group)),
      even_batches_(loader_.options().even_batches) {
  cursor_->size = loader_.size();
  cursor_->epoch = loader_.epoch();
}

PreparedLoader::~PreparedLoader() = default;

int64_t PreparedLoader::epoch() const { return cursor_->epoch; }

int64_t PreparedLoader::position() const { return cursor_->position; }

void PreparedLoader::set_loader_epoch(int64_t epoch) {
  loader_.set_epoch(epoch);
  cursor_->epoch = epoch;
}

void PreparedLoader::apply_restore() {
  if (!cursor_->restore_pending) return;
  cursor_->restore_pending = false;
  set_loader_epoch(cursor_->epoch);
  loader_.skip_first_batches(cursor_->skip);
  cursor_->in_pass = false;
  ++pass_id_;
}

void PreparedLoader::set_epoch(int64_t epoch) {
  apply_restore();
  set_loader_epoch(epoch);
  cursor_->epoch_set = true;
  cursor_->in_pass = false;
  ++pass_id_;
}

void PreparedLoader::skip_first_batches(int64_t num_batches) {
  apply_restore();
  loader_.skip_first_batches(num_batches);
  cursor_->skip = num_batches;
  cursor_->in_pass = false;
  ++pass_id_;
}

void PreparedLoader::start_new_pass() {
  apply_restore();
  // set_epoch to the same epoch ends a pass in progress and keeps a pending
  // skip, exactly what DistributedLoader::begin() does.
  set_loader_epoch(loader_.epoch());
  cursor_->in_pass = false;
  ++pass_id_;
}

std::optional<DistributedLoader::Batch> PreparedLoader::next() {
  controller_->at_step_boundary();  // the last step is over: preemption may stop here
  apply_restore();
  auto& c = *cursor_;
  if (!c.in_pass) {
    if (!c.epoch_set && loader_.epoch() != c.completed_passes) {
      set_loader_epoch(c.completed_passes);
    }
    // A joined pass never pads; other passes keep the loader's own setting.
    // Switching keeps a pending skip.
    const bool join = controller_->join_requested();
    const bool even = !join && even_batches_;
    if (loader_.options().even_batches != even) loader_.set_even_batches(even);
    c.size = loader_.size();
    if (join) {
      begin_joined_pass();  // sets c.position and c.size
    } else {
      joined_ = JoinedPass();
      c.position = std::min(c.skip, loader_.size());
    }
    c.skip = 0;
    c.in_pass = true;
  }
  if (joined_.active) return next_joined();
  auto batch = loader_.next();
  if (!batch) {
    end_of_pass();
    return batch;
  }
  note_batch(*batch);
  ++c.position;
  return batch;
}

void PreparedLoader::end_of_pass() {
  auto& c = *cursor_;
  c.in_pass = false;
  c.completed_passes = loader_.epoch() + 1;
  c.epoch_set = false;
  controller_->end_of_pass();
  if (joined_.active) {
    joined_ = JoinedPass();
    // A short rank's loader may still be mid-pass (shadow steps never drain
    // it), or hold the pass's skip unused (it resumed past its data): end
    // the pass and drop the skip, keeping the epoch.
    loader_.skip_first_batches(0);
  }
}

void PreparedLoader::note_batch(const DistributedLoader::Batch& batch) {
  const int64_t index = cursor_->position;
  const auto& sampler = loader_.sampler();
  const auto& options = loader_.options();
  detail::BatchReport report;
  report.last_of_pass = index == loader_.size() - 1;
  report.rows = batch.empty() ? 0 : batch[0].size(0);
  using Sharding = DistributedLoaderOptions::Sharding;
  if (options.sharding != Sharding::kSamples) {
    // Accelerate's sharding (kBatches, kDispatched) pads only the pass's last
    // round, where every rank holds as many rows, completing it from the
    // epoch's first samples: of the last batches gathered in rank order,
    // the first n % (batch_size * world) rows are real (Accelerate's
    // gather_for_metrics keeps that many). Dispatching pads whatever
    // even_batches says, as Accelerate's DataLoaderDispatcher does.
    const bool padded = !options.drop_last &&
                        (options.even_batches || options.sharding == Sharding::kDispatched);
    const int64_t world = sampler.num_replicas();
    const int64_t remainder = sampler.dataset_size() % (options.batch_size * world);
    if (padded && report.last_of_pass && remainder > 0) {
      report.real_rows_per_rank.resize(static_cast<size_t>(world));
      for (int64_t r = 0; r < world; ++r) {
        report.real_rows_per_rank[static_cast<size_t>(r)] =
            std::clamp<int64_t>(remainder - r * report.rows, 0, report.rows);
      }
    }
  } else if (options.even_batches && !sampler.drop_last()) {
    // Without even-batch padding (or with drop_last) there is nothing to
    // remove, and ranks may hold different row counts: gather_for_metrics
    // keeps every row it receives.
    // Padding takes the last positions p >= n of the padded list; position p
    // is entry p / world of rank p % world. So rank r's entry j is real iff
    // j * world + r < n, and its real entries are a prefix of its list.
    const int64_t world = sampler.num_replicas();
    const int64_t n = sampler.dataset_size();
    const int64_t first = index * options.batch_size;
    report.real_rows_per_rank.resize(static_cast<size_t>(world));
    for (int64_t r = 0; r < world; ++r) {
      const int64_t real_entries = n > r ? (n - r + world - 1) / world : 0;
      report.real_rows_per_rank[static_cast<size_t>(r)] =
          std::clamp<int64_t>(real_entries - first, 0, report.rows);
    }
  }
  controller_->next_batch(std::move(report));
}

PreparedLoader::Iterator::Iterator(PreparedLoader* loader)
    : loader_(loader), pass_id_(loader->pass_id_) {
  batch_ = loader_->next();
}

PreparedLoader::Iterator& PreparedLoader::Iterator::operator++() {
  TANDEM_CHECK_ARG(loader_->pass_id_ == pass_id_,
                   "PreparedLoader: set_epoch() or skip_first_batches() was called while a "
                   "range-for loop over the loader was running; call them before the loop "
                   "(they apply to the next pass)");
  batch_ = loader_->next();
  return *this;
}

PreparedLoader::Iterator PreparedLoader::begin() {
  start_new_pass();
  return Iterator(this);
}

}  // namespace tandem
