#pragma once
// Gradient readiness during one backward, shared by DDP's reducer and ZeRO's
// backward: which parameters' gradients arrived, how many each bucket still
// waits for, and launching complete buckets strictly in bucket order, so
// every rank issues the same collectives in the same sequence whatever order
// its gradients arrive in.
//
// A backward starts with the first gradient (start_if_idle()) and ends with
// finish(). Not thread-safe: the owner calls it under its own lock.

#include <cstddef>
#include <functional>
#include <vector>

namespace tandem::detail {

class GradReadiness {
 public:
  // Parameter i belongs to bucket `bucket_of[i]`; buckets are numbered
  // 0..buckets-1 in launch order. Call between backwards.
  void reset(std::vector<std::size_t> bucket_of, std::size_t buckets);

  // Starts a backward unless one is running; true when it did (the owner then
  // queues its end-of-backward callback and resets its own per-step state).
  bool start_if_idle();
  bool in_backward() const { return in_backward_; }
  // Records parameter `index`'s gradient; false when it was already recorded
  // this backward (a hook firing again), and nothing changes then.
  bool mark_ready(std::size_t index);
  bool ready(std::size_t index) const { return ready_[index]; }
  // Counts a recorded gradient toward its bucket (or, at the end, one that
  // never came); true when that made the bucket complete.
  bool arrive(std::size_t index);
  // Every parameter whose gradient did not come this backward, in order.
  std::vector<std::size_t> unready() const;
  // Calls launch(b) for every complete bucket not launched yet, in bucket
  // order, stopping at the first incomplete one.
  void launch_ready(const std::function<void(std::size_t bucket)>& launch);
  // Buckets launched so far this backward (all of them after finish()).
  std::size_t launched() const { return next_to_launch_; }
  // Ends the backward (normally with every bucket launched; on an error
  // path, wherever it stopped).
  void finish();

 private:
  std::vector<std::size_t> bucket_of_;
  std::vector<std::size_t> bucket_size_;
  std::vector<std::size_t> pending_;  // per bucket, this backward
  std::vector<bool> ready_;           // per parameter, this backward
  std::size_t next_to_launch_ = 0;
  bool in_backward_ = false;
};

}  // namespace tandem::detail
