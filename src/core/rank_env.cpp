#include "tandem/core/rank_env.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/text.h"
#include "tandem/core/error.h"
#include "tandem/core/error_file.h"
#include "tandem/core/slurm.h"

extern char** environ;

namespace tandem {
namespace {

using VarMap = std::map<std::string, std::string>;

using detail::find_variable;

int parse_int(const VarMap& vars, const char* name, int fallback, int min_value) {
  const std::string* text = find_variable(vars, name);
  if (text == nullptr) return fallback;
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text->c_str(), &end, 10);
  if (errno != 0 || end == text->c_str() || *end != '\0' || value < min_value || value > 1 << 24) {
    TANDEM_THROW(UsageError, "environment variable {}='{}' is not an integer >= {}; fix or unset it",
                 name, *text, min_value);
  }
  return static_cast<int>(value);
}

std::string get(const VarMap& vars, const char* name, const std::string& fallback) {
  const std::string* text = find_variable(vars, name);
  return text ? *text : fallback;
}

// TANDEM_DEBUG=off|info|detail (any case), else TORCH_DISTRIBUTED_DEBUG.
bool read_debug_detail(const VarMap& vars) {
  std::string level = get(vars, "TANDEM_DEBUG", "");
  for (char& c : level) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (level.empty()) {
    std::string torch = get(vars, "TORCH_DISTRIBUTED_DEBUG", "");
    return torch == "DETAIL" || torch == "detail";
  }
  if (level != "off" && level != "info" && level != "detail") {
    TANDEM_THROW(UsageError,
                 "environment variable TANDEM_DEBUG='{}' is not valid; use off, info or detail",
                 get(vars, "TANDEM_DEBUG", ""));
  }
  return level == "detail";
}

void read_master(const VarMap& vars, RankEnv& env) {
  env.master_addr = get(vars, "MASTER_ADDR", env.master_addr);
  const std::string* port = find_variable(vars, "MASTER_PORT");
  if (port == nullptr) return;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(port->c_str(), &end, 10);
  if (errno != 0 || end == port->c_str() || *end != '\0' || value < 0 || value > 65535) {
    TANDEM_THROW(UsageError, "MASTER_PORT='{}' is not a port number (1-65535); fix or unset it",
                 *port);
  }
  env.master_port = static_cast<int>(value);
}

void validate(const RankEnv& env, const char* rank_var, const char* world_var) {
  if (env.world_size < 1) {
    TANDEM_THROW(UsageError, "{}={} must be at least 1", world_var, env.world_size);
  }
  if (env.rank >= env.world_size) {
    TANDEM_THROW(UsageError, "{}={} is not below {}={}; the launcher environment is inconsistent",
                 rank_var, env.rank, world_var, env.world_size);
  }
  if (env.local_rank >= env.local_world_size) {
    TANDEM_THROW(UsageError, "local rank {} is not below the local world size {}", env.local_rank,
                 env.local_world_size);
  }
}

}  // namespace

std::string detail::random_token_hex() {
  unsigned char bytes[32];
  std::size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) TANDEM_THROW(Error, "getrandom() failed: {}", std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

const char* to_string(RankEnvSource source) {
  switch (source) {
    case RankEnvSource::kNone: return "none";
    case RankEnvSource::kTorchrun: return "torchrun";
    case RankEnvSource::kSlurm: return "slurm";
    case RankEnvSource::kOpenMpi: return "openmpi";
  }
  return "?";
}

std::string slurm_first_host(const std::string& node_list) {
  return expand_slurm_host_list(node_list).front();
}

namespace {

// The token in `path`, "" when there is no such file. The file is the job's
// secret, so it must be a regular file (not a link someone else could aim)
// that this user owns and nobody else may read or write; otherwise another
// user of a shared file system could read the token, or plant one of theirs.
std::string read_store_token_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return "";
    TANDEM_CHECK_ARG(error != ELOOP,
                     "TANDEM_STORE_TOKEN_FILE={} is a symbolic link; the token is read only "
                     "from a regular file this user owns: name the file itself",
                     path);
    TANDEM_THROW(UsageError, "TANDEM_STORE_TOKEN_FILE={}: cannot open it: {}", path,
                 std::strerror(error));
  }
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  std::string text;
  if (stated && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0) {
    char buffer[4096];
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got > 0) text.assign(buffer, static_cast<size_t>(got));
  }
  ::close(fd);
  TANDEM_CHECK_ARG(stated && S_ISREG(st.st_mode),
                   "TANDEM_STORE_TOKEN_FILE={} is not a regular file; name a file (tandem "
                   "creates it, mode 0600, when it does not exist)",
                   path);
  TANDEM_CHECK_ARG(st.st_uid == ::geteuid(),
                   "TANDEM_STORE_TOKEN_FILE={} belongs to uid {}, not to this user (uid {}): "
                   "another user could have planted its token. Remove it, or use a file in a "
                   "folder only you can write",
                   path, st.st_uid, ::geteuid());
  TANDEM_CHECK_ARG((st.st_mode & 077) == 0,
                   "TANDEM_STORE_TOKEN_FILE={} has mode {:04o}: other users may read or change "
                   "the job's token. `chmod 600 {}`, or remove it so that the job creates a "
                   "new one with mode 0600",
                   path, st.st_mode & 07777, path);
  std::istringstream in(text);
  std::string token;
  in >> token;
  return token;
}

}  // namespace

