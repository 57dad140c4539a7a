#include "tandem/parallel/ddp.h"

#include <map>
#include <sstream>

#include <fmt/ranges.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "parallel/reducer.h"
#include "tandem/core/cpu_allocator.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem {
namespace {

std::string signature(const std::string& name, const at::Tensor& t) {
  std::ostringstream shape;
  shape << t.sizes();
  return name + " " + c10::toString(t.scalar_type()) + shape.str();
}

// Every rank must wrap the same model; compare against rank 0 and name the
// first difference. Every rank reaches the same verdict, so none hangs.
void check_same_model(ProcessGroup& pg, const std::vector<std::string>& signatures) {
  std::string mine;
  for (const auto& s : signatures) mine += s + "\n";
  auto all = pg.all_gather_strings(mine);
  auto split = [](const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  };
  const auto reference = split(all[0]);
  for (int r = 1; r < static_cast<int>(all.size()); ++r) {
    if (all[r] == all[0]) continue;
    const auto other = split(all[r]);
    std::size_t k = 0;
    while (k < reference.size() && k < other.size() && reference[k] == other[k]) ++k;
    std::string on_zero = k < reference.size() ? reference[k] : "(no more parameters)";
    std::string on_r = k < other.size() ? other[k] : "(no more parameters)";
    TANDEM_THROW(UsageError,
                 "DistributedDataParallel: rank {} has a different model than rank 0 ({} vs {} "
                 "parameters). First difference at parameter #{}: rank 0 has '{}', rank {} has "
                 "'{}'. Every rank must build the same model (same config, same code) before "
                 "wrapping it",
                 r, other.size(), reference.size(), k, on_zero, r, on_r);
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> process_group,
                                                 DDPOptions options)
    : module_(std::move(module)), process_group_(std::move(process_group)), options_(options) {
  TANDEM_CHECK_ARG(module_ != nullptr, "DistributedDataParallel: the module is null");
  TANDEM_CHECK_ARG(process_group_ != nullptr, "DistributedDataParallel: the process group is null");
  if (options_.cache_cpu_allocations) enable_cpu_caching_allocator();
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<std::string> signatures;
  std::vector<at::Tensor> state;
  // A tied tensor gets one gradient slot and one hook: two would adopt and
  // reduce the same .grad twice, racing with the bucket already in flight.
  for (const auto& item : unique_named_parameters(*module_)) {
    TANDEM_CHECK_ARG(holds_memory(item.tensor),
                     "DistributedDataParallel: parameter '{}' holds no memory: its Sharded unit "
                     "was cut to one rank's shard by tandem::zero::Init (or freed by a stage-3 "
                     "ZeroOptimizer). DDP needs whole parameters: build the model without "
                     "zero::Init, or train it with ZeRO stage 3",
                     item.name);
    std::string sig = signature(item.name, item.tensor);
    if (!item.tensor.requires_grad()) sig += " frozen";
    if (!item.aliases.empty()) sig += fmt::format(" tied to {}", fmt::join(item.aliases, ", "));
    signatures.push_back(std::move(sig));
    state.push_back(item.tensor);
    if (!item.tensor.requires_grad()) continue;
    params.push_back(item.tensor);
    names.push_back(item.name);
  }
  check_same_model(*process_group_, signatures);
  for (const auto& item : unique_named_buffers(*module_)) state.push_back(item.second);
  broadcast_coalesced(*process_group_, state);
  std::function<void()> after_sync;
  if (options_.broadcast_buffers) after_sync = [this] { sync_buffers(); };
  reducer_ = std::make_unique<detail::Reducer>(std::move(params), std::move(names), *process_group_,
                                               options_, std::move(after_sync));
}

DistributedDataParallel::~DistributedDataParallel() = default;

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.reducer_->sync_enabled()) {
  ddp_.reducer_->set_sync_enabled(false);
}

DistributedDataParallel::NoSync::~NoSync() { ddp_.reducer_->set_sync_enabled(previous_); }

void DistributedDataParallel::set_gradient_sync(bool enabled) {
  reducer_->set_sync_enabled(enabled);
}

bool DistributedDataParallel::gradient_sync() const { return reducer_->sync_enabled(); }

void DistributedDataParallel::register_comm_hook(std::shared_ptr<CommHook> hook) {
  reducer_->register_hook(std::move(hook));
}

void DistributedDataParallel::register_comm_hook(std::function<HookWork(GradBucket&)> hook,
                                                 std::string name) {
  register_comm_hook(std::make_shared<FunctionHook>(std::move(hook), std::move(name)));
}

CommHook& DistributedDataParallel::comm_hook() const { return reducer_->hook(); }

void DistributedDataParallel::sync_buffers() {
  // Written through variable_data(), which shares the storage but not the
  // version counter: a buffer the forward saved for backward (a scale
  // factor) would otherwise fail a second backward over a retained graph
  // ("modified by an inplace operation"), which PyTorch's DDP, broadcasting
  // before the forward instead, runs.
  std::vector<at::Tensor> buffers;
  for (const auto& item : unique_named_buffers(*module_)) {
    buffers.push_back(item.second.variable_data());
  }
  broadcast_coalesced(*process_group_, buffers, buffer_source_);
}

void DistributedDataParallel::set_buffer_source(int rank) {
  TANDEM_CHECK_ARG(rank >= 0 && rank < process_group_->world_size(),
                   "DistributedDataParallel::set_buffer_source: rank {} is not a rank of the "
                   "{}-rank group",
                   rank, process_group_->world_size());
  buffer_source_ = rank;
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_parameter_names() const {
  return reducer_->bucket_names();
}

bool DistributedDataParallel::buckets_rebuilt() const { return reducer_->rebuilt(); }

void DistributedDataParallel::set_bucket_layout(
    const std::vector<std::vector<std::string>>& names) {
  reducer_->adopt_layout(names);
}

std::int64_t DistributedDataParallel::sync_count() const { return reducer_->sync_count(); }
void DistributedDataParallel::set_wait_timing(bool enabled) { reducer_->set_wait_timing(enabled); }
double DistributedDataParallel::communication_wait_seconds() const {
  return reducer_->wait_seconds();
}

}  // namespace tandem
