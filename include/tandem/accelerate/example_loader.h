#pragma once
// ExampleLoader: a prepared loader over a torch::data dataset whose batches
// are torch::data::Example<> (batch.data, batch.target), the type LibTorch's
// own DataLoader yields with the Stack<> transform. Accelerator::prepare()
// returns it behind a pointer (a std::shared_ptr; torch::data::make_data_loader
// returns a std::unique_ptr), so a loop written for LibTorch's loader runs
// unchanged:
//
//   for (auto& batch : *loader) { ... batch.data ... batch.target ... }
//
// Same sharding, epochs and accumulation reporting as PreparedLoader, which
// it wraps. One training thread.

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include <torch/data/example.h>

#include "tandem/accelerate/prepared.h"
#include "tandem/data/pull_iterator.h"

namespace tandem {

template <typename Target>
class ExampleLoader {
 public:
  using ExampleType = torch::data::Example<at::Tensor, Target>;

  explicit ExampleLoader(std::shared_ptr<PreparedLoader> loader) : loader_(std::move(loader)) {}

  int64_t size() const { return loader_->size(); }
  void set_epoch(int64_t epoch) { loader_->set_epoch(epoch); }
  int64_t epoch() const { return loader_->epoch(); }
  void skip_first_batches(int64_t num_batches) { loader_->skip_first_batches(num_batches); }
  std::optional<ExampleType> next() {
    auto batch = loader_->next();
    if (!batch) return std::nullopt;
    return to_example(std::move(*batch));
  }
  PreparedLoader& prepared() { return *loader_; }

  using Iterator = PullIterator<ExampleLoader, ExampleType>;
  // Starts a new pass (ending one in progress).
  Iterator begin() {
    loader_->start_new_pass();
    return Iterator(this);
  }
  Iterator end() { return Iterator(); }

 private:
  static ExampleType to_example(DistributedLoader::Batch batch) {
    if constexpr (std::is_same_v<Target, torch::data::example::NoTarget>) {
      return ExampleType(std::move(batch[0]));
    } else {
      return ExampleType(std::move(batch[0]), std::move(batch[1]));
    }
  }

  std::shared_ptr<PreparedLoader> loader_;
};

}  // namespace tandem
