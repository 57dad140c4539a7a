#pragma once
// Python workers. A plain torch.distributed program (init_process_group("gloo")
// from the environment) under `tandem launch` rendezvouses like under
// torchrun: TORCHELASTIC_USE_AGENT_STORE=True makes every rank a client of a
// c10d TCPStore at MASTER_ADDR:MASTER_PORT, which the launcher of node 0 hosts
// (tandem::C10dStoreHost). c10d's protocol has no token, so Python workers get
// that store instead of tandem's authenticated one (docs/security.md says
// what that costs); on one node it still listens on loopback only.

#include <string>
#include <vector>

namespace tandem::cli {

// Whether `program` runs Python: its executable (after `env` and its
// settings) is python, python3, python3.11, ..., a script ending in .py, or
// a file whose "#!" line runs Python. A wrapper that starts Python some
// other way (a shell script, uv run) is not seen: `tandem launch
// --c10d-store` says so.
bool is_python_program(const std::vector<std::string>& program);

// Where execvp finds `program`: itself when it names a path and is
// executable, else the first executable of that name on PATH (/usr/bin:/bin
// when PATH is unset); empty when there is none.
std::string executable_path(const std::string& program);

}  // namespace tandem::cli
