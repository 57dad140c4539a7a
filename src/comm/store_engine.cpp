#include "comm/store_engine.h"

#include <algorithm>
#include <cstring>

#include "comm/store_protocol.h"

namespace tandem::detail {
namespace {

namespace wire = store_wire;

// A deadline further out than this is treated as this (a year), so that
// adding it to the clock cannot overflow.
constexpr std::int64_t kMaxTimeoutMs = 365LL * 24 * 3600 * 1000;

std::string status_frame(wire::Status status) {
  return wire::FrameWriter().u8(static_cast<std::uint8_t>(status)).finish();
}

// Strict decimal int64, as add() stores it.
bool parse_int64(const std::string& text, std::int64_t* value) {
  if (text.empty() || text.size() > 20) return false;
  std::size_t i = text[0] == '-' ? 1 : 0;
  if (i == text.size()) return false;
  std::int64_t result = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    const int digit = text[i] - '0';
    if (__builtin_mul_overflow(result, 10, &result) ||
        __builtin_add_overflow(result, text[0] == '-' ? -digit : digit, &result)) {
      return false;
    }
  }
  *value = result;
  return true;
}

}  // namespace

StoreEngine::StoreEngine(std::string token, std::chrono::milliseconds handshake_timeout,
                         std::string run_scope)
    : token_(std::move(token)),
      handshake_timeout_(handshake_timeout),
      run_scope_(std::move(run_scope)) {}

StoreEngine::ConnId StoreEngine::open(Clock::time_point now) {
  const ConnId id = next_id_++;
  Conn& conn = conns_[id];
  set_deadline(id, conn, now + handshake_timeout_);
  return id;
}

void StoreEngine::receive(ConnId id, std::string_view data, Clock::time_point now) {
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second.closing) return;
  it->second.inbox.append(data.data(), data.size());
  resume_.push_back(id);
  drain(now);
}

void StoreEngine::drain(Clock::time_point now) {
  // A worklist, not recursion: a set can wake a parked connection whose
  // pipelined requests set keys that wake others, and so on.
  while (!resume_.empty()) {
    const ConnId id = resume_.back();
    resume_.pop_back();
    auto it = conns_.find(id);
    if (it != conns_.end()) process(id, it->second, now);
  }
}

void StoreEngine::process(ConnId id, Conn& conn, Clock::time_point now) {
  std::size_t offset = 0;
  if (!conn.magic_seen) {
    const std::size_t n = std::min<std::size_t>(conn.inbox.size(), sizeof(wire::kMagic));
    if (std::memcmp(conn.inbox.data(), wire::kMagic, n) != 0) {
      ++foreign_clients_;
      refuse(id, conn, wire::Status::kRefused, "this port serves tandem's rendezvous store only");
      return;
    }
    if (n < sizeof(wire::kMagic)) return;
    conn.magic_seen = true;
    offset = sizeof(wire::kMagic);
  }
  while (!conn.closing && !conn.parked) {
    const std::size_t cap = conn.authenticated ? wire::kMaxFrameBytes : wire::kMaxHelloBytes;
    std::string_view body;
    std::size_t frame_size = 0;
    const auto scan = wire::scan_frame(conn.inbox, offset, cap, &body, &frame_size);
    if (scan == wire::FrameScan::kNeedMore) break;
    if (scan == wire::FrameScan::kTooLarge) {
      refuse(id, conn, wire::Status::kBadRequest,
             "frame longer than " + std::to_string(cap) + " bytes");
      break;
    }
    offset += frame_size;
    handle(id, conn, body, now);
  }
  if (conn.closing) {
    conn.inbox.clear();
    return;
  }
  conn.inbox.erase(0, offset);
  if (conn.inbox.size() > wire::kMaxFrameBytes + 4) {
    // Only a parked connection can pile up input: one request at a time.
    refuse(id, conn, wire::Status::kBadRequest, "too many requests sent ahead of replies");
  }
}

