#pragma once
// The option structs of tandem::Accelerator: its code-side settings
// (AcceleratorOptions), what a launcher would export (LauncherEnv), and how
// save_state()/load_state() write and read a checkpoint. Plain values.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/accelerate/mlflow_writer.h"
#include "tandem/amp/loss_scaler.h"
#include "tandem/comm/process_group.h"
#include "tandem/config/config.h"
#include "tandem/parallel/ddp.h"
#include "tandem/zero/zero_optimizer.h"

namespace tandem {

// What save_state() writes and how (see docs/checkpoints.md).
struct SaveStateOptions {
  // The checkpoint's name under the directory; empty: "global_step<step()>".
  std::string tag;
  // Any JSON the program wants back from load_state() (DeepSpeed's
  // client_sd): its own counters, the epoch it was in, ...
  nlohmann::json client_state = nlohmann::json::object();
  // Keep only the newest `total_limit` tags; 0 keeps all. The tag being
  // written and the one `latest` names are never deleted.
  int total_limit = 0;
};

struct LoadStateOptions {
  // Empty: the tag the directory's `latest` file names.
  std::string tag;
  // Restore the optimizer's state and hyperparameters (false: weights,
  // scheduler, scaler and data position only, as for fine-tuning).
  bool load_optimizer_states = true;
  // Restore this rank's CPU/CUDA generator states (only when the world
  // size matches the saving run's).
  bool load_rng_states = true;
};

// Code-side settings. Each set field beats the config file and the
// environment (Accelerate's `Accelerator(mixed_precision=..., ...)`).
struct AcceleratorOptions {
  std::optional<MixedPrecision> mixed_precision;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<double> gradient_clipping;
  // A config file to read instead of TANDEM_CONFIG_FILE (set by the launcher).
  std::string config_file;
  // Run on the CPU even when CUDA is available (Accelerate's cpu=True).
  bool cpu = false;
  // DDP settings; empty: the config's `ddp` section.
  std::optional<DDPOptions> ddp;
  // ZeRO stages 1-3 with an optimizer ZeRO does not shard itself (DeepSpeed's
  // zero_allow_untested_optimizer): builds it over the shards. See
  // ZeroOptions::shard_optimizer_factory; unused at stage 0.
  ZeroOptions::ShardOptimizerFactory zero_shard_optimizer_factory;
  // ZeRO-3 units by policy (tandem/zero/auto_wrap.h), beating the config's
  // fsdp_auto_wrap_policy / zero_optimization.auto_wrap_* keys. Empty: the
  // config decides.
  std::optional<AutoWrapOptions> zero_auto_wrap;
  // Dynamic loss scaling whatever the precision, with these settings (the
  // config's fp16 block otherwise, used only for fp16). For fp32 runs that
  // want overflow protection, and for tests of the scaling path on a CPU.
  std::optional<LossScaleConfig> loss_scaling;
  ProcessGroupOptions process_group;
  // Trackers, as Accelerate's log_with, beside the JSON lines
  // init_trackers() always writes: "tensorboard" (event files), "csv"
  // (DeepSpeed's csv_monitor layout), "mlflow" (a run on an MLflow tracking
  // server: `mlflow` below and the MLFLOW_* variables), "all" (each of
  // them; MLflow only when a tracking URI is set). Other names (wandb,
  // comet, ...) are refused with a UsageError.
  std::vector<std::string> log_with;
  // Accelerate's init_kwargs={"mlflow": {...}}: the server, experiment, run
  // name, tags, description or a run to resume (tandem/accelerate/
  // mlflow_writer.h). An empty experiment_name: init_trackers()'s file stem.
  MlflowOptions mlflow;
  // Accelerate's ProjectConfiguration. project_dir: where TensorBoard and
  // CSV files go (empty: the folder of init_trackers()'s JSON-lines file),
  // and with automatic_checkpoint_naming where save_state() and
  // load_state() without a directory keep checkpoints:
  // project_dir/checkpoints/checkpoint_<iteration>, `iteration` counting up
  // from this value with each save (and set past the checkpoint load_state()
  // resumed from, unlike Accelerate, so the next save does not collide);
  // total_limit (> 0) keeps only that many of them.
  std::string project_dir;
  bool automatic_checkpoint_naming = false;
  int total_limit = 0;
  int64_t iteration = 0;
  // ProjectConfiguration's save_on_each_node, for nodes without a shared
  // file system: save_state() writes the checkpoint folder on every host
  // (each host's own copy of the directory, committed by its lowest rank,
  // with the tensors rank 0 alone would write and its ranks' files), and
  // load_state() on each host reads its own copy. Such a checkpoint loads
  // on the same hosts at the same world size and layout; to reshard it,
  // copy every host's folder into one first. Hosts that do share the
  // folder are found at each save and commit it once
  // (docs/checkpoints.md, "Without a shared file system").
  bool save_on_each_node = false;
  // The model's hidden (embedding) width, what Accelerate reads from
  // model.config.hidden_size (or the largest of model.config.hidden_sizes).
  // A C++ module has no config, so give it here: prepare_model() then fills
  // the zero_optimization sizes a DeepSpeed config leaves "auto"
  // (reduce_bucket_size h*h, stage3_prefetch_bucket_size 0.9*h*h,
  // stage3_param_persistence_threshold 10*h; tandem::hidden_size_auto_sizes).
  // Empty: those keys keep tandem's defaults, with a warning naming them.
  std::optional<int64_t> hidden_size;
  // DeepSpeed's wall_clock_breakdown and steps_per_print (>= 1), beating
  // the config's keys: time each optimizer step's forward, backward, step
  // and communication and report the averages every steps_per_print steps
  // (Accelerator::wall_clock(), the trackers, the log); steps_per_print
  // also logs a progress line. Empty: the config decides.
  std::optional<bool> wall_clock_breakdown;
  std::optional<int64_t> steps_per_print;
  // Capture whole training steps as CUDA graphs (Accelerator::train_step,
  // tandem/accelerate/train_step.h), beating the config's cuda_graph block.
  std::optional<CudaGraphConfig> cuda_graph;
  // Save and stop on a signal (Slurm preemption and time limits;
  // docs/slurm.md), beating the config's preemption block.
  std::optional<PreemptionConfig> preemption;
  // Accelerate's DataLoaderConfiguration.split_batches: a prepared loader's
  // batch_size is the global batch, and each process takes its
  // batch_size / num_processes slice of every batch (batch_size must be a
  // multiple of the process count); a prepared scheduler then steps once per
  // optimizer step. false (Accelerate's default): batch_size is per process,
  // batches are dealt to the processes in turn, and a prepared scheduler
  // steps num_processes times per optimizer step.
  bool split_batches = false;
  // Accelerate's dispatch_batches: the main process draws the batches and
  // each process gets its share of them. Prepared loaders then shard by
  // batches exactly as Accelerate's (DataLoaderDispatcher's indices); tandem's
  // in-memory datasets are on every process, so each reads its own share
  // rather than receive it. Empty or false with split_batches false:
  // tandem's DistributedSampler sharding (sample r, r + N, ... per process).
  std::optional<bool> dispatch_batches;
  // Accelerate's step_scheduler_with_optimizer: a prepared scheduler's
  // step() steps only after a real optimizer step (num_processes times
  // without split_batches). false: every step() call steps it once.
  bool step_scheduler_with_optimizer = true;
  // Accelerate's GradientAccumulationPlugin(sync_with_dataloader=...): the
  // last batch of a prepared loader's pass ends the accumulation cycle
  // (gradients reduced, the optimizer steps) even when fewer than
  // gradient_accumulation_steps micro-batches were seen. false: the cycle
  // runs on into the next pass, counting micro-batches only.
  bool sync_with_dataloader = true;
  // Accelerate's GradientAccumulationPlugin(sync_each_batch=...): reduce the
  // gradients in every micro-step's backward instead of accumulating them
  // locally (DDP and ZeRO stage 1 keep no unreduced gradients between
  // micro-steps, trading communication for memory). The optimizer still
  // steps once per cycle and the result is the same. ZeRO stages 2 and 3
  // reduce every micro-step anyway.
  bool sync_each_batch = false;
};

// What a launcher exports to each worker, for the Accelerator constructor
// that reads no environment.
struct LauncherEnv {
  ConfigEnv config;  // TANDEM_* config overrides
  int local_rank = -1;        // -1: the rank in the group
  int local_world_size = -1;  // -1: the group's size
};

}  // namespace tandem
