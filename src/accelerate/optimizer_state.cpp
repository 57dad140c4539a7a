#include "accelerate/optimizer_state.h"

#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "tandem/core/error.h"
#include "tandem/core/torch_types.h"
#include "tandem/optim/lamb.h"
#include "tandem/optim/lion.h"

namespace tandem::detail {
namespace {

template <typename Options>
Options& options_of(torch::optim::OptimizerParamGroup& group) {
  return static_cast<Options&>(group.options());
}

nlohmann::json options_json(const std::string& type, torch::optim::OptimizerParamGroup& group) {
  if (type == "Adam" || type == "AdamW") {
    auto get = [&](auto& o) {
      return nlohmann::json{{"lr", o.lr()},
                            {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}},
                            {"eps", o.eps()},
                            {"weight_decay", o.weight_decay()},
                            {"amsgrad", o.amsgrad()}};
    };
    return type == "Adam" ? get(options_of<torch::optim::AdamOptions>(group))
                          : get(options_of<torch::optim::AdamWOptions>(group));
  }
  if (type == "SGD") {
    auto& o = options_of<torch::optim::SGDOptions>(group);
    return {{"lr", o.lr()},           {"momentum", o.momentum()},
            {"dampening", o.dampening()}, {"weight_decay", o.weight_decay()},
            {"nesterov", o.nesterov()}};
  }
  if (type == "Adagrad") {
    auto& o = options_of<torch::optim::AdagradOptions>(group);
    return {{"lr", o.lr()},
            {"lr_decay", o.lr_decay()},
            {"weight_decay", o.weight_decay()},
            {"initial_accumulator_value", o.initial_accumulator_value()},
            {"eps", o.eps()}};
  }
  if (type == "Lion") {
    auto& o = options_of<LionOptions>(group);
    return {{"lr", o.lr()},
            {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}},
            {"weight_decay", o.weight_decay()}};
  }
  if (type == "Lamb") {
    auto& o = options_of<LambOptions>(group);
    return {{"lr", o.lr()},
            {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}},
            {"eps", o.eps()},
            {"weight_decay", o.weight_decay()},
            {"bias_correction", o.bias_correction()},
            {"eps_inside_sqrt", o.eps_inside_sqrt()},
            {"max_coeff", o.max_coeff()},
            {"min_coeff", o.min_coeff()}};
  }
  auto& o = options_of<torch::optim::RMSpropOptions>(group);
  return {{"lr", o.lr()},         {"alpha", o.alpha()},       {"eps", o.eps()},
          {"weight_decay", o.weight_decay()}, {"momentum", o.momentum()},
          {"centered", o.centered()}};
}

