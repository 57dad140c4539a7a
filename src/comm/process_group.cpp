#include "tandem/comm/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <ATen/Parallel.h>

#include "comm/comm_error.h"
#include "comm/process_group_impl.h"
#include "comm/rendezvous.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

std::shared_ptr<::gloo::transport::Device> make_gloo_device(const ProcessGroupOptions& options) {
  try {
    if (!options.gloo_interface.empty()) {
      return c10d::ProcessGroupGloo::createDeviceForInterface(options.gloo_interface);
    }
    return c10d::ProcessGroupGloo::createDeviceForHostname(
        options.gloo_host.empty() ? "127.0.0.1" : options.gloo_host);
  } catch (const std::exception& e) {
    std::string reason = e.what();
    reason.resize(std::min(reason.find('\n'), reason.size()));
    TANDEM_THROW(CommError,
                 "cannot open a Gloo device on {}: {}. Set TANDEM_SOCKET_IFNAME to a network "
                 "interface that reaches the other nodes",
                 options.gloo_interface.empty() ? options.gloo_host : options.gloo_interface,
                 reason);
  }
}

// Throws UsageError naming the ranks when they connect with different
// transport settings (`settings[r]` is rank r's): they would take different
// branches while connecting and hang.
void check_same_settings(const std::vector<std::string>& settings,
                         const detail::GroupRanks& group) {
  std::vector<int> odd;
  for (int r = 0; r < static_cast<int>(settings.size()); ++r) {
    if (settings[static_cast<std::size_t>(r)] != settings[0]) odd.push_back(r);
  }
  if (odd.empty()) return;
  TANDEM_THROW(UsageError,
               "the ranks{} connect with different transport settings: {} has '{}' but {} "
               "'{}'. Set ProcessGroupOptions::shared_memory and ::hierarchical (or TANDEM_SHM "
               "and TANDEM_HIERARCHICAL) alike on every rank",
               group.suffix(), group.name(0), settings[0], group.name(odd),
               settings[static_cast<std::size_t>(odd[0])]);
}

// The machine (host name and boot id) and its network namespace: ranks in
// different network namespaces of one machine are on different hosts, as
// the multi-node tests' hosts are.
std::string default_host_id() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  char net[64] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/net", net, sizeof(net) - 1);
  return std::string(host) + "/" + boot_id + (n > 0 ? "/" + std::string(net, n) : "");
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

CudaBackend parse_cuda_backend(const std::string& text) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "auto" || t.empty()) return CudaBackend::kAuto;
  if (t == "nccl") return CudaBackend::kNccl;
  if (t == "gloo") return CudaBackend::kGloo;
  TANDEM_THROW(UsageError, "unknown backend '{}': use auto, nccl or gloo", text);
}

Hierarchical parse_hierarchical(const std::string& text) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "auto" || t == "1" || t.empty()) return Hierarchical::kAuto;
  if (t == "off" || t == "0") return Hierarchical::kOff;
  if (t == "leader") return Hierarchical::kLeader;
  if (t == "split") return Hierarchical::kSplit;
  TANDEM_THROW(UsageError,
               "unknown hierarchical mode '{}' (TANDEM_HIERARCHICAL): use auto, off, leader or "
               "split",
               text);
}

const char* to_string(Hierarchical mode) {
  switch (mode) {
    case Hierarchical::kAuto: return "auto";
    case Hierarchical::kOff: return "off";
    case Hierarchical::kLeader: return "leader";
    case Hierarchical::kSplit: return "split";
  }
  return "?";
}

// ---- construction -----------------------------------------------------------

std::atomic<int>& detail::live_process_groups() {
  static std::atomic<int> count{0};
  return count;
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  if (!impl_->is_local()) detail::live_process_groups().fetch_add(1);
}
ProcessGroup::~ProcessGroup() {
  if (!impl_->is_local()) detail::live_process_groups().fetch_sub(1);
}

std::shared_ptr<ProcessGroup> ProcessGroup::local() {
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::make_unique<Impl>()));
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                   int world_size,
                                                   const ProcessGroupOptions& options) {
  TANDEM_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size,
                   "invalid rank {} for world size {}", rank, world_size);
