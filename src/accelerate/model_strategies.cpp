// The ways the Accelerator holds a prepared model (model_strategy.h):
// replicated (one process, or DDP), sharded with its optimizer (ZeRO), and
// sharded inside groups, replicated across them (HSDP).

#include <exception>
#include <unordered_map>

#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "accelerate/model_strategies.h"
#include "accelerate/step_controller.h"
#include "comm/agreement.h"
#include "tandem/accelerate/prepared.h"
#include "tandem/amp/master_weights.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors_set.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/zero/zero_optimizer.h"
#include "tandem/zero/zero_weights.h"

namespace tandem::detail {
namespace {

// Throws the first rank's error of every rank's `errors` (empty: none).
void throw_first_failure(const std::vector<std::string>& errors, const char* what) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    TANDEM_THROW(CheckpointError, "{}: [rank {}/{}] {}", what, r, errors.size(), errors[r]);
  }
}

// Every rank learns every rank's error message (empty: none) and all throw
// the first, so no rank goes on into a collective alone.
void agree_or_throw(ProcessGroup& group, const std::string& mine, const char* what) {
  throw_first_failure(group.all_gather_strings(mine), what);
}

// load_model_weights into a model held whole on every rank, and into the
// fp32 masters of `masters`. Collective: a failure on any rank throws on all.
LoadSafetensorsResult load_whole_weights(torch::nn::Module& module, ProcessGroup& group,
                                       const std::string& path,
                                       const LoadSafetensorsOptions& options,
                                       const std::vector<const MasterWeights*>& masters) {
  LoadSafetensorsResult result;
  // Ranks read the same files, so they normally fail alike; agreeing keeps
  // one odd rank (a missing mount) from leaving the others in a collective.
  const std::vector<std::string> errors = run_agreed(group, [&] {
    result = load_safetensors(module, path, options);
    // The optimizer steps fp32 masters of bf16/fp16 parameters: they take
    // the file's values too (at the file's precision, not the rounded one).
    std::unordered_map<const void*, std::vector<std::string>> names;
    for (auto& p : unique_named_parameters(module)) {
      std::vector<std::string>& all = names[p.tensor.unsafeGetTensorImpl()];
      all.push_back(p.name);
      all.insert(all.end(), p.aliases.begin(), p.aliases.end());
    }
    std::unique_ptr<SafetensorsSet> set;
    torch::NoGradGuard no_grad;
    for (const MasterWeights* master : masters) {
      for (std::size_t i = 0; i < master->model_params().size(); ++i) {
        const at::Tensor& m = master->master_params()[i];
        const auto it = names.find(master->model_params()[i].unsafeGetTensorImpl());
        if (it == names.end() || m.unsafeGetTensorImpl() == it->first) continue;
        if (!set) set = std::make_unique<SafetensorsSet>(path);
        for (const auto& name : it->second) {
          if (set->find(options.prefix + name) == nullptr) continue;
          set->read_range_into(options.prefix + name, 0, m.detach());
          break;
        }
      }
    }
    if (set) result.bytes_read += set->bytes_read();
  });
  throw_first_failure(errors, "load_model_weights");
  return result;
}

// Whole on every rank: alone on one process, or wrapped in DDP, which
// all-reduces the gradients in backward.
class ReplicatedModel final : public ModelStrategy {
 public:
  ReplicatedModel(const ModelStrategyParts& parts, const DDPOptions& ddp)
      : ModelStrategy(parts.module) {
    group_ = parts.group;
    if (parts.group->world_size() > 1) {
      ddp_ = std::make_shared<DistributedDataParallel>(module_, parts.group, ddp);
      parts.controller->attach_gradient_sync(
          [ddp = ddp_, holds = no_sync_holds_](bool enabled) {
            ddp->set_gradient_sync(enabled && *holds == 0);
          });
      parts.controller->attach_buffer_source(
          [ddp = ddp_](int rank) { ddp->set_buffer_source(rank); });
    }
  }

  void enter_no_sync(std::size_t) override {
    ++*no_sync_holds_;
    if (ddp_) ddp_->set_gradient_sync(false);
  }
  void leave_no_sync(bool sync) override {
    if (--*no_sync_holds_ == 0 && ddp_) ddp_->set_gradient_sync(sync);
  }

  StrategyRecord record() const override {
    StrategyRecord r;
    r.name = ddp_ ? "ddp" : "single";
    return r;
  }
  std::string describe() const override { return ddp_ ? "DDP" : "one process"; }
  DistributedDataParallel* ddp() override { return ddp_.get(); }
  void check_ready(std::size_t) const override {}
  void time_communication() override {
    if (ddp_) ddp_->set_wait_timing(true);
  }
  double communication_wait_seconds() const override {
    return ddp_ ? ddp_->communication_wait_seconds() : 0.0;
  }

  std::unique_ptr<OptimizerUpdate> attach_optimizer(AcceleratedOptimizer& prepared) override {
    return make_replicated_update(prepared, /*keep_gradients=*/ddp_ != nullptr);
  }

