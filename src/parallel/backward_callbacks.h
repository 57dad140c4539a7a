#pragma once
// End-of-backward callbacks that survive activation checkpointing's nested
// backward passes. Private to the library (DDP's reducer and ZeRO use it).
//
// tandem::checkpoint recomputes a block inside backward and backpropagates
// through it with a nested torch::autograd::backward. Parameters of the
// block get their gradients, and fire their hooks, inside that nested pass;
// autograd's Engine::queue_callback called there would run the callback when
// the nested pass ends, while the rest of the model has no gradients yet.

#include <functional>

namespace tandem::detail {

// Runs `callback` when the backward pass the program started ends, like
// Engine::queue_callback, also when called from inside a checkpoint's nested
// backward (the callback is handed to the enclosing pass when the nested one
// returns). Call only while a backward runs, on the thread running it.
void queue_end_of_backward(std::function<void()> callback);

// True while the calling thread runs a checkpointed block's forward again
// inside backward (not in the checkpoint's first, gradient-free forward).
// ZeRO-3 units use it to keep a recomputed unit gathered for the backward
// that follows, and not to prefetch the unit after it.
bool recomputing_checkpoint();

}  // namespace tandem::detail
