#pragma once
// A DeepSpeed ZeRO checkpoint folder turned into a tandem checkpoint that
// Accelerator::load_state resumes from, at any world size and under any
// strategy: what `tandem checkpoint import DS_DIR OUT_DIR` does.
//
// It reads DS_DIR/<tag> (engine.save_checkpoint's folder: stages 1-3, any
// data-parallel world; mp_rank_*_model_states.pt, *_optim_states.pt,
// `latest`) with weights-only semantics and writes OUT_DIR/<tag> with:
//   - every parameter whole (trainable ones from the fp32 partitions,
//     frozen ones from frozen_param_fragments), and the fp32 masters of a
//     bf16/fp16 run;
//   - the optimizer's state (exp_avg, exp_avg_sq, momentum_buffer, ...),
//     its step count and its param groups' hyperparameters;
//   - the learning-rate scheduler (DeepSpeed's schedulers as their state;
//     any other by its step count), the loss scaler, the step counters;
//   - DeepSpeed's client_sd as the checkpoint's client state, which
//     load_state returns.
// Tied parameters are kept once, under the name DeepSpeed keeps (the first
// in registration order, as LibTorch names them too); module buffers are
// kept. Not carried: DeepSpeed's data sampler state (tandem's loader
// resumes by its own position) and RNG states; the result names them.
//
// Resume by building the same model (same parameter names), the same
// optimizer type with the same param groups, and the same scheduler, then
// load_state(OUT_DIR).

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct DeepSpeedImportOptions {
  // The checkpoint to import: a tag of DS_DIR (global_step1000); empty: the
  // one DS_DIR/latest names.
  std::string tag;
  // The optimizer type to record ("Adam", "AdamW", "SGD", "Adagrad",
  // "RMSprop", "Lion", "Lamb"); empty: from the checkpoint's ds_config, or
  // from its param groups when DeepSpeed was handed a client optimizer.
  std::string optimizer_type;
};

struct DeepSpeedImportResult {
  std::string tag;         // written as OUT_DIR/<tag>, which OUT_DIR/latest names
  int zero_stage = 0;
  int world_size = 0;      // data-parallel ranks that saved it
  int64_t step = 0;        // DeepSpeed's global_steps
  int64_t parameters = 0;  // unique parameters (frozen ones included)
  int64_t frozen = 0;
  std::string optimizer_type;
  std::vector<std::string> optimizer_states;  // "exp_avg", ...
  bool scheduler = false;
  std::vector<std::string> not_carried;  // parts of the folder tandem has no place for
};

// CheckpointError for a folder that is missing, malformed, refused by the
// weights-only reader, or of a kind tandem does not import (no ZeRO, tensor
// or pipeline parallelism); UsageError for an optimizer tandem does not
// checkpoint. Nothing is written then. OUT_DIR is created if needed; a tag
// of that name already there is replaced atomically.
DeepSpeedImportResult import_deepspeed_checkpoint(const std::string& source_dir,
                                                  const std::string& out_dir,
                                                  const DeepSpeedImportOptions& options = {});

// Whether `path` is a folder that looks like a DeepSpeed checkpoint (a
// `latest` file, or a subfolder holding *_model_states.pt).
bool is_deepspeed_checkpoint(const std::string& path);

}  // namespace tandem