std::string store_token_from_file(const std::string& path) {
  std::string token = read_store_token_file(path);
  if (!token.empty()) return token;
  token = detail::random_token_hex();
  const std::string temp = path + ".tmp" + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || ::write(fd, (token + "\n").data(), token.size() + 1) !=
                    static_cast<ssize_t>(token.size() + 1)) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(temp.c_str());
    TANDEM_THROW(UsageError,
                 "TANDEM_STORE_TOKEN_FILE={}: cannot write {}: {}. Give a path in a folder "
                 "every task can write, on a file system every node shares",
                 path, temp, std::strerror(error));
  }
  ::fsync(fd);
  ::close(fd);
  const bool placed = ::link(temp.c_str(), path.c_str()) == 0;
  const int error = errno;
  ::unlink(temp.c_str());
  if (!placed && error != EEXIST) {
    TANDEM_THROW(UsageError, "TANDEM_STORE_TOKEN_FILE={}: cannot create it: {}", path,
                 std::strerror(error));
  }
  token = read_store_token_file(path);
  if (token.empty()) {
    TANDEM_THROW(UsageError, "TANDEM_STORE_TOKEN_FILE={} is empty; remove it and start again", path);
  }
  return token;
}


RankEnv RankEnv::from_map(const VarMap& vars) {
  RankEnv env;
  env.restart_count = parse_int(vars, "TANDEM_RESTART_COUNT",
                                parse_int(vars, "TORCHELASTIC_RESTART_COUNT", 0, 0), 0);
  env.socket_ifname = get(vars, "TANDEM_SOCKET_IFNAME", get(vars, "GLOO_SOCKET_IFNAME", ""));
  env.shared_memory = parse_int(vars, "TANDEM_SHM", 1, 0) != 0;
  env.hierarchical = get(vars, "TANDEM_HIERARCHICAL", "");
  env.cuda_backend = get(vars, "TANDEM_CUDA_BACKEND", "");
  env.timeout_s = parse_int(vars, "TANDEM_TIMEOUT_S", 0, 1);
  env.debug_detail = read_debug_detail(vars);
  env.store_token = get(vars, "TANDEM_STORE_TOKEN", "");
  env.error_file = get(vars, "TANDEM_ERROR_FILE", get(vars, "TORCHELASTIC_ERROR_FILE", ""));
  if (const std::string* job = find_variable(vars, "SLURM_JOB_ID")) {
    // Also under a launcher: its workers inherit the step's variables.
    const std::string* step = find_variable(vars, "SLURM_STEP_ID");
    env.slurm_step = *job + "." + (step != nullptr && !step->empty() ? *step : "batch");
  }
  if (find_variable(vars, "RANK") && find_variable(vars, "WORLD_SIZE")) {
    env.source = RankEnvSource::kTorchrun;
    env.rank = parse_int(vars, "RANK", 0, 0);
    env.world_size = parse_int(vars, "WORLD_SIZE", 1, 1);
    env.local_rank = parse_int(vars, "LOCAL_RANK", env.rank, 0);
    env.local_world_size = parse_int(vars, "LOCAL_WORLD_SIZE", env.world_size, 1);
    env.node_rank = parse_int(vars, "GROUP_RANK", 0, 0);
    std::string agent = get(vars, "TORCHELASTIC_USE_AGENT_STORE", "");
    env.agent_store = agent == "True" || agent == "true" || agent == "1";
    read_master(vars, env);
    validate(env, "RANK", "WORLD_SIZE");
  } else if (auto step = SlurmStep::from_map(vars); step && !step->in_batch_script()) {
    // srun started this process as one task of its step (docs/slurm.md).
    // A program the batch script runs directly is alone: no launcher.
    env.source = RankEnvSource::kSlurm;
    env.rank = step->proc_id;
    env.world_size = step->num_tasks;
    env.local_rank = step->local_id;
    env.local_world_size = step->local_tasks();
    env.node_rank = step->node_id;
    env.master_addr = step->hosts.front();
    // Only without MASTER_PORT (read_master below): a job id that is not
    // a number is an error only when the port comes from it.
    if (!step->job_id.empty() && !find_variable(vars, "MASTER_PORT")) {
      env.master_port = slurm_step_port(step->job_id, step->step_id);
    }
    env.threads = step->cpus_per_task;
    read_master(vars, env);
    validate(env, "SLURM_PROCID", "SLURM_NTASKS");
  } else if (find_variable(vars, "OMPI_COMM_WORLD_RANK") &&
             find_variable(vars, "OMPI_COMM_WORLD_SIZE")) {
    env.source = RankEnvSource::kOpenMpi;
    env.rank = parse_int(vars, "OMPI_COMM_WORLD_RANK", 0, 0);
    env.world_size = parse_int(vars, "OMPI_COMM_WORLD_SIZE", 1, 1);
    env.local_rank = parse_int(vars, "OMPI_COMM_WORLD_LOCAL_RANK", 0, 0);
    env.local_world_size = parse_int(vars, "OMPI_COMM_WORLD_LOCAL_SIZE", env.world_size, 1);
    // Open MPI names no node index (OMPI_COMM_WORLD_NODE_RANK is a process's
    // rank on its node, like the local rank): hosts are told apart by their
    // host id (ProcessGroup::init) alone.
    env.node_rank = 0;
    read_master(vars, env);
    validate(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  }
  return env;
}

RankEnv RankEnv::from_environment() {
  VarMap vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string kv(*entry);
    auto eq = kv.find('=');
    if (eq != std::string::npos) vars.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  RankEnv env = from_map(vars);
  if (env.store_token.empty() && env.world_size > 1) {
    if (const std::string* file = find_variable(vars, "TANDEM_STORE_TOKEN_FILE")) {
      env.store_token = store_token_from_file(*file);
    }
  }
  detail::install_error_file_handler(env);
  return env;
}

}  // namespace tandem
