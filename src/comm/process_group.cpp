#include "tandem/comm/process_group.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "comm/comm_error.h"
#include "comm/process_group_impl.h"
#include "comm/rendezvous.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // Gloo has no AVG: SUM, then divide on completion.
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

void check_tensor(const at::Tensor& tensor, const char* op, const char* name) {
  TANDEM_CHECK_ARG(tensor.defined(), "{}: {} is an undefined tensor", op, name);
  TANDEM_CHECK_ARG(tensor.is_contiguous() && !tensor.is_sparse(),
                   "{}: {} must be a dense contiguous tensor; call .contiguous() first", op, name);
}

void check_avg(const at::Tensor& tensor, ReduceOp op, const char* name) {
  TANDEM_CHECK_ARG(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()),
                   "{}: ReduceOp::kAvg needs a floating-point tensor, got {}; use kSum and divide",
                   name, c10::toString(tensor.scalar_type()));
}

// The whole tensor of a gather or scatter (`name`) against this rank's part.
void check_whole(const at::Tensor& whole, const at::Tensor& part, int world, const char* op,
                 const char* name) {
  TANDEM_CHECK_ARG(whole.numel() == part.numel() * world &&
                       whole.scalar_type() == part.scalar_type() &&
                       whole.device() == part.device(),
                   "{}: {} must hold world_size ({}) x {} elements of {} on {}, got {} of {} on {}",
                   op, name, world, part.numel(), c10::toString(part.scalar_type()),
                   part.device().str(), whole.numel(), c10::toString(whole.scalar_type()),
                   whole.device().str());
}

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

std::string default_host_id() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  return std::string(host) + "/" + boot_id;
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
  // Before the rendezvous: every rank's progress key is fresh once all joined.
  impl->monitor = std::make_shared<detail::ProgressMonitor>(impl->store, rank, world_size,
                                                            options.progress_interval);
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(make_gloo_device(options));
  try {
    impl->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, rank, world_size,
                                                             gloo_options);
  } catch (...) {
    detail::rethrow_as_comm_error(
        fmt::format("joining the Gloo group ({} ranks)", world_size), options.timeout);
  }
  log_debug("joined a Gloo group of {} ranks", world_size);
  if (detail::flight_recorder_turned_off()) {
    log_debug("c10d's Flight Recorder is off: LibTorch before 2.13 can crash in it when two "
              "groups record at once (set TORCH_FR_BUFFER_SIZE to turn it on anyway)");
  }
  auto pg = std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
  if (options.shared_memory && world_size > 1) pg->setup_shared_memory();
  pg->impl_->sequence = 0;  // number, record and check only the caller's collectives
  pg->impl_->setting_up = false;
  return pg;
}

std::shared_ptr<ProcessGroup> ProcessGroup::init(const RankEnv& env,
                                                 const ProcessGroupOptions& options) {
  if (env.launched()) set_process_rank_label(env.rank, env.world_size);
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
  if (!env.cuda_backend.empty()) resolved.cuda_backend = parse_cuda_backend(env.cuda_backend);
  auto store = detail::connect_store(env, resolved.timeout);
  return create(std::move(store), env.rank, env.world_size, resolved);
}

// ---- queries ----------------------------------------------------------------

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::world_size() const { return impl_->world_size; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->options.timeout; }
std::string ProcessGroup::backend_name() const { return impl_->is_local() ? "local" : "gloo"; }
bool ProcessGroup::uses_shared_memory() const { return impl_->shm != nullptr; }

void ProcessGroup::setup_shared_memory() {
  // Collective: every rank takes the same branches, decided on gathered data.
  const std::string host = impl_->options.host_id.empty() ? default_host_id() : impl_->options.host_id;
  auto hosts = all_gather_strings(host);
  if (std::any_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h != hosts[0]; })) {
    log_debug("ranks span several hosts: all-reduce uses Gloo");
    return;
  }
  const int world = impl_->world_size;
  const std::size_t bytes = detail::ShmTransport::segment_bytes(world);
  detail::ShmSegment segment;
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
  if (impl_->rank == 0 && segment.valid()) segment.unlink();
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

// ---- collectives ------------------------------------------------------------

