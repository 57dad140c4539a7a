// checkpoint_layout.h's out-of-line part.

#include "accelerate/checkpoint_layout.h"

#include <fmt/ranges.h>

#include "tandem/core/error.h"

namespace tandem::detail {

const std::string& name_of(const TensorNames& names, const at::Tensor& t, const char* caller) {
  const auto it = names.find(t.unsafeGetTensorImpl());
  TANDEM_CHECK_ARG(it != names.end(),
                   "{}: the optimizer holds a tensor of shape {} that is not a parameter of a "
                   "prepared model; build the optimizer over model->parameters()",
                   caller, fmt::join(t.sizes(), "x"));
  return it->second;
}

}  // namespace tandem::detail