void apply_options(const std::string& type, torch::optim::OptimizerParamGroup& group,
                   const nlohmann::json& j) {
  if (type == "Adam" || type == "AdamW") {
    auto set = [&](auto& o) {
      o.lr(j.at("lr").get<double>());
      o.betas({j.at("betas")[0].get<double>(), j.at("betas")[1].get<double>()});
      o.eps(j.at("eps").get<double>());
      o.weight_decay(j.at("weight_decay").get<double>());
      o.amsgrad(j.at("amsgrad").get<bool>());
    };
    if (type == "Adam") {
      set(options_of<torch::optim::AdamOptions>(group));
    } else {
      set(options_of<torch::optim::AdamWOptions>(group));
    }
  } else if (type == "SGD") {
    auto& o = options_of<torch::optim::SGDOptions>(group);
    o.lr(j.at("lr").get<double>());
    o.momentum(j.at("momentum").get<double>());
    o.dampening(j.at("dampening").get<double>());
    o.weight_decay(j.at("weight_decay").get<double>());
    o.nesterov(j.at("nesterov").get<bool>());
  } else if (type == "Adagrad") {
    auto& o = options_of<torch::optim::AdagradOptions>(group);
    o.lr(j.at("lr").get<double>());
    o.lr_decay(j.at("lr_decay").get<double>());
    o.weight_decay(j.at("weight_decay").get<double>());
    o.initial_accumulator_value(j.at("initial_accumulator_value").get<double>());
    o.eps(j.at("eps").get<double>());
  } else if (type == "Lion") {
    auto& o = options_of<LionOptions>(group);
    o.lr(j.at("lr").get<double>());
    o.betas({j.at("betas")[0].get<double>(), j.at("betas")[1].get<double>()});
    o.weight_decay(j.at("weight_decay").get<double>());
  } else if (type == "Lamb") {
    auto& o = options_of<LambOptions>(group);
    o.lr(j.at("lr").get<double>());
    o.betas({j.at("betas")[0].get<double>(), j.at("betas")[1].get<double>()});
    o.eps(j.at("eps").get<double>());
    o.weight_decay(j.at("weight_decay").get<double>());
    o.bias_correction(j.at("bias_correction").get<bool>());
    o.eps_inside_sqrt(j.at("eps_inside_sqrt").get<bool>());
    o.max_coeff(j.at("max_coeff").get<double>());
    o.min_coeff(j.at("min_coeff").get<double>());
  } else {
    auto& o = options_of<torch::optim::RMSpropOptions>(group);
    o.lr(j.at("lr").get<double>());
    o.alpha(j.at("alpha").get<double>());
    o.eps(j.at("eps").get<double>());
    o.weight_decay(j.at("weight_decay").get<double>());
    o.momentum(j.at("momentum").get<double>());
    o.centered(j.at("centered").get<bool>());
  }
}

at::Tensor find(const ParamState& state, const std::string& name, const at::Tensor& like) {
  for (const auto& [n, t] : state.tensors) {
    // Callers hand over freshly read tensors: adopt them without a copy
    // when dtype and device already match.
    if (n == name) return t.to(like.options()).view(like.sizes());
  }
  return at::Tensor();
}

at::Tensor find_or_zeros(const ParamState& state, const std::string& name,
                         const at::Tensor& like) {
  at::Tensor t = find(state, name, like);
  return t.defined() ? t : at::zeros_like(like, at::MemoryFormat::Preserve);
}

}  // namespace

std::string optimizer_type(torch::optim::Optimizer& optimizer) {
  // By the options type, which names the update rule whatever object runs
  // it (a prepared optimizer, tandem::CpuAdam).
  const torch::optim::OptimizerOptions* o = &optimizer.defaults();
  if (dynamic_cast<const torch::optim::AdamWOptions*>(o)) return "AdamW";
  if (dynamic_cast<const torch::optim::AdamOptions*>(o)) return "Adam";
  if (dynamic_cast<const torch::optim::SGDOptions*>(o)) return "SGD";
  if (dynamic_cast<const torch::optim::AdagradOptions*>(o)) return "Adagrad";
  if (dynamic_cast<const torch::optim::RMSpropOptions*>(o)) return "RMSprop";
  if (dynamic_cast<const LionOptions*>(o)) return "Lion";
  if (dynamic_cast<const LambOptions*>(o)) return "Lamb";
  TANDEM_THROW(UsageError,
               "checkpoints store the state of torch::optim Adam, AdamW, SGD, Adagrad and "
               "RMSprop, and of tandem::Lion and tandem::Lamb; this optimizer is none of them (LBFGS and custom optimizers have no "
               "pickle-free state format). Use one of those, or save its state yourself in "
               "the client state");
}

nlohmann::json param_group_options(torch::optim::Optimizer& optimizer) {
  const std::string type = optimizer_type(optimizer);
  nlohmann::json out = nlohmann::json::array();
  for (auto& group : optimizer.param_groups()) out.push_back(options_json(type, group));
  return out;
}

void load_param_group_options(torch::optim::Optimizer& optimizer, const nlohmann::json& groups) {
  const std::string type = optimizer_type(optimizer);
  auto& mine = optimizer.param_groups();
  TANDEM_CHECK_ARG(groups.is_array() && groups.size() == mine.size(),
                   "load_state: the checkpoint's optimizer has {} param groups, this one {}; "
                   "build the optimizer with the same groups as the run that saved it",
                   groups.is_array() ? groups.size() : 0, mine.size());
  for (std::size_t g = 0; g < mine.size(); ++g) apply_options(type, mine[g], groups[g]);
}

