#pragma once
// The rendezvous store's state and request handling, without sockets.
//
// StoreServer feeds it the bytes each connection sends and writes back what
// it queues; the fuzz target feeds it arbitrary bytes directly. Connections
// are identified by number. Blocking requests (get, wait) park the
// connection until their keys exist or their deadline passes; nothing here
// ever blocks. Not thread-safe: one thread (the server's loop) owns it.
//
// Torch-free on purpose: the fuzz target builds it with clang alone.

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "comm/store_protocol.h"

namespace tandem::detail {

class StoreEngine {
 public:
  using Clock = std::chrono::steady_clock;
  using ConnId = std::uint64_t;

  // `token`: what a client's hello must carry (an empty token accepts only
  // an empty one). A connection that has not said hello within
  // `handshake_timeout` of opening is closed. `run_scope`: the run this
  // store belongs to (StoreServerOptions::run_scope); a hello naming
  // another one is refused, one naming none is let in.
  StoreEngine(std::string token, std::chrono::milliseconds handshake_timeout,
              std::string run_scope = "");

  // A new connection, opened at `now`.
  ConnId open(Clock::time_point now);

  // Handles the bytes a connection sent: queues replies in its outbox, and
  // marks it for closing on bad magic, token or framing. Unknown ids are
  // ignored.
  void receive(ConnId id, std::string_view data, Clock::time_point now);

  // Forgets a connection (its peer left, or the server closed it).
  void close(ConnId id);

  // Times out parked requests and handshakes due at or before `now`.
  void tick(Clock::time_point now);

  // The earliest deadline still pending, if any: when to call tick() next.
  std::optional<Clock::time_point> next_deadline() const;

  // Connections whose outbox or closing flag changed since the last call.
  std::vector<ConnId> take_ready();

  // Bytes waiting to be sent to `id` (the caller erases what it sent).
  // Null for an unknown id.
  std::string* outbox(ConnId id);

  // True once `id` must be closed after its outbox has been sent.
  bool closing(ConnId id) const;

  bool authenticated(ConnId id) const;
  std::size_t connection_count() const { return conns_.size(); }
  std::size_t key_count() const { return data_.size(); }
  // Connections refused because they did not open with tandem's magic:
  // clients of another protocol (c10d's TCPStore, say).
  std::size_t foreign_clients() const { return foreign_clients_; }

 private:
  struct Parked {
    std::uint8_t op = 0;  // store_wire::Op::kGet or kWait
    std::vector<std::string> keys;
  };
  struct Conn {
    std::string inbox;
    std::string outbox;
    bool magic_seen = false;
    bool authenticated = false;
    bool closing = false;
    std::optional<Parked> parked;
    std::optional<Clock::time_point> deadline;  // handshake or parked request
  };

  void drain(Clock::time_point now);
  void process(ConnId id, Conn& conn, Clock::time_point now);
  void handle(ConnId id, Conn& conn, std::string_view body, Clock::time_point now);
  void reply(ConnId id, Conn& conn, std::string frame);
  // Queues a final message and marks the connection for closing.
  void refuse(ConnId id, Conn& conn, store_wire::Status status, const std::string& message);
  void park(ConnId id, Conn& conn, Parked parked, std::int64_t timeout_ms, Clock::time_point now);
  void unpark(ConnId id, Conn& conn);
  void set_deadline(ConnId id, Conn& conn, std::optional<Clock::time_point> deadline);
  bool all_present(const std::vector<std::string>& keys) const;
  void finish_parked(ConnId id, Conn& conn, bool timed_out);
  void key_changed(const std::string& key);

  std::string token_;
  std::chrono::milliseconds handshake_timeout_;
  std::string run_scope_;
  ConnId next_id_ = 1;
  std::unordered_map<ConnId, Conn> conns_;
  std::size_t foreign_clients_ = 0;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::set<ConnId>> waiters_;  // key -> parked conns
  std::set<std::pair<Clock::time_point, ConnId>> deadlines_;
  std::set<ConnId> ready_;
  std::vector<ConnId> resume_;  // connections with input left to handle
};

}  // namespace tandem::detail
