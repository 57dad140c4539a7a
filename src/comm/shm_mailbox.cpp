#include "comm/shm_mailbox.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/p2p_message.h"
#include "comm/serial_worker.h"
#include "comm/shm_channel.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::detail {

struct ShmMailbox::Lane {
  std::string key;  // the store key the two ends meet under
  ShmChannel channel;
  bool attached = false;
  std::string failed;  // the first error that left the lane out of step
  SerialWorker worker;  // last: stops before the state its jobs use
};

ShmMailbox::ShmMailbox(c10::intrusive_ptr<c10d::Store> store, int rank,
                       std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), timeout_(timeout) {}

ShmMailbox::~ShmMailbox() {
  // Queued messages fail fast (their waits see the flag), then each lane's
  // worker joins.
  stopping_.store(true, std::memory_order_release);
  lanes_.clear();
}

ShmMailbox::Lane& ShmMailbox::lane(int peer, int tag, bool sending) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = lanes_[{peer, tag, sending}];
  if (!slot) {
    slot = std::make_unique<Lane>();
    const int src = sending ? rank_ : peer;
    const int dst = sending ? peer : rank_;
    slot->key = fmt::format("p2p/{}/{}/{}", src, dst, tag);
  }
  return *slot;
}

std::shared_future<void> ShmMailbox::submit(Lane& lane, Message message, Body body) {
  return lane.worker.submit([this, &lane, message = std::move(message), body = std::move(body)] {
    try {
      if (stopping_.load(std::memory_order_acquire)) throw ShmChannel::Stopped{};
      if (!lane.failed.empty()) {
        TANDEM_THROW(CommError,
                     "{}: an earlier message on this channel failed ({}), so it is out of step; "
                     "no later message can be matched",
                     message.what, lane.failed);
      }
      if (!lane.attached) {
        lane.channel = ShmChannel::attach(*store_, lane.key);
        lane.attached = true;
      }
      const ShmChannelBound bound{std::chrono::steady_clock::now() + timeout_, timeout_, &stopping_,
                                  &message.what, &message.explain};
      body(lane.channel, message, bound);
    } catch (const ShmChannel::Stopped&) {
      TANDEM_THROW(CommError, "{}: the process group was destroyed before it completed",
                   message.what);
    } catch (const UsageError&) {
      throw;  // a drained mismatch: still in step
    } catch (const std::exception& e) {
      lane.failed = e.what();
      throw;
    }
  });
}

std::shared_future<void> ShmMailbox::send(at::Tensor tensor, int dst, int tag, Message message) {
  return submit(lane(dst, tag, true), std::move(message),
                [tensor](ShmChannel& channel, const Message&, const ShmChannelBound& bound) {
                  const P2pHeader header = P2pHeader::of(tensor);
                  channel.write(&header, sizeof(header), bound);
                  channel.write(tensor.data_ptr(), tensor.nbytes(), bound);
                });
}

std::shared_future<void> ShmMailbox::recv(at::Tensor tensor, int src, int tag, Message message) {
  return submit(lane(src, tag, false), std::move(message),
                [tensor](ShmChannel& channel, const Message& m, const ShmChannelBound& bound) {
                  P2pHeader header;
                  channel.read(&header, sizeof(header), bound);
                  if (header.magic != kP2pMagic) throw_foreign_p2p(m.what, m.peer);
                  const bool fits = header.fits(tensor);
                  // A message that does not fit is read past, so the next one
                  // on this lane starts where it should.
                  channel.read(fits ? tensor.data_ptr() : nullptr,
                               static_cast<std::size_t>(header.data_bytes()), bound);
                  if (!fits) throw_p2p_mismatch(m.what, m.peer, header, tensor);
                });
}

}  // namespace tandem::detail