  LoadSafetensorsResult load_weights(const std::string& path,
                                     const LoadSafetensorsOptions& options,
                                     const std::vector<const MasterWeights*>& masters) override {
    return load_whole_weights(*module_, *group_, path, options, masters);
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<DistributedDataParallel> ddp_;
  // Accelerator::no_sync holds alive; shared with the controller's switch.
  std::shared_ptr<int> no_sync_holds_ = std::make_shared<int>(0);
};

// ZeRO stage 1-3: the ZeroOptimizer built over the model and its optimizer
// holds the partitioned parameters, gradients and optimizer state.
class ShardedModel : public ModelStrategy, public PartitionedParameters {
 public:
  ShardedModel(const ModelStrategyParts& parts, const ZeroOptions& options)
      : ModelStrategy(parts.module),
        group_(parts.group),
        controller_(parts.controller),
        options_(options) {
    if (group_->world_size() > 1) {
      // ZeRO broadcasts the parameters it shards; frozen ones and buffers
      // start from rank 0's values here, as DDP would make them.
      std::vector<at::Tensor> state;
      for (const auto& p : unique_parameters(*module_)) {
        if (!p.requires_grad()) state.push_back(p.detach());
      }
      for (const auto& [name, b] : unique_named_buffers(*module_)) state.push_back(b.detach());
      broadcast_coalesced(*group_, state);
    }
  }

  StrategyRecord record() const override {
    StrategyRecord r;
    r.name = "zero";
    r.zero_stage = options_.stage;
    return r;
  }
  std::string describe() const override { return fmt::format("ZeRO stage {}", options_.stage); }
  PartitionedParameters* partitioned() override { return this; }
  std::shared_ptr<ZeroOptimizer> zero() const override { return zero_; }
  // Stage 3 partitions the parameter values themselves.
  bool gathers_parameters_to_save() const override { return options_.stage == 3; }
  // ZeRO measures its waits always (ZeroOptimizer::comm_stats()).
  void time_communication() override {}
  double communication_wait_seconds() const override {
    return zero_ ? zero_->communication_wait_seconds() : 0.0;
  }

  std::unique_ptr<OptimizerUpdate> attach_optimizer(AcceleratedOptimizer& prepared) override {
    TANDEM_CHECK_ARG(zero_ == nullptr,
                     "Accelerator::prepare_optimizer: this prepared model is already sharded "
                     "with another optimizer; under ZeRO put all of a model's parameter groups "
                     "in one optimizer");
    zero_ = make_zero(prepared, options_);
    controller_->attach_gradient_sync([zero = zero_, holds = no_sync_holds_](bool enabled) {
      zero->set_gradient_sync(enabled && *holds == 0);
    });
    if (*no_sync_holds_ > 0) zero_->set_gradient_sync(false);
    return make_sharded_update(zero_);
  }

  void enter_no_sync(std::size_t index) override {
    // DeepSpeed's no_sync refuses these stages for the same reason.
    TANDEM_CHECK_ARG(options_.stage == 1,
                     "Accelerator::no_sync: prepared model {} is sharded with ZeRO stage {}, "
                     "which partitions gradients and reduce-scatters them in every backward, "
                     "so they cannot accumulate locally. Use gradient accumulation instead "
                     "(gradient_accumulation_steps with accumulate(); it accumulates into the "
                     "shards), or ZeRO stage 1",
                     index, options_.stage);
    ++*no_sync_holds_;
    if (zero_) zero_->set_gradient_sync(false);
  }
  void leave_no_sync(bool sync) override {
    if (--*no_sync_holds_ == 0 && zero_) zero_->set_gradient_sync(sync);
  }

  void check_ready(std::size_t index) const override {
    // Its gradients are reduced by the ZeRO optimizer over it; a trainable
    // model without one would train apart on each rank.
    if (zero_ != nullptr || group_->world_size() == 1) return;
    for (const auto& item : unique_named_parameters(*module_)) {
      TANDEM_CHECK_ARG(!item.tensor.requires_grad(),
                       "Accelerator::backward: prepared model {} has trainable parameter '{}' "
                       "but no prepared optimizer over it; under ZeRO its gradients would not "
                       "be reduced across ranks. Prepare an optimizer over its parameters, or "
                       "freeze it (requires_grad_(false))",
                       index, item.name);
    }
  }

  std::vector<std::string> partitioned_names() const override {
    std::vector<std::string> names;
    if (zero_ == nullptr) return names;
    for (const auto& group : zero_->group_parameter_names()) {
      names.insert(names.end(), group.begin(), group.end());
    }
    return names;
  }

  void for_each_partitioned_whole(
      const std::function<void(const std::string&, const at::Tensor&)>& fn) override {
    if (zero_ != nullptr) zero_->for_each_whole_parameter(fn);
  }

  void append_shard_tensors(const std::string& prefix, NamedTensors& out,
                            bool every_replica) const override {
    if (zero_ == nullptr || !(every_replica || writes_shards())) return;
    const std::vector<std::string> states = zero_->state_names();
    for (const auto& f : zero_->shard_fragments()) {
      const std::string name = prefix + f.name;
      out.emplace_back(fragment_key(kModelSection, name, f.begin), f.value);
      if (f.master.defined()) {
        out.emplace_back(fragment_key(kMasterSection, name, f.begin), f.master);
      }
      for (std::size_t s = 0; s < states.size(); ++s) {
        out.emplace_back(fragment_key(optim_section(states[s]), name, f.begin), f.state[s]);
      }
    }
  }

