#pragma once
// One helper thread that runs ZeRO's collectives in the order they were
// queued. Gathers and reduce-scatters then overlap the training thread's
// compute, and every rank still issues its collectives in one deterministic
// sequence (the training thread queues them in program order).
//
// Every CommQueue made for the same process group shares one thread and one
// FIFO: two ZeRO optimizers over one group (a GAN's two players) must not
// issue collectives from two threads, whose interleaving would differ from
// rank to rank.

#include <functional>
#include <future>
#include <memory>

namespace tandem::detail {

class CommQueue {
 public:
  // `group` identifies the process group the tasks talk over (its address);
  // queues made for the same group while one is alive share the thread.
  explicit CommQueue(const void* group);
  // Waits for queued work; the thread stops with the group's last queue.
  // Errors of unwaited tasks are dropped (the training thread has already
  // failed or moved on).
  ~CommQueue();
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  // Queues `task`; the future carries its exception, if any.
  std::shared_future<void> submit(std::function<void()> task);
  // Blocks until every queued task of the group has run; rethrows the first
  // error among them not yet seen through a future.
  void drain();

  // The thread and FIFO a group's queues share (comm_queue.cpp).
  struct Worker;

 private:
  std::shared_ptr<Worker> worker_;
};

}  // namespace tandem::detail
