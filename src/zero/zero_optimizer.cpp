#include "tandem/zero/zero_optimizer.h"

#include "zero/zero_engine.h"

namespace tandem {

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<torch::nn::Module> model,
                             torch::optim::Optimizer& optimizer,
                             std::shared_ptr<ProcessGroup> process_group, ZeroOptions options)
    : engine_(std::make_unique<detail::ZeroEngine>(std::move(model), optimizer,
                                                   std::move(process_group), nullptr,
                                                   options)) {}

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<torch::nn::Module> model,
                             torch::optim::Optimizer& optimizer,
                             std::shared_ptr<ProcessGroup> shard_group,
                             std::shared_ptr<ProcessGroup> replicate_group, ZeroOptions options)
    : engine_(std::make_unique<detail::ZeroEngine>(std::move(model), optimizer,
                                                   std::move(shard_group),
                                                   std::move(replicate_group), options)) {}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::step() { engine_->step(); }
void ZeroOptimizer::zero_grad() { engine_->zero_grad(); }
double ZeroOptimizer::clip_grad_norm(double max_norm) { return engine_->clip_grad_norm(max_norm); }
double ZeroOptimizer::grad_norm() { return engine_->grad_norm(); }
std::vector<at::Tensor> ZeroOptimizer::gradient_shards() { return engine_->gradient_shards(); }
void ZeroOptimizer::set_gradient_sync(bool enabled) { engine_->set_gradient_sync(enabled); }
bool ZeroOptimizer::gradient_sync() const { return engine_->gradient_sync(); }
int ZeroOptimizer::stage() const { return engine_->stage(); }
const ZeroOptions& ZeroOptimizer::options() const { return engine_->options(); }
ProcessGroup& ZeroOptimizer::process_group() const { return engine_->process_group(); }
ProcessGroup* ZeroOptimizer::replicate_group() const { return engine_->replicate_group(); }
ZeroMemoryStats ZeroOptimizer::memory_stats() const { return engine_->memory_stats(); }
std::vector<std::vector<std::string>> ZeroOptimizer::group_parameter_names() const {
  return engine_->group_names();
}
int64_t ZeroOptimizer::step_count() const { return engine_->step_count(); }
ZeroOptimizer::CommStats ZeroOptimizer::comm_stats() const { return engine_->comm_stats(); }
void ZeroOptimizer::reset_stats() { engine_->reset_stats(); }
double ZeroOptimizer::communication_wait_seconds() const {
  return engine_->communication_wait_seconds();
}
std::vector<ZeroOptimizer::ShardFragment> ZeroOptimizer::shard_fragments() const {
  return engine_->shard_fragments();
}
std::vector<std::string> ZeroOptimizer::state_names() const { return engine_->state_names(); }
void ZeroOptimizer::load_shards(const FragmentSource& source, int64_t step_count) {
  engine_->load_shards(source, step_count);
}
void ZeroOptimizer::load_parameter_shards(const ShardFill& fill) {
  engine_->load_parameter_shards(fill);
}
torch::nn::Module& ZeroOptimizer::module() const { return engine_->module(); }
void ZeroOptimizer::for_each_whole_parameter(
    const std::function<void(const std::string&, const at::Tensor&)>& fn) {
  engine_->for_each_whole_parameter(fn);
}

ZeroOptimizer::GatheredParameters::GatheredParameters(ZeroOptimizer& zero) : zero_(zero) {
  zero_.engine_->gather_all();
}

ZeroOptimizer::GatheredParameters::GatheredParameters(ZeroOptimizer& zero,
                                                      const std::vector<at::Tensor>& params,
                                                      std::optional<int> modifier_rank)
    : zero_(zero), some_(true), modifier_rank_(modifier_rank) {
  const int world = zero_.process_group().world_size();
  TANDEM_CHECK_ARG(!modifier_rank || (*modifier_rank >= 0 && *modifier_rank < world),
                   "ZeroOptimizer::GatheredParameters: modifier_rank {} is not a rank of the "
                   "{}-rank group",
                   modifier_rank.value_or(-1), world);
  zero_.engine_->gather_parameters(params);
}

ZeroOptimizer::GatheredParameters::~GatheredParameters() noexcept(false) {
  if (some_) {
    zero_.engine_->release_held(modifier_rank_);
  } else {
    zero_.engine_->release_all();
  }
}

}  // namespace tandem
