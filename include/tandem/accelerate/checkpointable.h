#pragma once
// Checkpointable: anything whose state save_state()/load_state() should
// carry besides the prepared objects (Accelerate's register_for_checkpointing
// takes any object with state_dict() and load_state_dict()).
//
//   struct StepCounter : tandem::Checkpointable {
//     int64_t seen = 0;
//     tandem::CustomState state_dict() const override { return {{{"seen", seen}}, {}}; }
//     void load_state_dict(const tandem::CustomState& s) override { seen = s.values.at("seen"); }
//   };
//   accelerator.register_for_checkpointing(counter);
//
// A state is what a tandem checkpoint holds natively: JSON values (in the
// checkpoint's metadata) and named tensors (in its safetensors files, any
// dtype and shape, from any device; loaded back on the CPU). No pickle.
// Thread-safety: the Accelerator calls these on the training thread, during
// save_state() (state_dict, on rank 0) and load_state() (load_state_dict, on
// every rank).

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace tandem {

struct CustomState {
  nlohmann::json values = nlohmann::json::object();
  // Names are unique within one object's state (UsageError otherwise).
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

class Checkpointable {
 public:
  virtual ~Checkpointable() = default;
  // The state to save. Called on rank 0 only, between steps.
  virtual CustomState state_dict() const = 0;
  // Restores a state that state_dict() returned (its tensors on the CPU).
  virtual void load_state_dict(const CustomState& state) = 0;
};

}  // namespace tandem
