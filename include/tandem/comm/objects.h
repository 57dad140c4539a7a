#pragma once
// Objects across ranks: gather_object and broadcast_object for strings, JSON
// values and tensors of any shape and dtype (Accelerate's gather_object and
// broadcast_object_list, PyTorch's all_gather_object). Each rank's object
// may differ in size: lengths travel first, then the padded bytes, over the
// ProcessGroup's ordinary collectives.
//
// All of these are collectives: every rank of `group` calls the same one in
// the same order, with the same `src`. Same thread-safety as ProcessGroup.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "tandem/comm/process_group.h"

namespace tandem {

// Every rank's `object`, indexed by rank, on every rank. At world 1: {object}.
std::vector<std::string> gather_object(ProcessGroup& group, const std::string& object);
std::vector<std::string> gather_object(ProcessGroup& group, const char* object);
std::vector<nlohmann::json> gather_object(ProcessGroup& group, const nlohmann::json& object);
// Tensors: any shape (0-d and empty included) and dtype per rank, dense and
// on the CPU (UsageError otherwise; call .cpu()). The results are new
// contiguous CPU tensors without autograd history; rank r's entry equals
// rank r's tensor in shape, dtype and values.
std::vector<at::Tensor> gather_object(ProcessGroup& group, const at::Tensor& object);

// Replaces `object` on every rank with rank `src`'s (src's own is left as it
// is). For a tensor the variable is rebound to a new CPU tensor of src's
// shape and dtype; tensors that shared its storage keep the old values.
// Throws UsageError when src is not a rank of the group.
void broadcast_object(ProcessGroup& group, std::string& object, int src = 0);
void broadcast_object(ProcessGroup& group, nlohmann::json& object, int src = 0);
void broadcast_object(ProcessGroup& group, at::Tensor& object, int src = 0);

}  // namespace tandem
