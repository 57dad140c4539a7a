#include "comm/token_store.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "comm/store_protocol.h"
#include "core/tcp_connect.h"
#include "tandem/comm/store_server.h"
#include "tandem/core/logging.h"
#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

namespace wire = store_wire;
using Clock = std::chrono::steady_clock;

// How much longer than the server's own deadline a client waits for a
// parked reply: the server answers "timeout" itself, so this only matters
// when the network or the server's host is gone.
constexpr std::chrono::milliseconds kReplyGrace{15000};
constexpr std::chrono::milliseconds kHandshakeLimit{10000};
// When a connection still refused says so, and how often after that.
constexpr std::chrono::seconds kWaitNoticeAfter{10};
constexpr std::chrono::seconds kWaitNoticeEvery{60};

Clock::time_point deadline_after(std::chrono::milliseconds ms) {
  if (ms <= std::chrono::milliseconds::zero()) return Clock::time_point::max();
  const auto now = Clock::now();
  if (Clock::time_point::max() - now < ms) return Clock::time_point::max();
  return now + ms;
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string text;
  for (std::size_t i = 0; i < keys.size() && i < 4; ++i) text += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 4) text += fmt::format(" and {} more", keys.size() - 4);
  return text;
}

std::vector<uint8_t> to_bytes(std::string_view text) { return {text.begin(), text.end()}; }

}  // namespace

}  // namespace tandem::detail

namespace tandem {

c10::intrusive_ptr<c10d::Store> connect_store(const std::string& host, int port,
                                              const std::string& token,
                                              std::chrono::milliseconds timeout,
                                              const std::string& run_scope) {
  return c10::make_intrusive<detail::TokenStore>(host, port, token, timeout, run_scope);
}

}  // namespace tandem

namespace tandem::detail {

TokenStore::TokenStore(std::string host, int port, std::string token,
                       std::chrono::milliseconds timeout, std::string run_scope)
    : compat::StoreBase(timeout),
      host_(std::move(host)),
      port_(port),
      token_(std::move(token)),
      run_scope_(std::move(run_scope)) {
  connect(timeout);
}

TokenStore::~TokenStore() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenStore::connect(std::chrono::milliseconds timeout) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = deadline_after(timeout);
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  // A loopback address reaches a store on this machine only: a node on
  // another machine than node 0 that was given 127.0.0.1 waits in vain.
  const std::string loopback_hint =
      is_loopback_host(host_)
          ? fmt::format(". {} is a loopback address: it reaches a store on this machine only. "
                        "If node 0 runs on another machine, give its network address "
                        "(--master-addr, MASTER_ADDR) on every node",
                        host_)
          : "";
  Clock::time_point next_notice = start + kWaitNoticeAfter;
  for (;;) {
    // Each attempt waits at most 5 s, so that a dropped SYN is sent again.
    fd_ = connect_tcp(host_, port_, std::min(deadline, Clock::now() + std::chrono::seconds(5)),
                      last_error);
    if (fd_ >= 0) break;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      TANDEM_THROW(TimeoutError,
                   "could not reach the rendezvous store at {}:{} within {} ms ({}). Check that "
                   "rank 0 (or node 0's `tandem launch`) is running and that MASTER_ADDR and "
                   "MASTER_PORT are the same on every rank{}",
                   host_, port_, timeout.count(), last_error, loopback_hint);
    }
    if (now >= next_notice) {
      // A silent wait of up to the whole timeout looks like a hang.
      const std::string until =
          deadline == Clock::time_point::max()
              ? std::string("no time limit")
              : fmt::format("giving up in {:.0f} s",
                            std::chrono::duration<double>(deadline - now).count());
      log_warn("still waiting for the rendezvous store at {}:{} after {:.0f} s ({}); {}{}", host_,
               port_, std::chrono::duration<double>(now - start).count(), last_error, until,
               loopback_hint);
      next_notice = now + kWaitNoticeEvery;
    }
    // Rank 0 may not be listening yet: try again, until the deadline.
    Clock::duration pause = backoff;
    if (deadline != Clock::time_point::max()) pause = std::min(pause, deadline - now);
    std::this_thread::sleep_for(pause);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  hello(std::min(deadline, deadline_after(kHandshakeLimit)));
}

