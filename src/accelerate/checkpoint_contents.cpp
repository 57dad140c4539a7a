// Checkpointer's contents (checkpointer.h): the metadata and tensors that
// save_state() writes for the prepared objects, and how load_state() puts
// them back (resharding partitioned parameters through the strategies).

#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include "accelerate/checkpointer.h"
#include "accelerate/comm_hook_state.h"
#include "accelerate/model_strategy.h"
#include "accelerate/optimizer_state.h"
#include "accelerate/step_controller.h"
#include "tandem/accelerate/prepared.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/core/parameters.h"
#include "tandem/core/version.h"
#include "tandem/parallel/ddp.h"

namespace tandem::detail {
namespace {

// unique_named_parameters() as (name, tensor) pairs: tied weights once,
// under their first name, behind `prefix`.
std::vector<std::pair<std::string, at::Tensor>> parameters_by_name(torch::nn::Module& model,
                                                                   const std::string& prefix) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& item : unique_named_parameters(model)) {
    out.emplace_back(prefix + item.name, std::move(item.tensor));
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> buffers_by_name(torch::nn::Module& model,
                                                                const std::string& prefix) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, b] : unique_named_buffers(model)) out.emplace_back(prefix + name, b);
  return out;
}

nlohmann::json describe(const std::string& name, const at::Tensor& t) {
  return {{"name", name},
          {"shape", t.sizes().vec()},
          {"dtype", safetensors_dtype_name(t.scalar_type())}};
}

const char* precision_name(MixedPrecision mp) {
  switch (mp) {
    case MixedPrecision::kBf16:
      return "bf16";
    case MixedPrecision::kFp16:
      return "fp16";
    default:
      return "no";
  }
}

std::vector<std::string> generator_keys() {
  std::vector<std::string> keys = {"rng/cpu"};
  if (torch::cuda::is_available()) {
    for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i) {
      keys.push_back("rng/cuda" + std::to_string(i));
    }
  }
  return keys;
}

at::Generator generator_for(const std::string& key) {
  if (key == "rng/cpu") return at::detail::getDefaultCPUGenerator();
  const auto index = static_cast<c10::DeviceIndex>(std::stoi(key.substr(8)));
  return at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, index));
}

// The saved entry of optimizer `index`: "optimizers" when the checkpoint has
// it, else (one-optimizer checkpoints) "optimizer".
const nlohmann::json* saved_optimizer(const nlohmann::json& meta, std::size_t index) {
  if (meta.contains("optimizers")) {
    const nlohmann::json& all = meta["optimizers"];
    return index < all.size() ? &all[index] : nullptr;
  }
  return index == 0 && meta.contains("optimizer") ? &meta["optimizer"] : nullptr;
}

// The step count ZeRO's shards resume at, from a saved optimizer entry. An
// optimizer without a per-parameter count (SGD, Lion) saved by one process
// or DDP records step 0; its real steps say how many updates its state has
// seen (ZeRO's SGD would otherwise restart its loaded momentum at step 1).
// Per-parameter counts that are all 0 say the same (DeepSpeed imports made
// before 2026-11-29 wrote them for SGD).
int64_t shard_step_count(const nlohmann::json& saved) {
  const int64_t step = saved.value("step", int64_t{0});
  bool counted = false;
  if (saved.contains("param_steps")) {
    for (const auto& [name, count] : saved["param_steps"].items()) {
      counted = counted || (count.is_number_integer() && count.get<int64_t>() > 0);
    }
  }
  if (step == 0 && !counted) return saved.value("real_steps", int64_t{0});
  return step;
}

// The training loader's position, saved at `saved_world` ranks as batches of
// each rank, in batches of this run's ranks. Every sharding hands out the
// epoch's order from its start, world x batch samples per step, so
// `position` steps consumed position x saved_world x saved batch samples of
// it; this run skips as many whole steps of its own. When that is not a
// step boundary here it resumes at the one before, and the samples in
// between are trained twice (said on the main process).
int64_t batches_at_this_world(const nlohmann::json& loader, const LoaderCursor& cursor,
                              int saved_world, int world, bool tell) {
  const int64_t position = loader.at("position").get<int64_t>();
  const int64_t saved_batch = loader.value("batch_size", cursor.batch_size);
  const int64_t consumed = position * saved_world * saved_batch;
  const int64_t per_step = cursor.batch_size * world;
  if (per_step <= 0) return position;
  const int64_t batches = consumed / per_step;
  if (tell && consumed % per_step != 0) {
    log_warn("load_state: the checkpoint's training loader had handed out {} samples of its "
             "epoch ({} batches of {} on each of {} ranks); here a step takes {} ({} on each "
             "of {} ranks), so the epoch resumes after {} steps ({} samples) and its next {} "
             "samples are trained a second time. Resume at the same world size, or save on a "
             "step that both layouts share, to avoid it",
             consumed, position, saved_batch, saved_world, per_step, cursor.batch_size, world,
             batches, batches * per_step, consumed - batches * per_step);
  }
  return batches;
}

