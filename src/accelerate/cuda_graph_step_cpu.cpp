// Whole-step CUDA graphs where LibTorch has no CUDA: none
// (cuda_graph_step.cpp builds them against a CUDA LibTorch).

#include "accelerate/cuda_graph_step.h"

#if !defined(TANDEM_WITH_CUDA)

namespace tandem::detail {

bool cuda_graphs_built() { return false; }

std::unique_ptr<GraphedStep> make_graphed_step(GraphedStepParts) { return nullptr; }

}  // namespace tandem::detail

#endif
