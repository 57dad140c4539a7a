#pragma once
// The rendezvous store for Python workers. A plain torch.distributed program
// (init_process_group("gloo") from the environment) under `tandem launch`
// rendezvouses like under torchrun: TORCHELASTIC_USE_AGENT_STORE=True makes
// every rank a client of a c10d TCPStore at MASTER_ADDR:MASTER_PORT, which the
// launcher of node 0 hosts. c10d's protocol has no token, so Python workers
// get this store instead of tandem's authenticated one (docs/security.md
// says what that costs); on one node it still listens on loopback only.

#include <memory>
#include <string>
#include <vector>

namespace tandem::cli {

// Whether `program` runs Python: its executable is python, python3,
// python3.11, ... or a script ending in .py.
bool is_python_program(const std::vector<std::string>& program);

class PythonStore {
 public:
  // Binds `host`:`port` (0: a free port) and hosts a c10d TCPStore on that
  // socket. UsageError naming the address when it cannot bind.
  PythonStore(const std::string& host, int port);
  ~PythonStore();
  PythonStore(const PythonStore&) = delete;
  PythonStore& operator=(const PythonStore&) = delete;

  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace tandem::cli
