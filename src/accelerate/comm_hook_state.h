#pragma once
// What a DDP communication hook carries between steps, in the Accelerator's
// checkpoints: PowerSGD's iteration count, seed stream, and per bucket its
// error feedback and warm-start Q (tandem/parallel/powersgd_hook.h), with
// the bucket layout they belong to. Without them a resumed run would redo
// start_powerSGD_iter uncompressed steps, lose the error feedback and draw
// its Qs from the start of the seed stream: not the run that was saved.
//
// meta.json's models[i]["comm_hook"] holds the hook's name and, for
// PowerSGD, the values every rank shares (rank 0's); each rank's file holds
// its own tensors under "comm_hook/<i>/error/<bucket>" and
// "comm_hook/<i>/q/<bucket>" (error feedback differs between ranks).
//
// Private to the Accelerator's Checkpointer. Not thread-safe.

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "accelerate/checkpoint_layout.h"

namespace tandem {

class CheckpointReader;
class DistributedDataParallel;

namespace detail {

// Prepared model `model`'s entry for meta.json: {"name": hook name} and,
// for PowerSGD, its shared state and bucket layout. With `tensors`, appends
// this rank's per-bucket tensors. Call between steps.
nlohmann::json save_comm_hook_state(const DistributedDataParallel& ddp, std::size_t model,
                                    NamedTensors* tensors);

// Puts back what save_comm_hook_state() saved (`saved`: the entry, null when
// the checkpoint has none) into `ddp`'s hook (`ddp` null: the model runs
// without DDP). At the same world size with the same PowerSGD options the
// resume is exact: the saved bucket layout is adopted and every rank takes
// its own tensors. Otherwise it keeps what still holds and says, on the
// main process (`tell`), what it drops: at another world size the iteration
// count and seed stream resume and the per-rank error feedback and Qs start
// afresh; with another hook, or none, the saved state is unused. Call on
// every rank, between steps.
void restore_comm_hook_state(DistributedDataParallel* ddp, const CheckpointReader& checkpoint,
                             const nlohmann::json& saved, std::size_t model, int rank, int world,
                             bool tell);

}  // namespace detail
}  // namespace tandem