ParamState get_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  ParamState out;
  auto& states = optimizer.state();
  const auto it = states.find(compat::optimizer_state_key(param));
  if (it == states.end()) return out;
  auto* base = it->second.get();
  auto add = [&](const char* name, const at::Tensor& t) {
    if (t.defined()) out.tensors.emplace_back(name, t);
  };
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(base)) {
    out.step = s->step();
    add("exp_avg", s->exp_avg());
    add("exp_avg_sq", s->exp_avg_sq());
    add("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(base)) {
    out.step = s->step();
    add("exp_avg", s->exp_avg());
    add("exp_avg_sq", s->exp_avg_sq());
    add("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(base)) {
    add("momentum_buffer", s->momentum_buffer());
  } else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(base)) {
    out.step = static_cast<int64_t>(s->step());
    add("sum", s->sum());
  } else if (auto* s = dynamic_cast<LionParamState*>(base)) {
    add("exp_avg", s->exp_avg());
  } else if (auto* s = dynamic_cast<LambParamState*>(base)) {
    out.step = s->step();
    add("exp_avg", s->exp_avg());
    add("exp_avg_sq", s->exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(base)) {
    out.step = s->step();
    add("square_avg", s->square_avg());
    add("momentum_buffer", s->momentum_buffer());
    add("grad_avg", s->grad_avg());
  }
  return out;
}

void set_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                     const ParamState& state) {
  const std::string type = optimizer_type(optimizer);
  auto& states = optimizer.state();
  const auto key = compat::optimizer_state_key(param);
  const at::Tensor like = param.detach();
  if (state.tensors.empty() && type != "Adagrad") {
    states.erase(key);  // no step taken yet: no state, as in a fresh optimizer
    return;
  }
  std::unique_ptr<torch::optim::OptimizerParamState> made;
  if (type == "Adam" || type == "AdamW") {
    auto fill = [&](auto s) {
      s->step(state.step < 0 ? 0 : state.step);
      s->exp_avg(find_or_zeros(state, "exp_avg", like));
      s->exp_avg_sq(find_or_zeros(state, "exp_avg_sq", like));
      at::Tensor max_sq = find(state, "max_exp_avg_sq", like);
      if (max_sq.defined()) s->max_exp_avg_sq(max_sq);
      return s;
    };
    if (type == "Adam") {
      made = fill(std::make_unique<torch::optim::AdamParamState>());
    } else {
      made = fill(std::make_unique<torch::optim::AdamWParamState>());
    }
  } else if (type == "SGD") {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(find(state, "momentum_buffer", like));
    made = std::move(s);
  } else if (type == "Adagrad") {
    auto s = std::make_unique<torch::optim::AdagradParamState>();
    s->step(state.step < 0 ? 0 : state.step);
    at::Tensor sum = find(state, "sum", like);
    if (!sum.defined()) return;  // keep the accumulator the optimizer built
    s->sum(sum);
    made = std::move(s);
  } else if (type == "Lion") {
    auto s = std::make_unique<LionParamState>();
    s->exp_avg(find_or_zeros(state, "exp_avg", like));
    made = std::move(s);
  } else if (type == "Lamb") {
    auto s = std::make_unique<LambParamState>();
    s->step(state.step < 0 ? 0 : state.step);
    s->exp_avg(find_or_zeros(state, "exp_avg", like));
    s->exp_avg_sq(find_or_zeros(state, "exp_avg_sq", like));
    made = std::move(s);
  } else {
    auto s = std::make_unique<torch::optim::RMSpropParamState>();
    s->step(state.step < 0 ? 0 : state.step);
    s->square_avg(find_or_zeros(state, "square_avg", like));
    s->momentum_buffer(find(state, "momentum_buffer", like));
    s->grad_avg(find(state, "grad_avg", like));
    made = std::move(s);
  }
  states[key] = std::move(made);
}

}  // namespace tandem::detail
