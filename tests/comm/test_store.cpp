// tandem's rendezvous store: c10d::Store semantics over a real socket, the
// token handshake, hostile input, and where the server listens.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/store_protocol.h"
#include "tandem/comm/c10d_store_host.h"
#include "tandem/comm/store_server.h"
#include "comm/token_store.h"
#include "support/proc_net.h"
#include "support/reserved_port.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using detail::TokenStore;
using std::chrono::milliseconds;
namespace wire = detail::store_wire;

const std::string kToken = "0123456789abcdef0123456789abcdef";

StoreServerOptions options(std::string token = kToken) {
  StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.token = std::move(token);
  o.handshake_timeout = milliseconds(300);
  return o;
}

c10::intrusive_ptr<TokenStore> client(const StoreServer& server, milliseconds timeout = milliseconds(5000),
                                      const std::string& token = kToken) {
  return c10::make_intrusive<TokenStore>("127.0.0.1", server.port(), token, timeout);
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// A raw TCP connection to the server, for bytes no real client sends.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  bool connected() const { return connected_; }
  void send(const std::string& data) { (void)!::send(fd_, data.data(), data.size(), MSG_NOSIGNAL); }
  // Everything the server sends until it closes the connection; `closed` is
  // false when it stayed open for `timeout_ms`.
  std::string read_until_closed(int timeout_ms, bool* closed) {
    std::string out;
    char buf[4096];
    auto deadline = std::chrono::steady_clock::now() + milliseconds(timeout_ms);
    for (;;) {
      int left = static_cast<int>(std::chrono::duration_cast<milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, left) == 0) {
        *closed = false;
        return out;
      }
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {  // EOF, or a reset when unread input was discarded
        *closed = true;
        return out;
      }
      out.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string hello(const std::string& token) {
  return std::string(wire::kMagic, 4) +
         wire::FrameWriter().u8(static_cast<uint8_t>(wire::Op::kHello)).u32(wire::kVersion).bytes(token).finish();
}

TEST(Store, SetGetAddCheckDeleteAndNumKeys) {
  StoreServer server(options());
  auto store = client(server);
  store->set("a", bytes("alpha"));
  EXPECT_EQ(text(store->get("a")), "alpha");
  store->set("a", bytes(""));
  EXPECT_EQ(text(store->get("a")), "");
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -7), -2);
  EXPECT_EQ(text(store->get("n")), "-2");  // c10d stores counters as text
  EXPECT_TRUE(store->check({"a", "n"}));
  EXPECT_FALSE(store->check({"a", "missing"}));
  EXPECT_EQ(store->getNumKeys(), 2);
  EXPECT_TRUE(store->deleteKey("a"));
  EXPECT_FALSE(store->deleteKey("a"));
  EXPECT_EQ(store->getNumKeys(), 1);
  store->set("text", bytes("x"));
  EXPECT_THROW(store->add("text", 1), CommError);
  EXPECT_EQ(store->add("n", 1), -1) << "an error reply must leave the connection usable";
}

TEST(Store, CompareSetFollowsC10dSemantics) {
  StoreServer server(options());
  auto store = client(server);
  // Missing key, non-empty expected: not set, `expected` comes back.
  EXPECT_EQ(text(store->compareSet("k", bytes("x"), bytes("y"))), "x");
  EXPECT_FALSE(store->check({"k"}));
  // Missing key, empty expected: set.
  EXPECT_EQ(text(store->compareSet("k", bytes(""), bytes("v1"))), "v1");
  // Wrong expected: unchanged, current value comes back.
  EXPECT_EQ(text(store->compareSet("k", bytes("nope"), bytes("v2"))), "v1");
  EXPECT_EQ(text(store->compareSet("k", bytes("v1"), bytes("v2"))), "v2");
  EXPECT_EQ(text(store->get("k")), "v2");
}

TEST(Store, WaitAndGetReturnOnlyOnceAnotherClientHasSetTheKeys) {
  StoreServer server(options());
  auto waiter = client(server);
  auto setter = client(server);
  bool present_when_woken = false;
  std::string value;
  std::thread t([&] {
    waiter->wait({"late", "late2"}, milliseconds(10000));
    present_when_woken = waiter->check({"late", "late2"});
    value = text(waiter->get("late2"));
  });
  setter->set("late", bytes("value"));
  setter->set("late2", bytes("value2"));
  t.join();
  EXPECT_TRUE(present_when_woken);
  EXPECT_EQ(value, "value2");
}

TEST(Store, GetAndWaitTimeOutWithTheKeyNamesAndTheConnectionSurvives) {
  StoreServer server(options());
  // Connected with the usual timeout (a loaded machine may answer the
  // handshake late), then the store's own timeout, the one get() uses, made short.
  auto store = client(server);
  store->setTimeout(milliseconds(200));
  auto start = std::chrono::steady_clock::now();
  try {
    store->get("never");
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(190));
  EXPECT_THROW(store->wait({"never", "nor"}, milliseconds(50)), TimeoutError);
  store->set("after", bytes("ok"));
  EXPECT_EQ(text(store->get("after")), "ok");
}

