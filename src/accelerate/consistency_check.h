#pragma once
// Start-up consistency checks: every rank must train with the same resolved
// config and the same model structure. A mismatch (one node reading another
// config file, a stray environment override, a model built with different
// arguments) otherwise shows up much later as a hang in a collective or as
// silently wrong training.
//
// Each check hashes a list of (key, value) entries on every rank and
// exchanges the 8-byte hashes in one all-gather. Only when the hashes differ
// are the full lists gathered, to build a per-key diff naming the ranks.
// Every rank sees the same hashes, so every rank takes the same path and
// throws the same UsageError: nobody is left waiting in a collective.

#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "tandem/comm/process_group.h"
#include "tandem/config/config.h"

namespace tandem::detail {

// An ordered list of (key, value); keys are unique within one list.
using FingerprintEntries = std::vector<std::pair<std::string, std::string>>;

// The resolved config flattened to ("zero_optimization.stage", "2") entries,
// values as compact JSON. Leaves out what legitimately differs per rank or
// per node: machine_rank, launch.gpu_ids (a node's own devices), source.*
// (where the file was read) and warnings. Pure; thread-safe.
FingerprintEntries config_fingerprint(const Config& config, int world_size);

// ("parameter fc.weight", "Float[10, 4]") per parameter, in registration
// order, with " frozen" appended when requires_grad is false; then
// ("buffer bn.running_mean", "Float[4]") per buffer. Device is left out.
FingerprintEntries model_fingerprint(const torch::nn::Module& model);

// 64-bit FNV-1a over the entries; stable across processes and builds.
uint64_t fingerprint_hash(const FingerprintEntries& entries);

// How a diff reads: "<what> differs across ranks: <key><separator><value> on
// rank 0 but ...; <advice>".
struct DiffWording {
  std::string what;       // "config", "model"
  std::string separator;  // ": " or " is "
  std::string advice;     // how to fix it
  size_t max_keys = 8;    // differing keys listed before "... and N more"
};

// The message for entries gathered from every rank (index = rank), or ""
// when they are all equal. Keys that differ are listed in rank 0's order;
// a key a rank lacks shows as "(absent)". Equal keys in a different order
// are reported as an ordering difference. Pure; thread-safe.
std::string describe_rank_differences(const std::vector<FingerprintEntries>& per_rank,
                                      const DiffWording& wording);

// Collective: all ranks of `pg` must call it with their own entries. Throws
// UsageError with describe_rank_differences() when they differ. Returns at
// once for a world of one.
void check_same_across_ranks(ProcessGroup& pg, const FingerprintEntries& entries,
                             const DiffWording& wording);

// Collective. The Accelerator calls it once it has resolved its config.
void check_config_consistency(ProcessGroup& pg, const Config& config);

// Collective. The Accelerator calls it when it prepares a model, before
// DDP or ZeRO touch the parameters.
void check_model_consistency(ProcessGroup& pg, const torch::nn::Module& model);

}  // namespace tandem::detail