Work ProcessGroup::all_reduce_async(at::Tensor tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce", "the tensor");
  check_avg(tensor, op, "all_reduce");
  if (impl_->is_local()) return Work();
  const auto reduce = static_cast<std::int64_t>(op);
  if (impl_->on_shm(tensor, /*reduces=*/true)) {
    auto call = impl_->begin(detail::CollectiveOp::kAllReduce, &tensor, "shm", reduce);
    return impl_->shm_work(impl_->shm->all_reduce(tensor, op, call.what), call);
  }
  auto call = impl_->begin(detail::CollectiveOp::kAllReduce, &tensor,
                           impl_->backend_name_for(tensor), reduce);
  auto& backend = impl_->backend_for(tensor);
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = impl_->backend_timeout(tensor);
  // Gloo cannot reduce bfloat16: reduce an fp32 copy and round once at the end.
  const bool upcast = tensor.scalar_type() == at::kBFloat16 && !impl_->uses_nccl(tensor);
  at::Tensor wire = upcast ? tensor.to(at::kFloat) : tensor;
  std::function<void()> finish = [tensor, wire, upcast, op, world = impl_->world_size]() mutable {
    if (op == ReduceOp::kAvg) wire.div_(world);
    if (upcast) tensor.copy_(wire);
  };
  return impl_->launch(
      call,
      [&] {
        std::vector<at::Tensor> tensors{wire};
        return backend.allreduce(tensors, opts);
      },
      std::move(finish));
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op).wait();
}

namespace {

// Gloo has no bfloat16 type. Broadcast and all-gather only move bytes, so a
// bf16 tensor travels as fp16 with the same bits (same element size).
at::Tensor as_gloo_bytes(const at::Tensor& tensor, bool nccl) {
  return tensor.scalar_type() == at::kBFloat16 && !nccl ? tensor.view(at::kHalf) : tensor;
}

}  // namespace

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast", "the tensor");
  TANDEM_CHECK_ARG(root >= 0 && root < impl_->world_size,
                   "broadcast: root {} is not a rank of this world of {}", root, impl_->world_size);
  if (impl_->is_local()) return;
  auto call = impl_->begin(detail::CollectiveOp::kBroadcast, &tensor,
                           impl_->backend_name_for(tensor), -1, root);
  auto& backend = impl_->backend_for(tensor);
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = impl_->backend_timeout(tensor);
  impl_->launch(call, [&] {
          std::vector<at::Tensor> tensors{as_gloo_bytes(tensor, impl_->uses_nccl(tensor))};
          return backend.broadcast(tensors, opts);
        }).wait();
}

namespace {

// The all-gather proper, for a collective already begun as `call` (also the
// inner gathers of all_gather_bytes, which are numbered and checked once).
std::vector<at::Tensor> gather_tensor(ProcessGroup::Impl& impl, const at::Tensor& tensor,
                                      const ProcessGroup::Impl::Call& call) {
  // Gloo divides by the element count: empty tensors must not reach it.
  if (tensor.numel() == 0) {
    return std::vector<at::Tensor>(static_cast<size_t>(impl.world_size), tensor.clone());
  }
  if (impl.on_shm(tensor, /*reduces=*/false)) {
    std::vector<int64_t> shape{impl.world_size};
    shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
    at::Tensor all = at::empty(shape, tensor.options());
    impl.shm_work(impl.shm->all_gather(all, tensor, call.what), call).wait();
    return all.unbind(0);
  }
  auto& backend = impl.backend_for(tensor);
  const bool nccl = impl.uses_nccl(tensor);
  std::vector<at::Tensor> results;
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < impl.world_size; ++r) {
    results.push_back(at::empty_like(tensor));
    outputs[0].push_back(as_gloo_bytes(results.back(), nccl));
  }
  c10d::AllgatherOptions opts;
  opts.timeout = impl.backend_timeout(tensor);
  impl.launch(call, [&] {
        std::vector<at::Tensor> inputs{as_gloo_bytes(tensor.contiguous(), nccl)};
        return backend.allgather(outputs, inputs, opts);
      }).wait();
  return results;
}

}  // namespace

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  check_tensor(tensor, "all_gather", "the input");
  if (impl_->is_local()) {
    return std::vector<at::Tensor>(static_cast<size_t>(impl_->world_size), tensor.clone());
  }
  auto call = impl_->begin(detail::CollectiveOp::kAllGather, &tensor,
                           impl_->transport_name(tensor, /*reduces=*/false));
  return gather_tensor(*impl_, tensor, call);
}

void ProcessGroup::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  check_tensor(input, "all_gather_into", "the input");
  check_tensor(output, "all_gather_into", "the output");
  const int64_t n = input.numel();
  check_whole(output, input, impl_->world_size, "all_gather_into", "output");
  auto flat_out = output.view({-1});
  if (impl_->is_local()) {
    flat_out.copy_(input.reshape({-1}));
    return;
  }
  auto call = impl_->begin(detail::CollectiveOp::kAllGatherInto, &input,
                           impl_->transport_name(input, /*reduces=*/false));
  if (n == 0) return;
  if (impl_->on_shm(input, /*reduces=*/false)) {
    impl_->shm_work(impl_->shm->all_gather(flat_out, input, call.what), call).wait();
    return;
  }
  // Gloo or NCCL: ranks on several hosts, or CUDA tensors.
  auto& backend = impl_->backend_for(input);
  std::vector<std::vector<at::Tensor>> outputs(1);
  const bool nccl = impl_->uses_nccl(input);
  for (int r = 0; r < impl_->world_size; ++r) {
    outputs[0].push_back(as_gloo_bytes(flat_out.narrow(0, r * n, n), nccl));
  }
  c10d::AllgatherOptions opts;
  opts.timeout = impl_->backend_timeout(input);
  impl_->launch(call, [&] {
          std::vector<at::Tensor> inputs{as_gloo_bytes(input.reshape({-1}), nccl)};
          return backend.allgather(outputs, inputs, opts);
        }).wait();
}

