#pragma once
// ShmMailbox: send and recv between ranks of one host through shared memory
// (a ShmChannel per sender, receiver and tag), instead of Gloo's loopback
// TCP.
//
// Each channel end (a lane: peer, tag, direction) has a worker thread that
// runs its messages in the order they were issued, so async sends and recvs
// return at once and messages of one (peer, tag) match in order, as with
// Gloo. A message is a P2pHeader then the data; a recv whose tensor does not
// fit the header drains the data and throws UsageError, leaving the lane in
// step. After any other failure (a timeout mid-message) the lane refuses
// later messages with the first error, since it no longer knows where a
// message starts.
//
// Thread-safe. The destructor fails queued messages with CommError and
// joins the workers.

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace tandem::detail {

class ShmChannel;
struct ShmChannelBound;

class ShmMailbox {
 public:
  ShmMailbox(c10::intrusive_ptr<c10d::Store> store, int rank, std::chrono::milliseconds timeout);
  ~ShmMailbox();
  ShmMailbox(const ShmMailbox&) = delete;
  ShmMailbox& operator=(const ShmMailbox&) = delete;

  // How a message names its peer and explains a timeout.
  struct Message {
    std::string what;                    // "send to rank 1, tag 0, Float[4] on shm"
    std::string peer;                    // "rank 1"
    std::function<std::string()> explain;  // where the peer last was
  };

  // Queues the send of `tensor` (contiguous CPU) to `dst`; completes once
  // every byte is in the channel, so the tensor may be reused.
  std::shared_future<void> send(at::Tensor tensor, int dst, int tag, Message message);
  // Queues a recv from `src` into `tensor`; completes once it holds the data.
  std::shared_future<void> recv(at::Tensor tensor, int src, int tag, Message message);

 private:
  struct Lane;
  // What a message does on its lane's channel, by `deadline`.
  using Body = std::function<void(ShmChannel&, const Message&, const ShmChannelBound&)>;
  Lane& lane(int peer, int tag, bool sending);
  // Queues `body` on `lane`; the future holds its error, if any.
  std::shared_future<void> submit(Lane& lane, Message message, Body body);

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::map<std::tuple<int, int, bool>, std::unique_ptr<Lane>> lanes_;
};

}  // namespace tandem::detail