void StoreEngine::handle(ConnId id, Conn& conn, std::string_view body, Clock::time_point now) {
  wire::FrameReader in(body);
  const auto op = static_cast<wire::Op>(in.u8());
  if (!conn.authenticated) {
    if (op != wire::Op::kHello) {
      refuse(id, conn, wire::Status::kRefused, "the first request must be a hello");
      return;
    }
    const std::uint32_t version = in.u32();
    const std::string_view token = in.bytes(wire::kMaxHelloBytes);
    // The run scope is optional: a client without one (another program
    // speaking the protocol, a host outside Slurm) is not asked for it.
    const std::string_view scope =
        in.at_end() ? std::string_view() : in.bytes(wire::kMaxHelloBytes);
    if (!in.at_end()) {
      refuse(id, conn, wire::Status::kBadRequest, "malformed hello");
    } else if (version != wire::kVersion) {
      refuse(id, conn, wire::Status::kRefused,
             "protocol version " + std::to_string(version) + ", but this store speaks " +
                 std::to_string(wire::kVersion) + ": run the same tandem build on every node");
    } else if (!wire::tokens_equal(token_, token)) {
      refuse(id, conn, wire::Status::kRefused, "the store token does not match");
    } else if (!run_scope_.empty() && !scope.empty() && scope != run_scope_) {
      // Checked after the token: only a client of the same job learns the
      // step the store belongs to.
      refuse(id, conn, wire::Status::kRefused, std::string(wire::kOtherRunPrefix) + run_scope_);
    } else {
      conn.authenticated = true;
      set_deadline(id, conn, std::nullopt);
      reply(id, conn, status_frame(wire::Status::kOk));
    }
    return;
  }

  std::string key;
  auto read_key = [&] { key.assign(in.bytes(wire::kMaxKeyBytes)); };
  auto read_keys = [&] {
    std::vector<std::string> keys;
    const std::uint32_t n = in.u32();
    if (n > wire::kMaxKeysPerRequest) return keys;
    for (std::uint32_t i = 0; i < n && in.ok(); ++i) keys.emplace_back(in.bytes(wire::kMaxKeyBytes));
    return keys;
  };
  auto malformed = [&] {
    refuse(id, conn, wire::Status::kBadRequest,
           "malformed request of type " + std::to_string(static_cast<int>(op)));
  };

  switch (op) {
    case wire::Op::kSet: {
      read_key();
      std::string value(in.bytes(wire::kMaxFrameBytes));
      if (!in.at_end()) return malformed();
      data_[key] = std::move(value);
      reply(id, conn, status_frame(wire::Status::kOk));
      return key_changed(key);
    }
    case wire::Op::kGet: {
      read_key();
      const std::int64_t timeout_ms = in.i64();
      if (!in.at_end() || timeout_ms < 0) return malformed();
      Parked parked;
      parked.op = static_cast<std::uint8_t>(op);
      parked.keys.push_back(key);
      return park(id, conn, std::move(parked), timeout_ms, now);
    }
    case wire::Op::kAdd: {
      read_key();
      const std::int64_t delta = in.i64();
      if (!in.at_end()) return malformed();
      std::int64_t sum = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !parse_int64(it->second, &sum)) {
        return reply(id, conn,
                     wire::FrameWriter()
                         .u8(static_cast<std::uint8_t>(wire::Status::kError))
                         .bytes("add() on a key whose value is not an integer")
                         .finish());
      }
      if (__builtin_add_overflow(sum, delta, &sum)) {
        return reply(id, conn,
                     wire::FrameWriter()
                         .u8(static_cast<std::uint8_t>(wire::Status::kError))
                         .bytes("add() overflows a 64-bit integer")
                         .finish());
      }
      data_[key] = std::to_string(sum);
      reply(id, conn,
            wire::FrameWriter().u8(static_cast<std::uint8_t>(wire::Status::kOk)).i64(sum).finish());
      return key_changed(key);
    }
    case wire::Op::kCompareSet: {
      read_key();
      const std::string_view expected = in.bytes(wire::kMaxFrameBytes);
      const std::string_view desired = in.bytes(wire::kMaxFrameBytes);
      if (!in.at_end()) return malformed();
      // c10d's semantics: set when the key holds `expected` (or is missing
      // and `expected` is empty); reply with the value now stored, or with
      // `expected` for a missing key that was not set.
      auto it = data_.find(key);
      bool changed = false;
      std::string now_stored;
      if (it == data_.end()) {
        now_stored = expected.empty() ? std::string(desired) : std::string(expected);
        if (expected.empty()) {
          data_[key] = now_stored;
          changed = true;
        }
      } else if (it->second == expected) {
        it->second.assign(desired);
        now_stored = it->second;
        changed = true;
      } else {
        now_stored = it->second;
      }
      reply(id, conn,
            wire::FrameWriter()
                .u8(static_cast<std::uint8_t>(wire::Status::kOk))
                .bytes(now_stored)
                .finish());
      if (changed) key_changed(key);
      return;
    }
    case wire::Op::kCheck: {
      auto keys = read_keys();
      if (!in.at_end()) return malformed();
      reply(id, conn,
            wire::FrameWriter()
                .u8(static_cast<std::uint8_t>(wire::Status::kOk))
                .u8(all_present(keys) ? 1 : 0)
                .finish());
      return;
    }
    case wire::Op::kWait: {
      Parked parked;
      parked.op = static_cast<std::uint8_t>(op);
      parked.keys = read_keys();
      const std::int64_t timeout_ms = in.i64();
      if (!in.at_end() || timeout_ms < 0) return malformed();
      return park(id, conn, std::move(parked), timeout_ms, now);
    }
    case wire::Op::kDeleteKey: {
      read_key();
      if (!in.at_end()) return malformed();
      const bool deleted = data_.erase(key) > 0;
      reply(id, conn,
            wire::FrameWriter()
                .u8(static_cast<std::uint8_t>(wire::Status::kOk))
                .u8(deleted ? 1 : 0)
                .finish());
      return;
    }
    case wire::Op::kNumKeys: {
      if (!in.at_end()) return malformed();
      reply(id, conn,
            wire::FrameWriter()
                .u8(static_cast<std::uint8_t>(wire::Status::kOk))
                .i64(static_cast<std::int64_t>(data_.size()))
                .finish());
      return;
    }
    default:
      return malformed();
  }
}