// A streaming loader's position is batches of this rank's own shard, which
// only the user's stream factory knows how to cut (StreamShard), so it is
// not converted: each rank skips `position` batches of its shard. When the
// shards are cut differently now (another world size, or another
// num_workers) that is not where the saved run was; the main process says
// so. Checkpoints from before "shards" was saved are compared by world size.
void warn_stream_reshaped(const nlohmann::json& loader, const LoaderCursor& cursor,
                          int saved_world, int world, int64_t position) {
  const bool reshaped = loader.contains("shards")
                            ? loader["shards"].get<int64_t>() != cursor.shards
                            : saved_world != world;
  if (!reshaped) return;
  log_warn("load_state: the training data is a streaming loader saved mid-epoch with its "
           "stream read as {} shards (processes x workers; {} processes), and this run reads "
           "it as {} ({} processes): a stream's position belongs to its shard and cannot be "
           "carried over, so each rank skips the first {} batches of its own new shard of "
           "epoch {}, and samples of this epoch may be trained twice or not at all. Resume "
           "with the saving run's processes and num_workers to continue exactly, or call "
           "skip_first_batches(0) on the loader after load_state to read the epoch from its "
           "start",
           loader.value("shards", int64_t{saved_world}), saved_world, cursor.shards, world,
           position, loader.at("epoch").get<int64_t>());
}

std::size_t saved_optimizer_count(const nlohmann::json& meta) {
  if (meta.contains("optimizers")) return meta["optimizers"].size();
  return meta.contains("optimizer") ? 1 : 0;
}

}  // namespace

TensorNames Checkpointer::tensor_names() const {
  TensorNames names;
  for (const auto& model : prepared_.models()) {
    for (const auto& [name, p] : parameters_by_name(*model.module, model.prefix)) {
      TANDEM_CHECK_ARG(names.emplace(p.unsafeGetTensorImpl(), name).second,
                       "save_state: parameter '{}' is also a parameter of another prepared model; "
                       "prepare a container module holding both instead",
                       name);
    }
  }
  for (const auto& optimizer : prepared_.optimizers()) {
    PreparedAccess::core(*optimizer).update().add_master_names(names);
  }
  return names;
}

nlohmann::json Checkpointer::state_meta(const SaveStateOptions& options) const {
  nlohmann::json meta;
  const StrategyRecord first = prepared_.models().front().strategy->record();
  meta["step"] = prepared_.controller()->state().optimizer_steps;
  meta["strategy"] = first.name;
  meta["zero_stage"] = first.zero_stage;
  meta["hpz_partition_size"] = first.hpz_partition_size;
  meta["mixed_precision"] = precision_name(config_.mixed_precision);
  meta["tandem_version"] = version();
  meta["created_unix"] = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  nlohmann::json params = nlohmann::json::array();
  nlohmann::json buffers = nlohmann::json::array();
  nlohmann::json models = nlohmann::json::array();
  for (const auto& model : prepared_.models()) {
    for (const auto& [name, p] : parameters_by_name(*model.module, model.prefix)) {
      nlohmann::json d = describe(name, p);
      d["trainable"] = p.requires_grad();
      params.push_back(d);
    }
    for (const auto& [name, b] : buffers_by_name(*model.module, model.prefix)) {
      buffers.push_back(describe(name, b));
    }
    const StrategyRecord record = model.strategy->record();
    nlohmann::json entry = {{"prefix", model.prefix},
                            {"strategy", record.name},
                            {"zero_stage", record.zero_stage},
                            {"hpz_partition_size", record.hpz_partition_size}};
    if (const DistributedDataParallel* ddp = model.strategy->ddp()) {
      entry["comm_hook"] = save_comm_hook_state(*ddp, models.size(), nullptr);
    }
    models.push_back(std::move(entry));
  }
  meta["parameters"] = params;
  meta["buffers"] = buffers;
  meta["models"] = models;
  const TensorNames names = tensor_names();
  nlohmann::json optimizers = nlohmann::json::array();
  for (std::size_t i = 0; i < prepared_.optimizers().size(); ++i) {
    auto& optimizer = *prepared_.optimizers()[i];
    nlohmann::json opt;
    opt["type"] = optimizer_type(optimizer);
    opt["param_groups"] = param_group_options(optimizer);
    opt["real_steps"] =
        prepared_.controller()->optimizer(PreparedAccess::core(optimizer).id()).steps;
    PreparedAccess::core(optimizer).update().describe_state(optimizer, names, opt);
    optimizers.push_back(opt);
  }
  // "optimizer": the first one, as one-optimizer checkpoints have it.
  if (!optimizers.empty()) meta["optimizer"] = optimizers[0];
  meta["optimizers"] = optimizers;
  nlohmann::json schedulers = nlohmann::json::array();
  for (const auto& core : prepared_.schedulers()) {
    nlohmann::json s = {{"steps", core->steps}};
    if (core->state_dict) s["state"] = core->state_dict();
    schedulers.push_back(s);
  }
  meta["schedulers"] = schedulers;
  meta["scaler"] = scaler_->state_dict();
  if (data_.train_cursor()) {
    const auto& c = *data_.train_cursor();
    meta["loader"] = {{"epoch", c.epoch},         {"position", c.position},
                      {"in_pass", c.in_pass},     {"completed_passes", c.completed_passes},
                      {"epoch_set", c.epoch_set}, {"skip", c.skip},
                      {"size", c.size},           {"batch_size", c.batch_size}};
    if (c.shards > 0) meta["loader"]["shards"] = c.shards;
  }
  meta["gradient_state"] = {
      {"optimizer_steps", prepared_.controller()->state().optimizer_steps}};
  meta["client_state"] = options.client_state;
  return meta;
}

