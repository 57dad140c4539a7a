#include "parallel/grad_readiness.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::detail {

void GradReadiness::reset(std::vector<std::size_t> bucket_of, std::size_t buckets) {
  TANDEM_CHECK(!in_backward_, "GradReadiness::reset during a backward");
  bucket_of_ = std::move(bucket_of);
  bucket_size_.assign(buckets, 0);
  for (std::size_t b : bucket_of_) ++bucket_size_[b];
  pending_ = bucket_size_;
  ready_.assign(bucket_of_.size(), false);
  next_to_launch_ = 0;
}

bool GradReadiness::start_if_idle() {
  if (in_backward_) return false;
  in_backward_ = true;
  std::fill(ready_.begin(), ready_.end(), false);
  pending_ = bucket_size_;
  next_to_launch_ = 0;
  return true;
}

bool GradReadiness::mark_ready(std::size_t index) {
  if (ready_[index]) return false;
  ready_[index] = true;
  return true;
}

bool GradReadiness::arrive(std::size_t index) { return --pending_[bucket_of_[index]] == 0; }

std::vector<std::size_t> GradReadiness::unready() const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < ready_.size(); ++i) {
    if (!ready_[i]) out.push_back(i);
  }
  return out;
}

void GradReadiness::launch_ready(const std::function<void(std::size_t bucket)>& launch) {
  while (next_to_launch_ < pending_.size() && pending_[next_to_launch_] == 0) {
    launch(next_to_launch_++);
  }
}

void GradReadiness::finish() { in_backward_ = false; }

}  // namespace tandem::detail
