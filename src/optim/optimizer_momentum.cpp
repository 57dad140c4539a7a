#include "optim/optimizer_momentum.h"

#include <tuple>
#include <typeinfo>

#include <c10/util/Type.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "tandem/core/error.h"
#include "tandem/optim/lamb.h"
#include "tandem/optim/lion.h"

namespace tandem::detail {
namespace {

// The options' betas, when it has them (DeepSpeed's OneCycle cycles beta1
// of an optimizer with betas, momentum otherwise).
template <typename Options>
Options* with_betas(torch::optim::OptimizerOptions& options) {
  return dynamic_cast<Options*>(&options);
}

template <typename Fn>
bool visit_betas(torch::optim::OptimizerOptions& options, Fn&& fn) {
  if (auto* o = with_betas<torch::optim::AdamOptions>(options)) return fn(*o), true;
  if (auto* o = with_betas<torch::optim::AdamWOptions>(options)) return fn(*o), true;
  if (auto* o = with_betas<LionOptions>(options)) return fn(*o), true;
  if (auto* o = with_betas<LambOptions>(options)) return fn(*o), true;
  return false;
}

template <typename Fn>
bool visit_momentum(torch::optim::OptimizerOptions& options, Fn&& fn) {
  if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) return fn(*o), true;
  if (auto* o = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) return fn(*o), true;
  return false;
}

}  // namespace

bool has_momentum(const torch::optim::OptimizerOptions& options) {
  auto& o = const_cast<torch::optim::OptimizerOptions&>(options);
  auto nothing = [](auto&) {};
  return visit_betas(o, nothing) || visit_momentum(o, nothing);
}

double get_momentum(const torch::optim::OptimizerOptions& options) {
  auto& o = const_cast<torch::optim::OptimizerOptions&>(options);
  double out = 0;
  if (visit_betas(o, [&](auto& b) { out = std::get<0>(b.betas()); })) return out;
  if (visit_momentum(o, [&](auto& m) { out = m.momentum(); })) return out;
  TANDEM_THROW(Error, "{} has no momentum", options_type_name(options));
}

void set_momentum(torch::optim::OptimizerOptions& options, double momentum) {
  if (visit_betas(options, [&](auto& b) {
        b.betas(std::make_tuple(momentum, std::get<1>(b.betas())));
      })) {
    return;
  }
  if (visit_momentum(options, [&](auto& m) { m.momentum(momentum); })) return;
  TANDEM_THROW(Error, "{} has no momentum", options_type_name(options));
}

std::string options_type_name(const torch::optim::OptimizerOptions& options) {
  return c10::demangle(typeid(options).name());
}

}  // namespace tandem::detail