NamedTensors Checkpointer::state_tensors(bool writes_whole) const {
  NamedTensors out;
  for (const auto& model : prepared_.models()) {
    // Partitioned parameters: every rank its fragments; the rest: rank 0
    // (and each host's local main with save_on_each_node).
    const PartitionedParameters* shards = model.strategy->partitioned();
    if (shards != nullptr) shards->append_shard_tensors(model.prefix, out, save_on_each_node_);
    if (!writes_whole) continue;
    std::unordered_map<std::string, bool> partitioned;
    if (shards != nullptr) {
      for (const auto& name : shards->partitioned_names()) partitioned[model.prefix + name] = true;
    }
    for (const auto& [name, p] : parameters_by_name(*model.module, model.prefix)) {
      if (!partitioned.count(name)) out.emplace_back(fragment_key(kModelSection, name, 0), flat(p));
    }
    for (const auto& [name, b] : buffers_by_name(*model.module, model.prefix)) {
      out.emplace_back("buffer/" + name, b);
    }
  }
  if (writes_whole) {
    const TensorNames names = tensor_names();
    for (const auto& prepared : prepared_.optimizers()) {
      PreparedAccess::core(*prepared).update().append_state_tensors(*prepared, names, out);
    }
  }
  for (const auto& key : generator_keys()) {
    at::Generator gen = generator_for(key);
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.emplace_back(key, gen.get_state());
  }
  // Every rank: a communication hook's state may differ between ranks.
  for (std::size_t i = 0; i < prepared_.models().size(); ++i) {
    if (const DistributedDataParallel* ddp = prepared_.models()[i].strategy->ddp()) {
      save_comm_hook_state(*ddp, i, &out);
    }
  }
  append_local_sgd_replicas(out);
  return out;
}

