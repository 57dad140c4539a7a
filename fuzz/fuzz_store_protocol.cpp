// libFuzzer target: the rendezvous store's frame parser and request handler
// (StoreEngine, the part of StoreServer that sees a client's bytes) on
// hostile input, with several connections and a fake clock.
//
// The input is a script of steps, each [control byte][length byte][bytes]:
//   control & 3        which of 4 connections
//   control >> 2 & 3   0,1: send the bytes; 2: advance the clock by
//                      length * 7 ms and tick; 3: close and reopen it
//   control & 0x10     before sending, open with a correct hello, so that
//                      mutations reach the authenticated requests
// After every step each outbox must hold whole, well-formed reply frames,
// a connection that never presented the token must not be authenticated,
// and the engine's bookkeeping must stay bounded. Anything else is a bug,
// and so is any sanitizer report.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "comm/store_engine.h"
#include "comm/store_protocol.h"

namespace {

using tandem::detail::StoreEngine;
namespace wire = tandem::detail::store_wire;

const std::string kToken = "fuzz-token";

void check(bool condition) {
  if (!condition) std::abort();
}

std::string good_hello() {
  return std::string(wire::kMagic, sizeof(wire::kMagic)) +
         wire::FrameWriter()
             .u8(static_cast<std::uint8_t>(wire::Op::kHello))
             .u32(wire::kVersion)
             .bytes(kToken)
             .finish();
}

// Every byte of an outbox belongs to a whole reply frame with a known status.
void check_replies(std::string* out) {
  std::size_t offset = 0;
  while (offset < out->size()) {
    std::string_view body;
    std::size_t size = 0;
    check(wire::scan_frame(*out, offset, wire::kMaxFrameBytes, &body, &size) ==
          wire::FrameScan::kComplete);
    check(!body.empty() && static_cast<std::uint8_t>(body[0]) <=
                               static_cast<std::uint8_t>(wire::Status::kBadRequest));
    offset += size;
  }
  out->clear();  // "sent"
}

struct Slot {
  StoreEngine::ConnId id = 0;
  bool said_hello = false;  // the script opened it with the token
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  StoreEngine engine(kToken, std::chrono::milliseconds(500));
  auto now = StoreEngine::Clock::time_point{} + std::chrono::hours(1);
  std::array<Slot, 4> slots;
  for (auto& slot : slots) slot.id = engine.open(now);

  std::size_t pos = 0;
  while (pos + 2 <= size) {
    const std::uint8_t control = data[pos];
    const std::size_t length = data[pos + 1];
    pos += 2;
    const std::size_t take = length < size - pos ? length : size - pos;
    const std::string_view bytes(reinterpret_cast<const char*>(data + pos), take);
    pos += take;
    Slot& slot = slots[control & 3];
    switch ((control >> 2) & 3) {
      case 2:
        now += std::chrono::milliseconds(length * 7);
        engine.tick(now);
        break;
      case 3:
        engine.close(slot.id);
        check(engine.outbox(slot.id) == nullptr);
        slot = Slot{engine.open(now), false};
        break;
      default:
        if ((control & 0x10) && !slot.said_hello) {
          engine.close(slot.id);
          slot = Slot{engine.open(now), true};
          engine.receive(slot.id, good_hello(), now);
          check(engine.authenticated(slot.id));
        }
        engine.receive(slot.id, bytes, now);
        break;
    }
    for (StoreEngine::ConnId id : engine.take_ready()) {
      if (std::string* out = engine.outbox(id)) check_replies(out);
    }
    for (const Slot& s : slots) {
      // The fuzzer may spell out the token itself; only then may a
      // connection without the scripted hello be authenticated.
      if (!s.said_hello && engine.authenticated(s.id)) {
        const std::string_view all(reinterpret_cast<const char*>(data), size);
        check(all.find(kToken) != std::string_view::npos);
      }
    }
    check(engine.connection_count() == slots.size());
  }
  return 0;
}
