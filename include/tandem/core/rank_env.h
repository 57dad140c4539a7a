#pragma once
// The rank environment: who this process is in the job.
//
// Parsed once, at program start, from whichever launcher convention is
// present (torchrun/tandem launch, Slurm, OpenMPI), into a plain struct that
// is then passed explicitly. Nothing else in tandem reads these variables.

#include <map>
#include <string>

namespace tandem {

enum class RankEnvSource { kNone, kTorchrun, kSlurm, kOpenMpi };

const char* to_string(RankEnvSource source);

struct RankEnv {
  RankEnvSource source = RankEnvSource::kNone;
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;  // GROUP_RANK under torchrun
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // The launcher already hosts the rendezvous store (torchrun's
  // TORCHELASTIC_USE_AGENT_STORE): rank 0 connects as a client.
  bool agent_store = false;
  int restart_count = 0;
  // Where to write this rank's error file (TANDEM_ERROR_FILE, else
  // TORCHELASTIC_ERROR_FILE); empty without a launcher. See error_file.h.
  std::string error_file;
  // Network interface for Gloo (TANDEM_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME).
  // Empty: use the local address that routes to master_addr.
  std::string socket_ifname;
  // TANDEM_SHM=0 turns the intra-node shared-memory transport off.
  bool shared_memory = true;
  // TANDEM_HIERARCHICAL=auto|off|leader|split: hierarchical CPU collectives
  // across hosts ("" = ProcessGroupOptions::hierarchical, auto by default).
  std::string hierarchical;
  // TANDEM_CUDA_BACKEND=auto|nccl|gloo: backend for CUDA tensors ("" = auto).
  std::string cuda_backend;
  // TANDEM_TIMEOUT_S: limit in seconds for every collective and the
  // rendezvous; 0 (unset) keeps ProcessGroupOptions::timeout (10 minutes).
  int timeout_s = 0;
  // Threads for this process's intra-op pool when OMP_NUM_THREADS is unset:
  // Slurm's --cpus-per-task (SLURM_CPUS_PER_TASK) for a task srun started;
  // 0 leaves LibTorch's default. ProcessGroup::init applies it.
  int threads = 0;
  // TANDEM_DEBUG=DETAIL (or TORCH_DISTRIBUTED_DEBUG=DETAIL): check every
  // collective for a desync across ranks, not only the first ones.
  bool debug_detail = false;
  // TANDEM_STORE_TOKEN: the shared secret of tandem's rendezvous store.
  // `tandem launch` sets it for its workers; jobs without a launcher need
  // the same value on every node when the store is not on loopback. Empty
  // with TORCHELASTIC_USE_AGENT_STORE: the store is a foreign launcher's
  // (torchrun's) c10d TCPStore. from_environment() reads it from
  // TANDEM_STORE_TOKEN_FILE when that is set instead (store_token_from_file).
  std::string store_token;
  // The Slurm job step this process runs in ("10068.1", SlurmStep::name()),
  // also for a worker of a `tandem launch` that srun started; empty outside
  // Slurm. The rendezvous store refuses a process of another step
  // (StoreServerOptions::run_scope), so that two steps sharing a port never
  // form one job.
  std::string slurm_step;

  // True when some launcher set the environment, even for world 1.
  bool launched() const { return source != RankEnvSource::kNone; }

  // Reads the process environment. Throws UsageError naming the variable
  // when a value is malformed or inconsistent (e.g. RANK >= WORLD_SIZE).
  // When the launcher asked for an error file, also installs the handler
  // that writes uncaught exceptions to it (error_file.h).
  static RankEnv from_environment();

  // Same, from an explicit map (used by tests and by from_environment()).
  static RankEnv from_map(const std::map<std::string, std::string>& vars);
};

// The store token kept in `path`, for jobs whose processes share a file
// system (TANDEM_STORE_TOKEN_FILE): the first process to get there writes a
// fresh random token (mode 0600, linked into place whole, so no process reads
// half a file); every other process, and a later run of the same job, reads
// it. The file is the job's secret: a symbolic link, a file another user
// owns, or one other users may read or write (mode & 077) is refused rather
// than trusted. Throws UsageError, naming the path and the fix, for those and
// when it can be neither read nor created.
std::string store_token_from_file(const std::string& path);

// First host of a Slurm node list: "node[03-05,7],gpu1" -> "node03"
// (expand_slurm_host_list() in slurm.h gives them all).
std::string slurm_first_host(const std::string& node_list);

}  // namespace tandem