void StoreEngine::reply(ConnId id, Conn& conn, std::string frame) {
  conn.outbox += frame;
  ready_.insert(id);
}

void StoreEngine::refuse(ConnId id, Conn& conn, wire::Status status, const std::string& message) {
  unpark(id, conn);
  set_deadline(id, conn, std::nullopt);
  reply(id, conn,
        wire::FrameWriter().u8(static_cast<std::uint8_t>(status)).bytes(message).finish());
  conn.closing = true;
}

void StoreEngine::park(ConnId id, Conn& conn, Parked parked, std::int64_t timeout_ms,
                       Clock::time_point now) {
  if (all_present(parked.keys)) {
    conn.parked = std::move(parked);
    return finish_parked(id, conn, /*timed_out=*/false);
  }
  for (const auto& key : parked.keys) waiters_[key].insert(id);
  conn.parked = std::move(parked);
  if (timeout_ms > 0) {
    set_deadline(id, conn, now + std::chrono::milliseconds(std::min(timeout_ms, kMaxTimeoutMs)));
  }
}

void StoreEngine::unpark(ConnId id, Conn& conn) {
  if (!conn.parked) return;
  for (const auto& key : conn.parked->keys) {
    auto it = waiters_.find(key);
    if (it == waiters_.end()) continue;
    it->second.erase(id);
    if (it->second.empty()) waiters_.erase(it);
  }
  conn.parked.reset();
}

void StoreEngine::set_deadline(ConnId id, Conn& conn, std::optional<Clock::time_point> deadline) {
  if (conn.deadline) deadlines_.erase({*conn.deadline, id});
  conn.deadline = deadline;
  if (deadline) deadlines_.insert({*deadline, id});
}

bool StoreEngine::all_present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return data_.count(key) > 0; });
}

void StoreEngine::finish_parked(ConnId id, Conn& conn, bool timed_out) {
  const std::uint8_t op = conn.parked->op;
  const std::string first_key = conn.parked->keys.empty() ? "" : conn.parked->keys.front();
  unpark(id, conn);
  set_deadline(id, conn, std::nullopt);
  if (timed_out) {
    reply(id, conn, status_frame(wire::Status::kTimeout));
  } else if (op == static_cast<std::uint8_t>(wire::Op::kGet)) {
    reply(id, conn,
          wire::FrameWriter()
              .u8(static_cast<std::uint8_t>(wire::Status::kOk))
              .bytes(data_.at(first_key))
              .finish());
  } else {
    reply(id, conn, status_frame(wire::Status::kOk));
  }
  resume_.push_back(id);  // requests sent ahead of the reply
}

void StoreEngine::key_changed(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  const std::vector<ConnId> waiting(it->second.begin(), it->second.end());
  for (ConnId waiter : waiting) {
    auto conn = conns_.find(waiter);
    if (conn == conns_.end() || !conn->second.parked) continue;
    if (all_present(conn->second.parked->keys)) {
      finish_parked(waiter, conn->second, /*timed_out=*/false);
    }
  }
}

void StoreEngine::close(ConnId id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  unpark(id, it->second);
  set_deadline(id, it->second, std::nullopt);
  ready_.erase(id);
  conns_.erase(it);
}

void StoreEngine::tick(Clock::time_point now) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const ConnId id = deadlines_.begin()->second;
    Conn& conn = conns_.at(id);
    if (!conn.authenticated) {
      refuse(id, conn, wire::Status::kRefused, "no hello within the handshake timeout");
    } else if (conn.parked) {
      finish_parked(id, conn, /*timed_out=*/true);
    } else {
      set_deadline(id, conn, std::nullopt);
    }
  }
  drain(now);
}

std::optional<StoreEngine::Clock::time_point> StoreEngine::next_deadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

std::vector<StoreEngine::ConnId> StoreEngine::take_ready() {
  std::vector<ConnId> ready(ready_.begin(), ready_.end());
  ready_.clear();
  return ready;
}

std::string* StoreEngine::outbox(ConnId id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : &it->second.outbox;
}

bool StoreEngine::closing(ConnId id) const {
  auto it = conns_.find(id);
  return it == conns_.end() || it->second.closing;
}

bool StoreEngine::authenticated(ConnId id) const {
  auto it = conns_.find(id);
  return it != conns_.end() && it->second.authenticated;
}

}  // namespace tandem::detail
