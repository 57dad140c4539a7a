// A DDP communication hook's state in checkpoints (comm_hook_state.h).

#include "accelerate/comm_hook_state.h"

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/parallel/ddp.h"
#include "tandem/parallel/powersgd_hook.h"

namespace tandem::detail {
namespace {

std::string hook_key(std::size_t model, const char* kind, std::size_t bucket) {
  return fmt::format("comm_hook/{}/{}/{}", model, kind, bucket);
}

nlohmann::json powersgd_options_json(const PowerSGDOptions& o) {
  return {{"matrix_approximation_rank", o.matrix_approximation_rank},
          {"start_powerSGD_iter", o.start_powerSGD_iter},
          {"min_compression_rate", o.min_compression_rate},
          {"use_error_feedback", o.use_error_feedback},
          {"warm_start", o.warm_start},
          {"orthogonalization_epsilon", o.orthogonalization_epsilon},
          {"random_seed", o.random_seed}};
}

std::vector<std::size_t> bucket_indices(const std::map<std::size_t, at::Tensor>& tensors) {
  std::vector<std::size_t> out;
  for (const auto& [index, t] : tensors) out.push_back(index);
  return out;
}

// Reads this rank's saved tensor `kind` of each bucket in `indices`.
std::map<std::size_t, at::Tensor> read_buckets(const CheckpointReader& checkpoint,
                                               const nlohmann::json& indices, std::size_t model,
                                               const char* kind, int rank) {
  std::map<std::size_t, at::Tensor> out;
  for (const auto& index : indices) {
    const std::string key = hook_key(model, kind, index.get<std::size_t>());
    std::optional<at::Tensor> t = checkpoint.read_rank_tensor(rank, key);
    TANDEM_CHECK_FILE(t.has_value(),
                      "load_state: checkpoint '{}' lists PowerSGD tensor '{}' but rank {}'s file "
                      "does not hold it; the checkpoint is damaged. Load an earlier tag, or "
                      "resume without PowerSGD's state (ddp.comm_hook: none)",
                      checkpoint.path(), key, rank);
    out.emplace(index.get<std::size_t>(), *t);
  }
  return out;
}

}  // namespace

nlohmann::json save_comm_hook_state(const DistributedDataParallel& ddp, std::size_t model,
                                    NamedTensors* tensors) {
  const auto* powersgd = dynamic_cast<const PowerSGDHook*>(&ddp.comm_hook());
  nlohmann::json entry = {{"name", ddp.comm_hook().name()}};
  if (powersgd == nullptr) return entry;
  PowerSGDState state = powersgd->state();
  if (tensors != nullptr) {
    for (const auto& [index, t] : state.errors) {
      tensors->emplace_back(hook_key(model, "error", index), t);
    }
    for (const auto& [index, t] : state.qs) tensors->emplace_back(hook_key(model, "q", index), t);
  }
  entry["iteration"] = state.iteration;
  entry["seed_stream"] = state.seed_stream;
  entry["numel_before_compression"] = state.numel_before_compression;
  entry["numel_after_compression"] = state.numel_after_compression;
  entry["options"] = powersgd_options_json(powersgd->options());
  // The per-bucket tensors belong to this layout; a resumed DDP adopts it.
  entry["buckets"] = ddp.bucket_parameter_names();
  entry["buckets_rebuilt"] = ddp.buckets_rebuilt();
  entry["errors"] = bucket_indices(state.errors);
  entry["qs"] = bucket_indices(state.qs);
  return entry;
}

void restore_comm_hook_state(DistributedDataParallel* ddp, const CheckpointReader& checkpoint,
                             const nlohmann::json& saved, std::size_t model, int rank, int world,
                             bool tell) {
  const std::string saved_name =
      saved.is_object() ? saved.value("name", std::string()) : std::string();
  PowerSGDHook* hook = ddp ? dynamic_cast<PowerSGDHook*>(&ddp->comm_hook()) : nullptr;
  if (hook == nullptr) {
    if (tell && saved_name == "powersgd") {
      log_warn("load_state: checkpoint '{}' holds the PowerSGD state of model {} (iteration {}, "
               "error feedback, warm-start Qs), but this run {}; that state is not used. Set "
               "ddp.comm_hook: powersgd (DDPOptions::comm_hook = kPowerSGD) to continue it",
               checkpoint.path(), model, saved.value("iteration", int64_t{0}),
               ddp ? fmt::format("reduces gradients with the '{}' hook", ddp->comm_hook().name())
                   : std::string("runs without DDP"));
    }
    return;
  }
  const PowerSGDOptions& options = hook->options();
  if (saved_name != "powersgd") {
    if (tell) {
      log_warn("load_state: checkpoint '{}' holds no PowerSGD state for model {} ({}), so "
               "PowerSGD starts afresh: iteration 0, {} plainly averaged iterations "
               "(start_powerSGD_iter) before compression, Qs from the start of the seed stream",
               checkpoint.path(), model,
               saved_name.empty()
                   ? std::string("saved without DDP or by an older tandem")
                   : fmt::format("it was saved with the '{}' hook", saved_name),
               options.start_powerSGD_iter);
    }
    return;
  }

  PowerSGDState state;
  state.iteration = saved.at("iteration").get<int64_t>();
  state.numel_before_compression = saved.value("numel_before_compression", int64_t{0});
  state.numel_after_compression = saved.value("numel_after_compression", int64_t{0});
  const nlohmann::json& was = saved.at("options");
  const auto saved_seed = was.at("random_seed").get<std::uint32_t>();
  if (saved_seed == options.random_seed) {
    state.seed_stream = saved.at("seed_stream").get<std::string>();
  } else if (tell) {
    log_warn("load_state: PowerSGD's random_seed was {} in checkpoint '{}' and is {} here; fresh "
             "Qs are drawn from the start of the new seed's stream",
             saved_seed, checkpoint.path(), options.random_seed);
  }

  // The buckets the saved state belongs to, from the first backward on (a
  // fresh DDP would rebuild its own after it, from the gradients' arrival
  // order, and a compressed backward in between would key PowerSGD's state
  // to a layout about to change).
  if (saved.value("buckets_rebuilt", false)) {
    ddp->set_bucket_layout(saved.at("buckets").get<std::vector<std::vector<std::string>>>());
  }
  // Per bucket: error feedback is this rank's own.
  std::vector<std::string> dropped;
  const bool saved_errors = !saved.at("errors").empty(), saved_qs = !saved.at("qs").empty();
  bool keep_errors = saved_errors && options.use_error_feedback;
  bool keep_qs = saved_qs && options.warm_start;
  if (saved_errors && !options.use_error_feedback) {
    dropped.push_back("use_error_feedback is off here");
  }
  if (saved_qs && !options.warm_start) dropped.push_back("warm_start is off here");
  if ((keep_errors || keep_qs) && checkpoint.world_size() != world) {
    dropped.push_back(fmt::format("it was saved by {} ranks and this run has {}, and error "
                                  "feedback is per rank",
                                  checkpoint.world_size(), world));
    keep_errors = keep_qs = false;
  }
  if (keep_qs &&
      (was.at("matrix_approximation_rank").get<int64_t>() != options.matrix_approximation_rank ||
       was.at("min_compression_rate").get<double>() != options.min_compression_rate)) {
    // Which matrices are compressed, and Q's size, follow from these two.
    dropped.push_back(fmt::format(
        "matrix_approximation_rank / min_compression_rate changed from {} / {} to {} / {}, so "
        "the warm-start Qs no longer fit",
        was.at("matrix_approximation_rank").get<int64_t>(),
        was.at("min_compression_rate").get<double>(), options.matrix_approximation_rank,
        options.min_compression_rate));
    keep_qs = false;
  }
  if ((keep_errors || keep_qs) &&
      nlohmann::json(ddp->bucket_parameter_names()) != saved.at("buckets")) {
    dropped.push_back("DDP's buckets here differ from the saved ones");
    keep_errors = keep_qs = false;
  }
  if (keep_errors) state.errors = read_buckets(checkpoint, saved["errors"], model, "error", rank);
  if (keep_qs) state.qs = read_buckets(checkpoint, saved["qs"], model, "q", rank);
  if (tell && !dropped.empty()) {
    log_warn("load_state: PowerSGD of model {} resumes at iteration {} from checkpoint '{}', "
             "with its error feedback {} and its warm-start Qs {} ({}): the run continues "
             "approximately, not exactly as the saved one would have",
             model, state.iteration, checkpoint.path(),
             keep_errors ? "restored" : "starting afresh", keep_qs ? "restored" : "drawn afresh",
             fmt::join(dropped, "; "));
  }
  hook->load_state(state);
}

}  // namespace tandem::detail
