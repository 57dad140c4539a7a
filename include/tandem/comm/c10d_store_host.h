#pragma once
// C10dStoreHost: hosts a c10d TCPStore, the store torch.distributed
// rendezvouses through (torchrun's agent store). `tandem launch` runs one for
// Python workers: with TORCHELASTIC_USE_AGENT_STORE=True every rank is a
// client of it at MASTER_ADDR:MASTER_PORT. c10d's protocol has no token, so
// it is for loopback or trusted networks (docs/security.md); tandem's own
// workers use StoreServer (tandem/comm/store_server.h) instead.
//
// Thread-safety: the store serves on its own threads; the object itself is
// used from one thread.

#include <chrono>
#include <memory>
#include <string>

namespace tandem {

class C10dStoreHost {
 public:
  // Binds `host`:`port` (0: a free port) and hosts the store on that socket.
  // UsageError naming the address when it cannot bind; Error when the store
  // fails to start. `timeout`: how long the store waits for a client's keys.
  // `port_in_use_advice`: what the error for a port in use tells the user to
  // do (StoreServerOptions::port_in_use_advice).
  C10dStoreHost(const std::string& host, int port,
                std::chrono::milliseconds timeout = std::chrono::minutes(30),
                const std::string& port_in_use_advice = "");
  // Stops serving; clients then see the connection close.
  ~C10dStoreHost();
  C10dStoreHost(const C10dStoreHost&) = delete;
  C10dStoreHost& operator=(const C10dStoreHost&) = delete;

  // The port actually bound.
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace tandem