#if !defined(TANDEM_WITH_NCCL)
  TANDEM_CHECK_ARG(options.cuda_backend != CudaBackend::kNccl,
                   "the NCCL backend was requested but this LibTorch has no NCCL; use gloo");
#endif
  set_thread_rank_label(rank, world_size);
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->world_size = world_size;
  impl->options = options;
  impl->store = std::move(store);
  impl->device = make_gloo_device(options);
  return connect(std::move(impl));
}

std::shared_ptr<ProcessGroup> ProcessGroup::connect(std::unique_ptr<Impl> impl) {
  const int world_size = impl->world_size;
  const auto& options = impl->options;
  // Before the rendezvous: every rank's progress key is fresh once all joined.
  impl->monitor = std::make_shared<detail::ProgressMonitor>(
      impl->store, impl->rank, world_size, options.progress_interval, impl->group);
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(impl->device);
  c10::intrusive_ptr<compat::BackendBase> gloo;
  try {
    gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, impl->rank, world_size,
                                                       gloo_options);
  } catch (...) {
    const std::string which = impl->group.is_world() ? std::string("the Gloo group")
                                                     : "the Gloo group of " + impl->group.label();
    detail::rethrow_as_comm_error(fmt::format("joining {} ({} ranks)", which, world_size),
                                  options.timeout);
  }
  log_debug("joined a Gloo group of {} ranks{}", world_size, impl->group.suffix());
  impl->c10d = std::make_unique<detail::C10dTransport>(std::move(gloo), impl->store, impl->rank,
                                                       world_size, options.timeout,
                                                       options.cuda_backend);
  impl->choose_transports();
  if (detail::flight_recorder_turned_off()) {
    log_debug("c10d's Flight Recorder is off: LibTorch before 2.13 can crash in it when two "
              "groups record at once (set TORCH_FR_BUFFER_SIZE to turn it on anyway)");
  }
  auto pg = std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
  if (world_size > 1) {
    // Every rank's transport settings and host, so that all take the same
    // branches below (decided on gathered data) or all refuse.
    const auto& opts = pg->impl_->options;
    auto mine = fmt::format("shared_memory={} hierarchical={}", opts.shared_memory ? "on" : "off",
                            to_string(opts.hierarchical));
    auto gathered = pg->all_gather_strings(mine + "\n" + pg->host_id());
    std::vector<std::string> settings;
    std::vector<std::string> hosts;
    for (const auto& g : gathered) {
      const auto cut = g.find('\n');
      settings.push_back(g.substr(0, cut));
      hosts.push_back(g.substr(cut + 1));
    }
    check_same_settings(settings, pg->impl_->group);
    pg->impl_->host_ids = hosts;
    // Each step's mechanism carries the steps after it (choose_transports).
    if (opts.shared_memory) pg->setup_shared_memory(hosts);
    pg->impl_->choose_transports();
    if (opts.shared_memory && opts.hierarchical != Hierarchical::kOff) pg->setup_hierarchy(hosts);
    pg->impl_->choose_transports();
  }
  pg->impl_->sequence = 0;  // number, record and check only the caller's collectives
  pg->impl_->setting_up = false;
  return pg;
}

std::shared_ptr<ProcessGroup> ProcessGroup::init(const RankEnv& env,
                                                 const ProcessGroupOptions& options) {
  if (env.launched()) set_process_rank_label(env.rank, env.world_size);
  // srun's --cpus-per-task sizes the intra-op pool, unless OMP_NUM_THREADS
  // says otherwise (OpenMP read that one already).
  if (env.threads > 0 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    at::set_num_threads(env.threads);
  }
  ProcessGroupOptions resolved = options;
  if (env.timeout_s > 0) resolved.timeout = std::chrono::seconds(env.timeout_s);
  resolved.debug_detail = resolved.debug_detail || env.debug_detail;
  if (env.world_size == 1) {
    auto pg = local();
    pg->impl_->options = resolved;  // nothing to connect; timeout() still tells
    return pg;
  }
  if (resolved.gloo_host.empty() && resolved.gloo_interface.empty()) {
    if (!env.socket_ifname.empty()) {
      resolved.gloo_interface = env.socket_ifname;
    } else {
      resolved.gloo_host = detail::local_address_toward(env.master_addr, env.master_port);
      if (resolved.gloo_host.empty()) resolved.gloo_host = "127.0.0.1";
    }
  }
  if (resolved.host_id.empty()) {
    // Launchers on different nodes never share memory, even when two "nodes"
    // are network namespaces of one machine.
    resolved.host_id = default_host_id() + "/node" + std::to_string(env.node_rank);
  }
  resolved.shared_memory = resolved.shared_memory && env.shared_memory;
  if (!env.hierarchical.empty()) resolved.hierarchical = parse_hierarchical(env.hierarchical);
  if (!env.cuda_backend.empty()) resolved.cuda_backend = parse_cuda_backend(env.cuda_backend);
  auto store = detail::connect_store(env, resolved.timeout);
  return create(std::move(store), env.rank, env.world_size, resolved);
}

