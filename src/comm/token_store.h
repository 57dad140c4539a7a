#pragma once
// The client side of tandem's rendezvous store: a c10d::Store that Gloo,
// NCCL and c10d::PrefixStore use like a TCPStore, over one authenticated
// connection to a StoreServer (store_server.h).

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/torch_compat.h"

namespace tandem {
class StoreServer;
}  // namespace tandem

namespace tandem::detail {

class TokenStore : public compat::StoreBase {
 public:
  // Connects to host:port, retrying until `timeout` has passed (rank 0 may
  // start after the others), and presents `token`. `timeout` is also the
  // store timeout of get() and wait(). Throws TimeoutError when nothing
  // answers in time, CommError when the store refuses the token, belongs to
  // another run than `run_scope` (StoreServerOptions::run_scope; empty:
  // none) or is not tandem's store.
  TokenStore(std::string host, int port, std::string token, std::chrono::milliseconds timeout,
             std::string run_scope = "");
  ~TokenStore() override;

  // Keeps `server` running for as long as this store (and its clones) live:
  // rank 0 hosting the store for a job without a launcher.
  void keep_alive(std::shared_ptr<StoreServer> server) { server_ = std::move(server); }

  // c10d::Store. All are thread-safe: requests share the one connection
  // under a mutex. get() and wait() block until the keys exist or the
  // timeout passes (TimeoutError); kNoTimeout waits forever.
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // A second connection to the same store, with the same token and timeout.
  c10::intrusive_ptr<c10d::Store> clone_store() override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  struct Reply {
    std::uint8_t status = 0;
    std::string body;  // the fields after the status byte
  };
  void connect(std::chrono::milliseconds timeout);
  void hello(std::chrono::steady_clock::time_point deadline);
  // Sends one request frame and reads its reply; `wait_ms` is how long the
  // server may park it (0: the store's timeout covers the whole exchange).
  Reply request(const std::string& frame, std::int64_t server_wait_ms, const char* what);
  void send_all(const std::string& data, std::chrono::steady_clock::time_point deadline,
                const char* what);
  Reply read_reply(std::chrono::steady_clock::time_point deadline, const char* what);
  [[noreturn]] void fail(const std::string& what, const std::string& reason);

  std::string host_;
  int port_;
  std::string token_;
  std::string run_scope_;
  std::mutex mutex_;
  int fd_ = -1;
  std::shared_ptr<StoreServer> server_;
};

}  // namespace tandem::detail