void ProcessGroup::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_tensor(input, "reduce_scatter", "the input");
  check_tensor(output, "reduce_scatter", "the output");
  check_avg(input, op, "reduce_scatter");
  const int world = impl_->world_size;
  const int64_t n = output.numel();
  check_whole(input, output, world, "reduce_scatter", "input");
  auto flat_out = output.view({-1});
  if (impl_->is_local()) {
    flat_out.copy_(input.reshape({-1}));
    return;
  }
  auto call = impl_->begin(detail::CollectiveOp::kReduceScatter, &input,
                           impl_->transport_name(input, /*reduces=*/true),
                           static_cast<std::int64_t>(op));
  if (n == 0) return;
  if (impl_->on_shm(input, /*reduces=*/true)) {
    impl_->shm_work(impl_->shm->reduce_scatter(flat_out, input, op, call.what), call).wait();
    return;
  }
  auto& backend = impl_->backend_for(input);
  auto flat_in = input.view({-1});
  if (impl_->uses_nccl(input)) {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = impl_->backend_timeout(input);
    std::vector<std::vector<at::Tensor>> inputs(1);
    for (int r = 0; r < world; ++r) inputs[0].push_back(flat_in.narrow(0, r * n, n));
    impl_->launch(call, [&] {
            std::vector<at::Tensor> outputs{flat_out};
            return backend.reduce_scatter(outputs, inputs, opts);
          }).wait();
    if (op == ReduceOp::kAvg) output.div_(world);
    return;
  }
  // Gloo (ranks on several hosts, or a dtype the shared-memory kernels do not
  // reduce): all-to-all moves chunk r of every rank to rank r; reduce locally.
  auto received = at::empty({world * n}, input.options());
  c10d::AllToAllOptions opts;
  opts.timeout = impl_->options.timeout;
  impl_->launch(call, [&] {
          std::vector<int64_t> even_split;
          at::Tensor into = as_gloo_bytes(received, false);
          at::Tensor from = as_gloo_bytes(flat_in, false);
          return backend.alltoall_base(into, from, even_split, even_split, opts);
        }).wait();
  auto chunks = received.view({world, n});
  switch (op) {
    case ReduceOp::kSum: at::sum_out(flat_out, chunks, {0}); break;
    case ReduceOp::kAvg: at::sum_out(flat_out, chunks, {0}); flat_out.div_(world); break;
    case ReduceOp::kMax: at::amax_out(flat_out, chunks, {0}); break;
    case ReduceOp::kMin: at::amin_out(flat_out, chunks, {0}); break;
  }
}

void ProcessGroup::barrier() {
  if (impl_->is_local()) return;
  c10d::BarrierOptions opts;
  opts.timeout = impl_->options.timeout;
  auto call = impl_->begin(detail::CollectiveOp::kBarrier, nullptr, "gloo");
  impl_->launch(call, [&] { return impl_->gloo->barrier(opts); }).wait();
}

std::vector<std::vector<std::uint8_t>> ProcessGroup::all_gather_bytes(
    const std::vector<std::uint8_t>& bytes) {
  if (impl_->is_local()) return {bytes};
  // Sizes differ between ranks by design: the fingerprint holds no shape.
  auto call = impl_->begin(detail::CollectiveOp::kAllGatherBytes, nullptr, "gloo");
  auto size = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  auto sizes = gather_tensor(*impl_, size, call);
  int64_t longest = 1;
  for (const auto& s : sizes) longest = std::max(longest, s.item<int64_t>());
  auto padded = at::zeros({longest}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), padded.data_ptr<std::uint8_t>());
  auto gathered = gather_tensor(*impl_, padded, call);
  std::vector<std::vector<std::uint8_t>> result;
  for (size_t r = 0; r < gathered.size(); ++r) {
    const auto* data = gathered[r].data_ptr<std::uint8_t>();
    result.emplace_back(data, data + sizes[r].item<int64_t>());
  }
  return result;
}

std::vector<std::string> ProcessGroup::all_gather_strings(const std::string& text) {
  auto gathered = all_gather_bytes(std::vector<std::uint8_t>(text.begin(), text.end()));
  std::vector<std::string> result;
  for (const auto& bytes : gathered) result.emplace_back(bytes.begin(), bytes.end());
  return result;
}

}  // namespace tandem