  void restore_shards(const CheckpointReader& checkpoint, const std::string& prefix,
                      bool optimizer_states, int64_t step) override {
    if (zero_ == nullptr) return;
    if (optimizer_states) {
      zero_->load_shards(
          [&](const std::string& section, const std::string& name, int64_t begin,
              int64_t length) {
            const std::string where = section == kModelSection || section == kMasterSection
                                          ? section
                                          : optim_section(section);
            if (!checkpoint.has(where, prefix + name)) return at::Tensor();
            return checkpoint.read_range(where, prefix + name, begin, length);
          },
          step);
      return;
    }
    // Weights only: the shards (and their fp32 masters) take the saved
    // values; the optimizer's moments and step count stay as they are. A
    // read error must not leave the other ranks alone in the all-gather that
    // follows: keep it, then every rank throws it.
    std::string error;
    zero_->load_parameter_shards([&](const std::string& name, int64_t begin,
                                     const at::Tensor& dst) {
      if (!error.empty()) return false;
      try {
        const bool master =
            dst.scalar_type() == at::kFloat && checkpoint.has(kMasterSection, prefix + name);
        dst.copy_(checkpoint.read_range(master ? kMasterSection : kModelSection, prefix + name,
                                        begin, dst.numel()));
        return true;
      } catch (const std::exception& e) {
        error = e.what();
        return false;
      }
    });
    agree_or_throw(*group_, error, "load_state");
  }

  LoadSafetensorsResult load_weights(const std::string& path,
                                     const LoadSafetensorsOptions& options,
                                     const std::vector<const MasterWeights*>&) override {
    // Until its optimizer is prepared the model is still whole.
    if (zero_ == nullptr) return load_whole_weights(*module_, *group_, path, options, {});
    return load_safetensors_into_shards(*zero_, path, options);
  }

 protected:
  // The ZeroOptimizer over this model and `prepared`. Collective.
  virtual std::shared_ptr<ZeroOptimizer> make_zero(AcceleratedOptimizer& prepared,
                                                   const ZeroOptions& options) {
    return std::make_shared<ZeroOptimizer>(module_, prepared, group_, options);
  }
  // Whether this rank's shards go into checkpoints (each shard once).
  virtual bool writes_shards() const { return true; }

 private:
  std::shared_ptr<ProcessGroup> group_;  // the world
  std::shared_ptr<StepController> controller_;
  ZeroOptions options_;  // decoded from the config by the factory
  std::shared_ptr<ZeroOptimizer> zero_;
  std::shared_ptr<int> no_sync_holds_ = std::make_shared<int>(0);
};

// HSDP (ZeRO++'s hpZ partition, FSDP's HYBRID_SHARD): ZeRO 2 or 3 inside
// each shard group of `partition_size` ranks, one copy of the model per
// group; the ZeroOptimizer all-reduces each gradient shard across the
// replicate group. Everything else (frozen parameters, buffers, agreement
// on errors and on overflow) spans the world, as for ZeRO.
class HybridShardedModel final : public ShardedModel {
 public:
  HybridShardedModel(const ModelStrategyParts& parts, const ZeroOptions& options,
                     HybridGroups hybrid)
      : ShardedModel(parts, options), hybrid_(std::move(hybrid)) {}

  StrategyRecord record() const override {
    StrategyRecord r = ShardedModel::record();
    r.name = "hsdp";
    r.hpz_partition_size = hybrid_.partition_size;
    return r;
  }
  std::string describe() const override {
    return fmt::format("HSDP ({} in shard groups of {} ranks)", ShardedModel::describe(),
                       hybrid_.partition_size);
  }

 protected:
  std::shared_ptr<ZeroOptimizer> make_zero(AcceleratedOptimizer& prepared,
                                           const ZeroOptions& options) override {
    return std::make_shared<ZeroOptimizer>(module_, prepared, hybrid_.shard, hybrid_.replicate,
                                           options);
  }
  // The shard groups hold equal shards: the first group's go in.
  bool writes_shards() const override {
    return hybrid_.replicate == nullptr || hybrid_.replicate->rank() == 0;
  }

 private:
  HybridGroups hybrid_;
};

}  // namespace

std::shared_ptr<ModelStrategy> make_replicated_model(const ModelStrategyParts& parts,
                                                     const DDPOptions& ddp) {
  return std::make_shared<ReplicatedModel>(parts, ddp);
}

std::shared_ptr<ModelStrategy> make_sharded_model(const ModelStrategyParts& parts,
                                                  const ZeroOptions& options) {
  return std::make_shared<ShardedModel>(parts, options);
}

std::shared_ptr<ModelStrategy> make_hybrid_sharded_model(const ModelStrategyParts& parts,
                                                         const ZeroOptions& options,
                                                         const HybridGroups& hybrid) {
  return std::make_shared<HybridShardedModel>(parts, options, hybrid);
}

}  // namespace tandem::detail