// ---- queries ----------------------------------------------------------------

int ProcessGroup::rank() const { return impl_->outside.empty() ? impl_->rank : -1; }
int ProcessGroup::world_size() const { return impl_->world_size; }
bool ProcessGroup::is_member() const { return impl_->outside.empty(); }
std::vector<std::string> ProcessGroup::host_ids() const {
  // A group of one connects nothing and gathers nothing.
  if (impl_->host_ids.empty() && is_member()) return {host_id()};
  return impl_->host_ids;
}
std::string ProcessGroup::host_id() const {
  return impl_->options.host_id.empty() ? default_host_id() : impl_->options.host_id;
}
std::vector<int> ProcessGroup::global_ranks() const {
  if (!impl_->group.is_world()) return impl_->group.members();
  std::vector<int> ranks(static_cast<std::size_t>(impl_->world_size));
  for (int r = 0; r < impl_->world_size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  return ranks;
}
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->options.timeout; }
std::string ProcessGroup::backend_name() const { return impl_->is_local() ? "local" : "gloo"; }
bool ProcessGroup::uses_shared_memory() const { return impl_->shm != nullptr; }
bool ProcessGroup::uses_hierarchical() const { return impl_->hier != nullptr; }
std::string ProcessGroup::hierarchical_form() const {
  if (!impl_->hier) return "";
  return impl_->hier->form() == detail::HierarchicalForm::kSplit ? "split" : "leader";
}

void ProcessGroup::setup_shared_memory(const std::vector<std::string>& hosts) {
  // Collective: every rank takes the same branches, decided on gathered data.
  if (std::count(hosts.begin(), hosts.end(), hosts[impl_->rank]) > 1) {
    impl_->mailbox = std::make_unique<detail::ShmMailbox>(impl_->store, impl_->rank,
                                                          impl_->options.timeout);
  }
  if (std::any_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h != hosts[0]; })) {
    log_debug("ranks span several hosts: collectives{} use Gloo or the hierarchical path",
              impl_->group.suffix());
    return;
  }
  const int world = impl_->world_size;
  const std::size_t bytes = detail::ShmTransport::segment_bytes(world);
  detail::ShmSegment segment;
  // The name stays in /dev/shm only until every rank has mapped it, also
  // when a peer is gone and the gathers below throw.
  struct UnlinkOnExit {
    detail::ShmSegment& segment;
    bool creator;
    ~UnlinkOnExit() {
      if (creator && segment.valid()) segment.unlink();
    }
  } unlink_on_exit{segment, impl_->rank == 0};
  std::string error;
  if (impl_->rank == 0) {
    try {
      segment = detail::ShmSegment::create(bytes, 0, world);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::string name = all_gather_strings(error.empty() ? segment.name() : std::string())[0];
  if (impl_->rank != 0 && !name.empty()) {
    try {
      segment = detail::ShmSegment::open(name, bytes, impl_->rank, world);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  auto errors = all_gather_strings(error);  // also: every rank has mapped it
  if (impl_->rank == 0 && segment.valid()) segment.unlink();  // now, not at the scope's end
  for (const auto& e : errors) {
    if (!e.empty()) {
      if (impl_->rank == 0) log_warn("shared memory is unavailable, all-reduce uses Gloo: {}", e);
      return;
    }
  }
  impl_->shm = std::make_unique<detail::ShmTransport>(std::move(segment), impl_->rank, world,
                                                      impl_->options.timeout);
}
std::uint64_t ProcessGroup::sequence_number() const { return impl_->sequence; }

}  // namespace tandem