void TokenStore::hello(Clock::time_point deadline) {
  wire::FrameWriter hello;
  hello.u8(static_cast<std::uint8_t>(wire::Op::kHello)).u32(wire::kVersion).bytes(token_);
  if (!run_scope_.empty()) hello.bytes(run_scope_);
  const std::string frame = std::string(wire::kMagic, sizeof(wire::kMagic)) + hello.finish();
  send_all(frame, deadline, "hello");
  Reply reply;
  try {
    reply = read_reply(deadline, "hello");
  } catch (const CommError&) {
    TANDEM_THROW(CommError,
                 "the server at {}:{} did not answer as tandem's rendezvous store (it closed the "
                 "connection or stayed silent). If it is torchrun's c10d TCPStore, unset "
                 "TANDEM_STORE_TOKEN for torchrun jobs; otherwise check MASTER_ADDR/MASTER_PORT",
                 host_, port_);
  }
  if (reply.status == static_cast<std::uint8_t>(wire::Status::kOk)) return;
  wire::FrameReader in(reply.body);
  const std::string message(in.bytes(wire::kMaxHelloBytes));
  ::close(fd_);
  fd_ = -1;
  if (message.rfind(wire::kOtherRunPrefix, 0) == 0) {
    const std::string theirs = message.substr(std::strlen(wire::kOtherRunPrefix));
    TANDEM_THROW(CommError,
                 "the rendezvous store at {}:{} belongs to Slurm job step {}, but this process "
                 "runs in step {}: two steps running at once use the same port, and this process "
                 "would have joined the other step's job. Give each step that runs at the same "
                 "time its own port: a different MASTER_PORT for each srun (`MASTER_PORT=29501 "
                 "srun ...`), or no MASTER_PORT, so that tandem derives one per step "
                 "(docs/slurm.md)",
                 host_, port_, theirs, run_scope_);
  }
  if (message.find("token") != std::string::npos) {
    TANDEM_THROW(CommError,
                 "the rendezvous store at {}:{} refused this process: the store token did not "
                 "match. TANDEM_STORE_TOKEN must be the same on every node: `tandem launch` "
                 "passes its own to its workers; for a multi-node job, make one token, e.g. "
                 "`export TANDEM_STORE_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' "
                 "\\n')`, and export that same value on every node before launching",
                 host_, port_);
  }
  TANDEM_THROW(CommError, "the rendezvous store at {}:{} refused this process: {}", host_, port_,
               message.empty() ? wire::to_string(static_cast<wire::Status>(reply.status))
                               : message.c_str());
}

void TokenStore::fail(const std::string& what, const std::string& reason) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;  // the stream may be mid-frame: never reuse it
  TANDEM_THROW(CommError,
               "rendezvous store {} at {}:{} failed: {}. The store's host (node 0's launcher or "
               "rank 0) probably exited; its log names the cause",
               what, host_, port_, reason);
}

void TokenStore::send_all(const std::string& data, Clock::time_point deadline, const char* what) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, poll_timeout_ms(deadline)) == 0) fail(what, "the send timed out");
      continue;
    }
    fail(what, std::strerror(errno));
  }
}

TokenStore::Reply TokenStore::read_reply(Clock::time_point deadline, const char* what) {
  std::string buffer;
  char chunk[64 * 1024];
  for (;;) {
    std::string_view body;
    std::size_t frame_size = 0;
    const auto scan = wire::scan_frame(buffer, 0, wire::kMaxFrameBytes, &body, &frame_size);
    if (scan == wire::FrameScan::kTooLarge) fail(what, "the reply frame is too large");
    if (scan == wire::FrameScan::kComplete) {
      if (frame_size != buffer.size()) fail(what, "the server sent more than one reply");
      if (body.empty()) fail(what, "an empty reply");
      return Reply{static_cast<std::uint8_t>(body[0]), std::string(body.substr(1))};
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) fail(what, "no reply in time (is the store's host reachable?)");
    ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) fail(what, "the store closed the connection");
    if (n < 0) fail(what, std::strerror(errno));
    buffer.append(chunk, static_cast<std::size_t>(n));
  }
}

TokenStore::Reply TokenStore::request(const std::string& frame, std::int64_t server_wait_ms,
                                      const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) fail(what, "the connection was lost by an earlier request");
  const auto budget = server_wait_ms > 0 ? std::chrono::milliseconds(server_wait_ms) + kReplyGrace
                      : timeout_.count() > 0 ? timeout_ + kReplyGrace
                                             : std::chrono::milliseconds::zero();
  const Clock::time_point deadline = deadline_after(budget);
  send_all(frame, deadline, what);
  Reply reply = read_reply(deadline, what);
  if (reply.status == static_cast<std::uint8_t>(wire::Status::kOk) ||
      reply.status == static_cast<std::uint8_t>(wire::Status::kTimeout)) {
    return reply;
  }
  wire::FrameReader in(reply.body);
  const std::string message(in.bytes(wire::kMaxFrameBytes));
  if (reply.status != static_cast<std::uint8_t>(wire::Status::kError)) fail(what, message);
  TANDEM_THROW(CommError, "rendezvous store {} failed: {}", what, message);
}

void TokenStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  request(wire::FrameWriter().u8(static_cast<std::uint8_t>(wire::Op::kSet)).bytes(key).bytes(value).finish(),
          0, "set");
}

std::vector<uint8_t> TokenStore::compareSet(const std::string& key,
                                            const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  Reply reply = request(wire::FrameWriter()
                            .u8(static_cast<std::uint8_t>(wire::Op::kCompareSet))
                            .bytes(key)
                            .bytes(expected)
                            .bytes(desired)
                            .finish(),
                        0, "compareSet");
  wire::FrameReader in(reply.body);
  return to_bytes(in.bytes(wire::kMaxFrameBytes));
}

std::vector<uint8_t> TokenStore::get(const std::string& key) {
  const std::int64_t timeout_ms = timeout_.count();
  Reply reply = request(wire::FrameWriter()
                            .u8(static_cast<std::uint8_t>(wire::Op::kGet))
                            .bytes(key)
                            .i64(timeout_ms)
                            .finish(),
                        timeout_ms, "get");
  if (reply.status == static_cast<std::uint8_t>(wire::Status::kTimeout)) {
    TANDEM_THROW(TimeoutError,
                 "timed out after {} ms waiting for key '{}' in the rendezvous store at {}:{}: "
                 "a rank has not arrived. Check that every rank started and that none failed "
                 "(their logs), or raise the timeout",
                 timeout_ms, key, host_, port_);
  }
  wire::FrameReader in(reply.body);
  return to_bytes(in.bytes(wire::kMaxFrameBytes));
}

int64_t TokenStore::add(const std::string& key, int64_t value) {
  Reply reply = request(
      wire::FrameWriter().u8(static_cast<std::uint8_t>(wire::Op::kAdd)).bytes(key).i64(value).finish(),
      0, "add");
  wire::FrameReader in(reply.body);
  return in.i64();
}

bool TokenStore::deleteKey(const std::string& key) {
  Reply reply = request(
      wire::FrameWriter().u8(static_cast<std::uint8_t>(wire::Op::kDeleteKey)).bytes(key).finish(),
      0, "deleteKey");
  wire::FrameReader in(reply.body);
  return in.u8() != 0;
}

bool TokenStore::check(const std::vector<std::string>& keys) {
  wire::FrameWriter frame;
  frame.u8(static_cast<std::uint8_t>(wire::Op::kCheck)).u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& key : keys) frame.bytes(key);
  Reply reply = request(frame.finish(), 0, "check");
  wire::FrameReader in(reply.body);
  return in.u8() != 0;
}

int64_t TokenStore::getNumKeys() {
  Reply reply =
      request(wire::FrameWriter().u8(static_cast<std::uint8_t>(wire::Op::kNumKeys)).finish(), 0,
              "getNumKeys");
  wire::FrameReader in(reply.body);
  return in.i64();
}

void TokenStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TokenStore::wait(const std::vector<std::string>& keys,
                      const std::chrono::milliseconds& timeout) {
  wire::FrameWriter frame;
  frame.u8(static_cast<std::uint8_t>(wire::Op::kWait)).u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& key : keys) frame.bytes(key);
  frame.i64(timeout.count());
  Reply reply = request(frame.finish(), timeout.count(), "wait");
  if (reply.status == static_cast<std::uint8_t>(wire::Status::kTimeout)) {
    TANDEM_THROW(TimeoutError,
                 "timed out after {} ms waiting for {} in the rendezvous store at {}:{}: a rank "
                 "has not arrived. Check that every rank started and that none failed (their "
                 "logs), or raise the timeout",
                 timeout.count(), key_list(keys), host_, port_);
  }
}

c10::intrusive_ptr<c10d::Store> TokenStore::clone_store() {
  auto copy = c10::make_intrusive<TokenStore>(host_, port_, token_, timeout_, run_scope_);
  copy->keep_alive(server_);
  return copy;
}

}  // namespace tandem::detail