void Checkpointer::restore_models(const CheckpointReader& checkpoint, bool optimizer_states) {
  const nlohmann::json& meta = checkpoint.meta();
  std::map<std::string, std::vector<int64_t>> saved_shapes;
  for (const auto& p : meta.at("parameters")) {
    saved_shapes[p.at("name").get<std::string>()] = p.at("shape").get<std::vector<int64_t>>();
  }
  for (const auto& model : prepared_.models()) {
    for (const auto& [name, p] : parameters_by_name(*model.module, model.prefix)) {
      const auto it = saved_shapes.find(name);
      TANDEM_CHECK_ARG(it != saved_shapes.end(),
                       "load_state: the model has parameter '{}' but checkpoint '{}' does not. "
                       "Load it into the same model architecture that saved it (and prepare "
                       "the models in the same order)",
                       name, checkpoint.path());
      TANDEM_CHECK_ARG(it->second == p.sizes().vec(),
                       "load_state: parameter '{}' has shape [{}] here but [{}] in checkpoint "
                       "'{}'",
                       name, fmt::join(p.sizes(), ", "), fmt::join(it->second, ", "),
                       checkpoint.path());
      saved_shapes.erase(it);
    }
  }
  TANDEM_CHECK_ARG(saved_shapes.empty(),
                   "load_state: checkpoint '{}' has parameter '{}' that this run's models lack. "
                   "Load it into the same model architecture that saved it (and prepare as "
                   "many models)",
                   checkpoint.path(), saved_shapes.empty() ? "" : saved_shapes.begin()->first);

  torch::NoGradGuard no_grad;
  for (const auto& model : prepared_.models()) {
    // The optimizer step count its shards were saved at (ZeRO: the one
    // optimizer over the model).
    int64_t step = 0;
    for (std::size_t i : model.optimizers) {
      if (const nlohmann::json* saved = saved_optimizer(meta, i)) step = shard_step_count(*saved);
    }
    std::unordered_map<std::string, bool> partitioned;
    if (PartitionedParameters* shards = model.strategy->partitioned()) {
      shards->restore_shards(checkpoint, model.prefix, optimizer_states, step);
      for (const auto& name : shards->partitioned_names()) partitioned[model.prefix + name] = true;
    }
    for (const auto& [name, p] : parameters_by_name(*model.module, model.prefix)) {
      if (partitioned.count(name)) continue;
      checkpoint.read_range_into(kModelSection, name, 0, p.detach());
    }
    for (const auto& [name, b] : buffers_by_name(*model.module, model.prefix)) {
      std::optional<at::Tensor> saved = checkpoint.read_main_tensor("buffer/" + name);
      TANDEM_CHECK_ARG(saved.has_value(), "load_state: checkpoint '{}' has no buffer '{}'",
                       checkpoint.path(), name);
      b.detach().copy_(saved->view(b.sizes()));
    }
  }
}

void Checkpointer::restore_optimizers(const CheckpointReader& checkpoint) {
  const nlohmann::json& meta = checkpoint.meta();
  TANDEM_CHECK_ARG(saved_optimizer_count(meta) > 0,
                   "load_state: checkpoint '{}' has no optimizer state (the saving run prepared "
                   "none); pass load_optimizer_states = false to load the rest",
                   checkpoint.path());
  TANDEM_CHECK_ARG(saved_optimizer_count(meta) == prepared_.optimizers().size(),
                   "load_state: checkpoint '{}' holds {} optimizer(s) but this run prepared {}; "
                   "prepare the same optimizers, in the same order, before load_state() (or "
                   "pass load_optimizer_states = false)",
                   checkpoint.path(), saved_optimizer_count(meta), prepared_.optimizers().size());
  const TensorNames names = tensor_names();
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < prepared_.optimizers().size(); ++i) {
    const nlohmann::json& saved = *saved_optimizer(meta, i);
    auto& optimizer = *prepared_.optimizers()[i];
    const std::string type = optimizer_type(optimizer);
    if (saved.at("type").get<std::string>() != type) {
      TANDEM_THROW(UsageError,
                   "load_state: checkpoint '{}' holds {} state for optimizer {} but this run's "
                   "is {}; build the same optimizer type (or pass load_optimizer_states = false)",
                   checkpoint.path(), saved.at("type").get<std::string>(), i, type);
    }
    PreparedAccess::core(optimizer).update().restore_state(optimizer, checkpoint, saved, names);
  }
}

