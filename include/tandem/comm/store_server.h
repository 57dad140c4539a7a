#pragma once
// The server side of tandem's rendezvous store: one thread, one epoll loop,
// non-blocking sockets, so a slow or hostile client never holds up others.
//
// It binds exactly the address it is given (never the wildcard) and accepts
// a client only after a hello carrying the shared token (store_protocol.h).
// Hosted by `tandem launch` on node 0, or by rank 0 when no launcher does
// (tandem::ProcessGroup::init). Public for launchers; training programs never
// need it. Thread-safe: the server runs on its own thread.

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <c10/util/intrusive_ptr.h>

#include "tandem/core/error.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tandem {

struct StoreServerOptions {
  // A numeric address or a host name of this machine; every address it
  // resolves to is tried in turn and the first that binds is used.
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free port chosen by the kernel (see StoreServer::port())
  std::string token;  // empty: only clients with an empty token are let in
  // Which run the store belongs to: under Slurm the job step ("10068.0",
  // SlurmStep::name()). A client naming another run is refused with both
  // names, even with the right token: two steps of one job share the token
  // and, with one MASTER_PORT, would otherwise form one job. Empty: no check.
  std::string run_scope;
  // What the error for a port in use tells the user to do, in the words of
  // whoever chose the port (`tandem launch` knows its flags); empty: pick
  // another MASTER_PORT.
  std::string port_in_use_advice;
  std::chrono::milliseconds handshake_timeout{10000};
};

// The store's port is taken (EADDRINUSE): a caller that only guessed it
// should host the store may join the one already there instead.
class PortInUseError : public CommError {
 public:
  using CommError::CommError;
};

class StoreServer {
 public:
  // Binds, listens and starts serving. Throws PortInUseError when the port
  // is in use, CommError naming the address and port when the address is
  // not this machine's.
  explicit StoreServer(const StoreServerOptions& options);
  // Stops the loop and closes every connection. Clients then see EOF.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // The port actually bound, and the numeric address.
  int port() const { return port_; }
  const std::string& address() const { return address_; }

 private:
  void run();

  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd written by the destructor
  int port_ = 0;
  std::string address_;
  std::string token_;
  std::string run_scope_;
  std::chrono::milliseconds handshake_timeout_;
  std::thread thread_;
};

// A client of a StoreServer at host:port, as a c10d::Store: it retries the
// connection until `timeout` has passed (the server may start later),
// presents `token` and `run_scope` (StoreServerOptions::run_scope; empty:
// none), and waits at most `timeout` in get() and wait(). Throws
// TimeoutError when nothing answers in time, CommError when the store
// refuses the token or belongs to another run. For launchers that meet
// through the store (`tandem launch --rdzv-backend c10d`); thread-safe.
c10::intrusive_ptr<c10d::Store> connect_store(const std::string& host, int port,
                                              const std::string& token,
                                              std::chrono::milliseconds timeout,
                                              const std::string& run_scope = "");

// True when every address `host` resolves to is a loopback address
// (127.0.0.0/8 or ::1), false when one is not or it does not resolve.
bool is_loopback_host(const std::string& host);

// True for an address that means every interface ("", 0.0.0.0, ::, [::]),
// which neither tandem's store nor the c10d store it hosts listens on.
bool is_wildcard_host(const std::string& host);

// 32 bytes from the kernel's random source, as 64 hex digits.
std::string random_store_token();

}  // namespace tandem
