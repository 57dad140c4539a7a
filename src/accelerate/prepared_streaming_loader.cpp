// PreparedStreamingLoader (tandem/accelerate/prepared_streaming.h): a
// StreamingLoader that reports its batches to the micro-step controller,
// one batch ahead so that the last batch of a pass is known when it is
// handed out, and keeps the training cursor that checkpoints save.

#include "tandem/accelerate/prepared_streaming.h"

#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "tandem/core/error.h"

namespace tandem {

PreparedStreamingLoader::PreparedStreamingLoader(StreamingLoader loader,
                                                 std::shared_ptr<detail::StepController> controller,
                                                 std::shared_ptr<detail::LoaderCursor> cursor)
    : loader_(std::move(loader)), controller_(std::move(controller)), cursor_(std::move(cursor)) {
  cursor_->size = -1;  // a stream's length is not known ahead
  cursor_->epoch = loader_.epoch();
}

PreparedStreamingLoader::~PreparedStreamingLoader() = default;

int64_t PreparedStreamingLoader::epoch() const { return cursor_->epoch; }

int64_t PreparedStreamingLoader::position() const { return cursor_->position; }

void PreparedStreamingLoader::apply_restore() {
  if (!cursor_->restore_pending) return;
  cursor_->restore_pending = false;
  loader_.set_epoch(cursor_->epoch);
  cursor_->in_pass = false;
  ahead_.reset();
}

void PreparedStreamingLoader::set_epoch(int64_t epoch) {
  apply_restore();
  auto& c = *cursor_;
  if (epoch != c.epoch) c.skip = 0;  // a resumed position belongs to its own epoch
  loader_.set_epoch(epoch);
  c.epoch = epoch;
  c.epoch_set = true;
  c.in_pass = false;
  ahead_.reset();
}

void PreparedStreamingLoader::skip_first_batches(int64_t num_batches) {
  TANDEM_CHECK_ARG(num_batches >= 0,
                   "PreparedStreamingLoader::skip_first_batches: num_batches must be >= 0, got "
                   "{}; pass the number of batches of this pass already consumed",
                   num_batches);
  apply_restore();
  cursor_->skip = num_batches;
  cursor_->in_pass = false;
  ahead_.reset();
}

PreparedStreamingLoader::Iterator PreparedStreamingLoader::begin() {
  apply_restore();
  cursor_->in_pass = false;  // the pass in progress restarts (completed_passes unchanged)
  ahead_.reset();
  return Iterator(this);
}

std::optional<PreparedStreamingLoader::Ahead> PreparedStreamingLoader::read() {
  std::optional<StreamingLoader::Batch> batch = loader_.next();
  if (!batch) return std::nullopt;
  return Ahead{std::move(*batch), loader_.padding()};
}

std::optional<StreamingLoader::Batch> PreparedStreamingLoader::next() {
  controller_->at_step_boundary();  // the last step is over: preemption may stop here
  apply_restore();
  auto& c = *cursor_;
  if (!c.in_pass) {
    if (!c.epoch_set && loader_.epoch() != c.completed_passes) {
      loader_.set_epoch(c.completed_passes);
    }
    c.epoch = loader_.epoch();
    loader_.skip_first_batches(c.skip);
    c.position = c.skip;
    c.skip = 0;
    c.in_pass = true;
    ahead_ = read();
  }
  if (!ahead_) {
    end_pass();
    return std::nullopt;
  }
  Ahead current = std::move(*ahead_);
  ahead_ = read();
  padding_ = current.padding;
  detail::BatchReport report;
  report.last_of_pass = !ahead_.has_value();
  report.rows = current.batch.empty() ? 0 : current.batch[0].size(0);
  controller_->next_batch(std::move(report));
  ++c.position;
  return std::move(current.batch);
}

void PreparedStreamingLoader::end_pass() {
  auto& c = *cursor_;
  c.in_pass = false;
  c.completed_passes = loader_.epoch() + 1;
  c.epoch_set = false;
  ahead_.reset();
  controller_->end_of_pass();
}

}  // namespace tandem