void Checkpointer::restore_progress(const CheckpointReader& checkpoint,
                                   const LoadStateOptions& options) {
  const nlohmann::json& meta = checkpoint.meta();
  const nlohmann::json& schedulers = meta.at("schedulers");
  TANDEM_CHECK_ARG(schedulers.size() == prepared_.schedulers().size(),
                   "load_state: checkpoint '{}' holds {} scheduler(s) but this run prepared {}; "
                   "prepare the same schedulers before load_state()",
                   checkpoint.path(), schedulers.size(), prepared_.schedulers().size());
  const int64_t optimizer_steps = meta.at("gradient_state").at("optimizer_steps").get<int64_t>();
  // Each optimizer's real steps (one-optimizer checkpoints: the global count).
  std::vector<int64_t> per_optimizer;
  for (std::size_t i = 0; i < prepared_.optimizers().size(); ++i) {
    const nlohmann::json* saved = saved_optimizer(meta, i);
    per_optimizer.push_back(saved != nullptr ? saved->value("real_steps", optimizer_steps)
                                             : optimizer_steps);
  }
  prepared_.controller()->restore(optimizer_steps, per_optimizer);
  for (std::size_t i = 0; i < prepared_.schedulers().size(); ++i) {
    auto& core = *prepared_.schedulers()[i];
    const int64_t target = schedulers[i].at("steps").get<int64_t>();
    if (core.load_state_dict && schedulers[i].contains("state")) {
      core.load_state_dict(schedulers[i]["state"].get<std::map<std::string, double>>());
    } else {
      // LibTorch schedulers have no state accessors; they are functions of
      // their step count, so replaying the steps rebuilds them.
      TANDEM_CHECK_ARG(core.steps <= target,
                       "load_state: LibTorch scheduler {} has already stepped {} times, past "
                       "the checkpoint's {}; load into a freshly prepared run",
                       i, core.steps, target);
      while (core.steps < target) {
        core.step_fn();
        ++core.steps;
      }
    }
    core.steps = target;
    core.seen_optimizer_steps = core.optimizer_steps();
  }
  if (options.load_optimizer_states) {
    // After the scheduler replay, so the saved learning rates win.
    for (std::size_t i = 0; i < prepared_.optimizers().size(); ++i) {
      if (const nlohmann::json* saved = saved_optimizer(meta, i)) {
        load_param_group_options(*prepared_.optimizers()[i], saved->at("param_groups"));
      }
    }
  }
  scaler_->load_state_dict(meta.at("scaler").get<std::map<std::string, double>>());
  if (data_.train_cursor() && meta.contains("loader")) {
    const nlohmann::json& l = meta["loader"];
    auto& c = *data_.train_cursor();
    int64_t position = l.at("position").get<int64_t>();
    const bool in_pass = l.at("in_pass").get<bool>();
    c.epoch = l.at("epoch").get<int64_t>();
    c.completed_passes = l.at("completed_passes").get<int64_t>();
    c.epoch_set = l.at("epoch_set").get<bool>();
    c.skip = l.at("skip").get<int64_t>();
    // In the same world, the saving pass's length (rank 0's; in a joined
    // pass every rank's), so ranks whose own sizes differ (even_batches off)
    // still agree on whether the pass goes on.
    const bool same_world = checkpoint.world_size() == group_->world_size();
    const int64_t size =
        same_world && l.contains("size") ? l.at("size").get<int64_t>() : c.size;
    if (!same_world && in_pass && size >= 0) {
      position = batches_at_this_world(l, c, checkpoint.world_size(), group_->world_size(),
                                       main_process());
    }
    if (in_pass && size < 0 && main_process()) {
      warn_stream_reshaped(l, c, checkpoint.world_size(), group_->world_size(), position);
    }
    // A streaming loader's pass has no known size (< 0): it goes on.
    if (in_pass && (size < 0 || position < size)) {
      c.skip = position;  // continue this epoch after the last batch handed out
      c.epoch_set = true;
    } else if (in_pass) {
      // The pass had handed out its last batch: resume at the next epoch.
      c.epoch += 1;
      c.completed_passes = c.epoch;
      c.epoch_set = false;
      c.skip = 0;
    }
    c.position = 0;
    c.in_pass = false;
    c.restore_pending = true;
  }
  if (options.load_rng_states && checkpoint.world_size() == group_->world_size()) {
    for (const auto& key : generator_keys()) {
      std::optional<at::Tensor> saved = checkpoint.read_rank_tensor(group_->rank(), key);
      if (!saved) continue;
      at::Generator gen = generator_for(key);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(*saved);
    }
  } else if (options.load_rng_states && main_process() &&
             checkpoint.meta().value("rng_states", true)) {
    log_warn("load_state: the checkpoint was saved by {} processes and this run has {}; RNG "
             "states are per rank, so they are not restored",
             checkpoint.world_size(), group_->world_size());
  }
}

void Checkpointer::restore_communication(const CheckpointReader& checkpoint) {
  const nlohmann::json& meta = checkpoint.meta();
  for (std::size_t i = 0; i < prepared_.models().size(); ++i) {
    nlohmann::json saved;  // null: none saved
    if (meta.contains("models") && i < meta["models"].size()) {
      saved = meta["models"][i].value("comm_hook", nlohmann::json());
    }
    restore_comm_hook_state(prepared_.models()[i].strategy->ddp(), checkpoint, saved, i,
                            group_->rank(), group_->world_size(), main_process());
  }
}

bool Checkpointer::has_checkpoint(const std::string& dir) {
  try {
    return latest_checkpoint_tag(dir).has_value();
  } catch (const CheckpointError&) {
    return false;
  }
}

}  // namespace tandem::detail