TEST(Store, ManyClientsAtOnceAllCountAndMeet) {
  StoreServer server(options());
  constexpr int kClients = 300;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto store = client(server, milliseconds(30000));
        store->set("rank" + std::to_string(i), bytes(std::to_string(i)));
        store->add("arrived", 1);
        store->wait({"rank" + std::to_string(kClients - 1 - i)});
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(client(server)->add("arrived", 0), kClients);
}

TEST(Store, ClientRetriesUntilTheServerStarts) {
  // Hold a free port, connect in the background, then start the server on
  // it: the client must keep retrying rather than fail. The port stays
  // reserved throughout, so nothing else on the machine can take it between
  // the client's first attempt and the server's start.
  testing::ReservedPort reserved(/*shareable=*/true);
  const int port = reserved.port();
  ASSERT_NE(port, 0);
  std::atomic<bool> ok{false};
  std::string error;
  std::thread t([&] {
    try {
      auto store = c10::make_intrusive<TokenStore>("127.0.0.1", port, kToken, milliseconds(20000));
      ok = text(store->get("ready")) == "yes";
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  auto o = options();
  o.port = port;
  StoreServer server(o);
  client(server)->set("ready", bytes("yes"));
  t.join();
  EXPECT_TRUE(ok) << error;
}

TEST(Store, UnreachableStoreTimesOutSayingWhere) {
  // A port that refuses connections and that nothing else can listen on.
  testing::ReservedPort reserved(/*shareable=*/false);
  const int port = reserved.port();
  ASSERT_NE(port, 0);
  try {
    TokenStore store("127.0.0.1", port, kToken, milliseconds(300));
    FAIL() << "connected to a closed port";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST(Store, WrongOrMissingTokenIsRefusedWithTheFix) {
  StoreServer server(options());
  for (const std::string& token : {std::string("wrong"), std::string(), kToken + "x"}) {
    try {
      client(server, milliseconds(2000), token);
      FAIL() << "token '" << token << "' was accepted";
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("token did not match"), std::string::npos) << what;
      EXPECT_NE(what.find("TANDEM_STORE_TOKEN must be the same on every node"), std::string::npos) << what;
    }
  }
  EXPECT_NO_THROW(client(server));
}

// Two Slurm steps of one job share the token; with one port, a rank of one
// would join the other's job. The store knows its step and refuses.
TEST(Store, AClientOfAnotherRunIsRefusedNamingBothRuns) {
  StoreServerOptions o = options();
  o.run_scope = "10068.0";
  StoreServer server(o);
  try {
    c10::make_intrusive<TokenStore>("127.0.0.1", server.port(), kToken, milliseconds(2000),
                                    "10068.1");
    FAIL() << "a client of step 10068.1 was let into step 10068.0's store";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("belongs to Slurm job step 10068.0"), std::string::npos) << what;
    EXPECT_NE(what.find("runs in step 10068.1"), std::string::npos) << what;
    EXPECT_NE(what.find("MASTER_PORT"), std::string::npos) << what;
  }
  // The same step, and a client that names none (outside Slurm), get in.
  EXPECT_NO_THROW(c10::make_intrusive<TokenStore>("127.0.0.1", server.port(), kToken,
                                                  milliseconds(2000), "10068.0"));
  EXPECT_NO_THROW(client(server));
  // A wrong token is refused for its token, before the step is looked at.
  try {
    c10::make_intrusive<TokenStore>("127.0.0.1", server.port(), "wrong", milliseconds(2000),
                                    "10068.1");
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("token did not match"), std::string::npos) << e.what();
  }
}

TEST(Store, RefusedHelloGetsARefusalAndTheConnectionClosed) {
  StoreServer server(options());
  RawConnection raw(server.port());
  ASSERT_TRUE(raw.connected());
  raw.send(hello("bad"));
  bool closed = false;
  std::string reply = raw.read_until_closed(5000, &closed);
  EXPECT_TRUE(closed);
  ASSERT_GE(reply.size(), 5u);
  EXPECT_EQ(static_cast<uint8_t>(reply[4]), static_cast<uint8_t>(wire::Status::kRefused));
}

TEST(Store, SilentConnectionIsClosedAfterTheHandshakeTimeout) {
  StoreServer server(options());  // 300 ms
  RawConnection raw(server.port());
  ASSERT_TRUE(raw.connected());
  bool closed = false;
  raw.read_until_closed(5000, &closed);
  EXPECT_TRUE(closed) << "a client that never says hello must not hold a connection";
}

TEST(Store, HostileBytesNeverStopTheServerServingGoodClients) {
  StoreServer server(options());
  auto good = client(server);
  std::mt19937 rng(1234);
  std::vector<std::string> attacks;
  for (int i = 0; i < 40; ++i) {  // random bytes, with and without the magic
    std::string junk(1 + rng() % 2000, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    attacks.push_back(i % 2 ? std::string(wire::kMagic, 4) + junk : junk);
  }
  const std::string magic(wire::kMagic, 4);
  attacks.push_back(magic + std::string("\xff\xff\xff\xff", 4));             // 4 GiB hello
  attacks.push_back(magic + std::string("\x01\x04\x00\x00", 4) + "abc");     // over the hello cap
  attacks.push_back(hello(kToken).substr(0, 9));                             // truncated hello
  attacks.push_back(hello(kToken) + std::string("\xff\xff\xff\x7f\x02", 5)); // then a 2 GiB frame
  attacks.push_back(hello(kToken) + wire::FrameWriter().u8(2).u32(1u << 30).finish());  // bad field
  attacks.push_back(hello(kToken) + wire::FrameWriter().u8(7).u32(0xffffffffu).finish());
  attacks.push_back(hello(kToken) + wire::FrameWriter().u8(200).finish());  // unknown op
  attacks.push_back(std::string("\x00\x00\x00\x00\x00", 5));                 // c10d-looking query
  for (size_t i = 0; i < attacks.size(); ++i) {
    RawConnection raw(server.port());
    ASSERT_TRUE(raw.connected());
    raw.send(attacks[i]);
    bool closed = false;
    raw.read_until_closed(5000, &closed);
    EXPECT_TRUE(closed) << "attack " << i << " left the connection open";
    good->set("alive", bytes(std::to_string(i)));
    ASSERT_EQ(text(good->get("alive")), std::to_string(i)) << "after attack " << i;
  }
  // Keys set through a hostile but authenticated connection must not exist.
  EXPECT_EQ(good->getNumKeys(), 1);
}

TEST(Store, ASlowClientDoesNotBlockOthers) {
  StoreServer server(options());
  RawConnection slow(server.port());
  ASSERT_TRUE(slow.connected());
  slow.send(hello(kToken) + std::string("\x40\x00\x00\x00\x02", 5));  // half a set
  auto store = client(server);
  store->set("k", bytes("v"));
  EXPECT_EQ(text(store->get("k")), "v");
}

// The listening sockets on `port`: "ADDR:PORT" in /proc's hex notation.
std::vector<std::string> listeners_on(int port) {
  std::vector<std::string> found;
  for (const auto& listener : testing::tcp_listeners()) {
    if (listener.port() == port) found.push_back(listener.local);
  }
  return found;
}

TEST(Store, ServerListensOnlyOnTheRequestedAddress) {
  StoreServer server(options());
  EXPECT_EQ(server.address(), "127.0.0.1");
  auto listeners = listeners_on(server.port());
  ASSERT_EQ(listeners.size(), 1u);
  EXPECT_EQ(listeners[0], "0100007F:" + [&] {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "%04X", server.port());
    return std::string(hex);
  }());
}

TEST(Store, WildcardAddressAndBusyPortAreClearErrors) {
  auto o = options();
  o.host = "0.0.0.0";
  EXPECT_THROW(StoreServer{o}, UsageError);
  StoreServer first(options());
  auto busy = options();
  busy.port = first.port();
  try {
    StoreServer second(busy);
    FAIL() << "two servers bound one port";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("port " + std::to_string(first.port())), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
  }
}

// The c10d store (Python workers, --c10d-store) has no token, so it must
// not listen on every interface either; an address of another machine is
// named as such, not blamed on the port.
TEST(Store, TheC10dStoreRefusesTheWildcardAndNamesAForeignAddress) {
  for (const char* wildcard : {"0.0.0.0", "::", ""}) {
    try {
      C10dStoreHost host(wildcard, 0, std::chrono::seconds(5));
      ADD_FAILURE() << "the c10d store listened on '" << wildcard << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("every interface"), std::string::npos) << e.what();
    }
  }
  try {
    C10dStoreHost host("198.51.100.77", 0, std::chrono::seconds(5));  // TEST-NET-2
    ADD_FAILURE() << "listened on an address this machine does not have";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("198.51.100.77: it is not an address of this machine"),
              std::string::npos)
        << e.what();
  }
  C10dStoreHost local("127.0.0.1", 0, std::chrono::seconds(5));
  EXPECT_GT(local.port(), 0);
}

TEST(Store, RandomTokensAreLongAndDistinct) {
  const std::string a = random_store_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, random_store_token());
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.3.4.5"));
  EXPECT_FALSE(is_loopback_host("10.1.2.3"));
}

TEST(Store, TokensCompareExactly) {
  EXPECT_TRUE(wire::tokens_equal("abc", "abc"));
  EXPECT_TRUE(wire::tokens_equal("", ""));
  EXPECT_FALSE(wire::tokens_equal("abc", "abd"));
  EXPECT_FALSE(wire::tokens_equal("abc", "abcabc"));  // the repeat must not fool the loop
  EXPECT_FALSE(wire::tokens_equal("abc", ""));
  EXPECT_FALSE(wire::tokens_equal("", "a"));
}

}  // namespace
}  // namespace tandem
