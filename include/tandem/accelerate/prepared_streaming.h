#pragma once
// The prepared streaming loader: a StreamingLoader (tandem/data/
// streaming_loader.h: an iterable dataset, sharded by samples over the
// ranks and workers) made by Accelerator::prepare_streaming_loader, which
// Accelerate's prepare gives a DataLoader over an IterableDataset. Like a
// PreparedLoader it
//   - sends batches to the training device;
//   - reads one batch ahead, so the micro-step controller knows which batch
//     ends the pass (gradients sync there, whatever the accumulation count:
//     Accelerate's end_of_dataloader);
//   - is the training data when it is the first loader prepared: save_state
//     keeps its epoch and position, and load_state makes the next pass skip
//     the batches already handed out (the stream is deterministic for a
//     given epoch, so the same samples follow).
// With split_batches, batch_size is the global batch and each rank takes
// batch_size / num_processes samples per batch. The samples each rank reads
// are those its shards of the stream hold (StreamShard), not a slice of a
// batch the main process drew: tandem does not dispatch iterable data.

#include <cstdint>
#include <memory>
#include <optional>

#include "tandem/data/pull_iterator.h"
#include "tandem/data/streaming_loader.h"

namespace tandem {

namespace detail {
class StepController;
struct LoaderCursor;
struct PreparedAccess;
}  // namespace detail

class PreparedStreamingLoader {
 public:
  ~PreparedStreamingLoader();
  PreparedStreamingLoader(const PreparedStreamingLoader&) = delete;
  PreparedStreamingLoader& operator=(const PreparedStreamingLoader&) = delete;

  // Selects the epoch of the next pass (ends a pass in progress).
  void set_epoch(int64_t epoch);
  // The epoch of the pass in progress, or of the next one after load_state().
  int64_t epoch() const;
  // The next pass drops its first `num_batches` batches.
  void skip_first_batches(int64_t num_batches);
  // The next batch; nullopt at the end of a pass (the next call starts a new
  // one, of the next epoch unless set_epoch() said otherwise).
  std::optional<StreamingLoader::Batch> next();
  // Whether the batch next() returned last is even_batches padding (this
  // rank's data had ended): give it zero weight.
  bool padding() const { return padding_; }
  // Batches handed out in the current pass, skipped ones included.
  int64_t position() const;

  using Iterator = PullIterator<PreparedStreamingLoader, StreamingLoader::Batch>;
  // Starts a pass (ending one in progress, which then restarts its epoch;
  // a skip from skip_first_batches() or load_state() is kept).
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  friend struct detail::PreparedAccess;
  PreparedStreamingLoader(StreamingLoader loader, std::shared_ptr<detail::StepController> controller,
                          std::shared_ptr<detail::LoaderCursor> cursor);

  struct Ahead {
    StreamingLoader::Batch batch;
    bool padding = false;
  };
  void apply_restore();
  std::optional<Ahead> read();
  void end_pass();

  StreamingLoader loader_;
  std::shared_ptr<detail::StepController> controller_;
  std::shared_ptr<detail::LoaderCursor> cursor_;
  std::optional<Ahead> ahead_;  // the batch after the one handed out last
  bool padding_ = false;
};

}  // namespace tandem
