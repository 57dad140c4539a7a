#pragma once
// An input iterator over anything with `std::optional<Value> next()`: it
// holds the value next() gave last and ends when next() gives nullopt. What
// a range-for over a loader uses (StreamingLoader, PreparedStreamingLoader,
// ExampleLoader); the loader's begin() starts the pass and constructs one.

#include <cstddef>
#include <iterator>
#include <optional>

namespace tandem {

template <typename Source, typename Value>
class PullIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Value;
  using difference_type = std::ptrdiff_t;
  using pointer = Value*;
  using reference = Value&;

  PullIterator() = default;  // the end
  // Pulls the first value from `source`.
  explicit PullIterator(Source* source) : source_(source), value_(source->next()) {}

  Value& operator*() { return *value_; }
  Value* operator->() { return &*value_; }
  PullIterator& operator++() {
    value_ = source_->next();
    return *this;
  }
  bool operator==(const PullIterator& other) const { return !value_ && !other.value_; }
  bool operator!=(const PullIterator& other) const { return !(*this == other); }

 private:
  Source* source_ = nullptr;
  std::optional<Value> value_;
};

}  // namespace tandem
