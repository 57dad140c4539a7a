#include "checkpoint/deepspeed_checkpoint.h"

#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/ranges.h>

#include "checkpoint/torch_save_reader.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem::detail {
namespace {

using K = PickleValue::Kind;

// What engine.save_checkpoint writes into the model states besides the
// client state it is given.
const std::set<std::string>& engine_keys() {
  static const std::set<std::string> keys = {
      "module",         "buffer_names",       "optimizer",        "param_shapes",
      "frozen_param_shapes", "shared_params",  "frozen_param_fragments", "lr_scheduler",
      "data_sampler",   "random_ltd",         "sparse_tensor_module_names", "skipped_steps",
      "global_steps",   "global_samples",     "dp_world_size",    "mp_world_size",
      "ds_config",      "ds_version",         "checkpoint_parallel_dimensions"};
  return keys;
}

// One torch.save file of the folder and its root dict.
class DsFile {
 public:
  explicit DsFile(const std::string& path) : path_(path), reader_(path) {
    if (reader_.root().kind != K::kDict) {
      TANDEM_THROW(CheckpointError, "'{}' holds a {}, not the dict DeepSpeed saves", path,
                   pickle_kind_name(reader_.root().kind));
    }
  }
  const std::string& path() const { return path_; }
  const PickleValue& root() const { return reader_.root(); }
  TorchSaveReader& reader() { return reader_; }

  // parent[key], which must be there (and of `kind` unless kNone is asked).
  const PickleValue& at(const PickleValue& parent, const std::string& key, K kind,
                        const std::string& where) const {
    const PickleValue* v = pickle_dict_find(parent, key);
    if (v == nullptr) {
      TANDEM_THROW(CheckpointError, "'{}' has no '{}{}': not a DeepSpeed ZeRO checkpoint "
                                    "file tandem can read",
                   path_, where.empty() ? "" : where + ".", key);
    }
    if (kind != K::kNone && v->kind != kind) {
      TANDEM_THROW(CheckpointError, "'{}': '{}{}' is a {}, expected a {}", path_,
                   where.empty() ? "" : where + ".", key, pickle_kind_name(v->kind),
                   pickle_kind_name(kind));
    }
    return *v;
  }
  int64_t integer(const PickleValue& parent, const std::string& key, int64_t fallback) const {
    const PickleValue* v = pickle_dict_find(parent, key);
    if (v == nullptr || v->kind == K::kNone) return fallback;
    if (v->kind == K::kInt) return v->integer;
    if (v->kind == K::kTensor) return json(*v, key).get<int64_t>();
    TANDEM_THROW(CheckpointError, "'{}': '{}' is a {}, expected an int", path_, key,
                 pickle_kind_name(v->kind));
  }
  at::Tensor tensor(const PickleValue& v, const std::string& where) {
    if (v.kind != K::kTensor) {
      TANDEM_THROW(CheckpointError, "'{}': '{}' is a {}, expected a tensor", path_, where,
                   pickle_kind_name(v.kind));
    }
    return reader_.tensor(*v.tensor);
  }
  nlohmann::ordered_json json(const PickleValue& v, const std::string& where) const {
    return const_cast<TorchSaveReader&>(reader_).json(v, where);
  }

 private:
  std::string path_;
  TorchSaveReader reader_;
};

std::vector<int64_t> shape_of(DsFile& file, const PickleValue& v, const std::string& name) {
  nlohmann::ordered_json j = file.json(v, name);
  if (j.is_number_integer()) return {j.get<int64_t>()};  // a 1-D torch.Size read as one int
  TANDEM_CHECK_FILE(j.is_array(), "'{}': the shape of '{}' is not a torch.Size", file.path(), name);
  std::vector<int64_t> shape;
  for (const auto& d : j) {
    TANDEM_CHECK_FILE(d.is_number_integer() && d.get<int64_t>() >= 0,
                 "'{}': the shape of '{}' holds {}", file.path(), name, d.dump());
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

DeepSpeedParameter parameter(const std::string& name, const std::vector<int64_t>& shape,
                             int group) {
  DeepSpeedParameter p;
  p.name = name;
  p.shape = shape;
  p.group = group;
  return p;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// param_shapes: a list (one dict per param group) of name -> torch.Size.
std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> param_shapes(DsFile& model) {
  const PickleValue& groups = model.at(model.root(), "param_shapes", K::kNone, "");
  std::vector<const PickleValue*> dicts;
  if (groups.kind == K::kDict) dicts.push_back(&groups);  // some versions: one dict
  else if (groups.kind == K::kList || groups.kind == K::kTuple) {
    for (const auto& g : groups.items) dicts.push_back(g.get());
  } else {
    TANDEM_THROW(CheckpointError, "'{}': param_shapes is {}; this checkpoint was saved "
                                  "without ZeRO",
                 model.path(), pickle_kind_name(groups.kind));
  }
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> out;
  for (const PickleValue* d : dicts) {
    TANDEM_CHECK_FILE(d->kind == K::kDict, "'{}': a param_shapes entry is a {}", model.path(),
                 pickle_kind_name(d->kind));
    auto& group = out.emplace_back();
    for (const auto& [key, value] : d->entries) {
      TANDEM_CHECK_FILE(key->kind == K::kString, "'{}': a param_shapes key is a {}", model.path(),
                   pickle_kind_name(key->kind));
      group.emplace_back(key->text, shape_of(model, *value, key->text));
    }
  }
  return out;
}

// One rank's optimizer partition: per param group, its fp32 values and
// the base optimizer's state tensors over them.
struct RankPartition {
  std::vector<at::Tensor> fp32;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> state;
  std::vector<std::vector<int64_t>> alignment_paddings;  // stage 1/2
};

struct OptimizerFiles {
  int zero_stage = 0;
  std::vector<RankPartition> ranks;
  int64_t step = 0;
  nlohmann::ordered_json param_groups = nlohmann::ordered_json::array();
  nlohmann::ordered_json loss_scaler = nlohmann::ordered_json::object();
};

// The torch state_dict of the base optimizer: its per-group state tensors
// (those as long as the partition; "step" and other scalars aside).
void read_base_state(DsFile& file, const PickleValue& base, RankPartition& rank,
                     OptimizerFiles& out, bool first) {
  const PickleValue& state = file.at(base, "state", K::kDict, "base optimizer state");
  for (std::size_t g = 0; g < rank.fp32.size(); ++g) {
    auto& tensors = rank.state.emplace_back();
    const PickleValue* s = pickle_dict_find(state, static_cast<int64_t>(g));
    if (s == nullptr) continue;  // no step taken yet
    for (const auto& [key, value] : s->entries) {
      if (key->kind != K::kString) continue;
      if (key->text == "step") {
        out.step = file.integer(*s, "step", 0);
        continue;
      }
      if (value->kind != K::kTensor) continue;
      at::Tensor t = file.tensor(*value, "state." + key->text);
      // Per-element state is laid out as the partition (the last rank's
      // keeps its padding: cut it off); a scalar is not per-element.
      if (t.dim() == 1 && t.numel() >= rank.fp32[g].numel()) {
        tensors.emplace_back(key->text, t.narrow(0, 0, rank.fp32[g].numel()));
      }
    }
  }
  if (!first) return;
  const PickleValue& groups = file.at(base, "param_groups", K::kList, "base optimizer state");
  for (const auto& g : groups.items) {
    nlohmann::ordered_json j = file.json(*g, "param_groups");
    j.erase("params");
    out.param_groups.push_back(std::move(j));
  }
}

void read_optimizer_file(DsFile& file, int rank, OptimizerFiles& out) {
  const PickleValue& osd = file.at(file.root(), "optimizer_state_dict", K::kDict, "");
  const int stage = static_cast<int>(file.integer(osd, "zero_stage", 0));
  TANDEM_CHECK_FILE(stage >= 1 && stage <= 3, "'{}': zero_stage is {}; tandem imports ZeRO stages "
                                         "1-3",
               file.path(), stage);
  if (rank == 0) out.zero_stage = stage;
  TANDEM_CHECK_FILE(stage == out.zero_stage, "'{}' was saved at ZeRO stage {}, rank 0's at {}",
               file.path(), stage, out.zero_stage);
  RankPartition part;
  const char* fp32_key = stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  for (const auto& t : file.at(osd, fp32_key, K::kList, "optimizer_state_dict").items) {
    part.fp32.push_back(file.tensor(*t, fp32_key));
  }
  const PickleValue* base = pickle_dict_find(osd, stage == 3 ? "optimizer_state_dict"
                                                              : "base_optimizer_state");
  TANDEM_CHECK_FILE(base != nullptr && base->kind == K::kDict,
               "'{}' has no base optimizer state (a dict) in its optimizer_state_dict",
               file.path());
  read_base_state(file, *base, part, out, rank == 0);
  if (const PickleValue* pads = pickle_dict_find(osd, "param_alignment_paddings")) {
    nlohmann::ordered_json j = file.json(*pads, "param_alignment_paddings");
    for (const auto& g : j) part.alignment_paddings.push_back(g.get<std::vector<int64_t>>());
  }
  if (rank == 0) {
    if (const PickleValue* scaler = pickle_dict_find(osd, "loss_scaler")) {
      out.loss_scaler = file.json(*scaler, "loss_scaler");
    }
  }
  out.ranks.push_back(std::move(part));
}

std::string read_tag(const std::string& dir) {
  const std::string latest = dir + "/latest";
  std::ifstream in(latest);
  TANDEM_CHECK_FILE(in.good(), "'{}' has no 'latest' file to say which checkpoint to import; name "
                          "the tag (a subfolder such as global_step1000) with --tag",
               dir);
  std::string tag;
  std::getline(in, tag);
  while (!tag.empty() && (tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
  TANDEM_CHECK_FILE(!tag.empty() && tag.find('/') == std::string::npos && tag != "." && tag != "..",
               "'{}' names '{}', not a checkpoint tag", latest, tag);
  return tag;
}

// The rank files of the folder: optim_states by data-parallel rank, and
// the model states (one file at stages 1-2, one per rank at stage 3).
struct FolderFiles {
  std::vector<std::string> optim;
  std::vector<std::string> model;
};

FolderFiles find_files(const std::string& tag_dir) {
  static const std::regex optim_re(R"(^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$)");
  static const std::regex model_re(R"(^(zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$)");
  std::map<int, std::string> optim, model;
  for (const auto& name : fs::list_directory(tag_dir)) {
    std::smatch m;
    if (name.rfind("layer_", 0) == 0) {
      TANDEM_THROW(CheckpointError, "'{}/{}' is a pipeline-parallel layer file; tandem imports "
                                    "data-parallel ZeRO checkpoints only",
                   tag_dir, name);
    }
    const bool is_optim = std::regex_match(name, m, optim_re);
    if (!is_optim && !std::regex_match(name, m, model_re)) continue;
    const std::string mp = m[3].str();
    TANDEM_CHECK_FILE(std::stoi(mp) == 0, "'{}/{}' belongs to tensor-parallel rank {}; tandem imports "
                                     "data-parallel ZeRO checkpoints only (mp_rank_00)",
                 tag_dir, name, mp);
    const int rank = m[2].matched ? std::stoi(m[2].str()) : -1;
    (is_optim ? optim : model)[rank] = tag_dir + "/" + name;
  }
  FolderFiles out;
  for (const auto& [rank, path] : optim) {
    TANDEM_CHECK_FILE(rank == static_cast<int>(out.optim.size()),
                 "'{}' lacks the optimizer states of data-parallel rank {}", tag_dir,
                 out.optim.size());
    out.optim.push_back(path);
  }
  TANDEM_CHECK_FILE(!out.optim.empty(),
               "'{}' holds no *_optim_states.pt: a checkpoint saved without ZeRO (its "
               "optimizer lives in the model states). Import its weights with `tandem "
               "checkpoint import {}/mp_rank_00_model_states.pt OUT.safetensors`",
               tag_dir, tag_dir);
  if (model.count(-1)) {
    out.model.push_back(model[-1]);
  } else {
    for (std::size_t r = 0; r < out.optim.size(); ++r) {
      TANDEM_CHECK_FILE(model.count(static_cast<int>(r)), "'{}' lacks the model states of rank {}",
                   tag_dir, r);
      out.model.push_back(model[static_cast<int>(r)]);
    }
  }
  return out;
}

}  // namespace

bool is_deepspeed_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) return false;
  if (fs::is_regular_file(dir + "/latest")) return true;
  std::error_code ec;
  for (const auto& entry : fs::list_directory(dir, ec)) {
    if (!fs::is_directory(dir + "/" + entry)) continue;
    for (const auto& name : fs::list_directory(dir + "/" + entry, ec)) {
      if (name.size() > 16 && name.substr(name.size() - 16) == "_model_states.pt") return true;
    }
  }
  return false;
}

DeepSpeedCheckpoint read_deepspeed_checkpoint(const std::string& dir, const std::string& tag) {
  DeepSpeedCheckpoint out;
  out.tag = tag.empty() ? read_tag(dir) : tag;
  const std::string tag_dir = dir + "/" + out.tag;
  TANDEM_CHECK_FILE(fs::is_directory(tag_dir), "'{}' is not a folder: no checkpoint '{}' in '{}'",
               tag_dir, out.tag, dir);
  const FolderFiles files = find_files(tag_dir);
  out.world_size = static_cast<int>(files.optim.size());

  OptimizerFiles optim;
  for (std::size_t r = 0; r < files.optim.size(); ++r) {
    DsFile file(files.optim[r]);
    read_optimizer_file(file, static_cast<int>(r), optim);
  }
  out.zero_stage = optim.zero_stage;
  out.optimizer_step = optim.step;
  out.param_groups = std::move(optim.param_groups);
  out.loss_scaler = std::move(optim.loss_scaler);
  TANDEM_CHECK_FILE(optim.zero_stage == 3 || files.model.size() == 1,
               "'{}' holds per-rank model states but was saved at ZeRO stage {}", tag_dir,
               optim.zero_stage);

  std::vector<std::unique_ptr<DsFile>> models;
  for (const auto& path : files.model) models.push_back(std::make_unique<DsFile>(path));
  DsFile& model = *models[0];
  const PickleValue& root = model.root();
  out.global_steps = model.integer(root, "global_steps", 0);
  out.skipped_steps = model.integer(root, "skipped_steps", 0);
  out.global_samples = model.integer(root, "global_samples", 0);
  const int64_t dp = model.integer(root, "dp_world_size", out.world_size);
  TANDEM_CHECK_FILE(dp == out.world_size, "'{}' says dp_world_size {} but the folder holds {} "
                                     "ranks' optimizer states",
               model.path(), dp, out.world_size);
  if (const PickleValue* v = pickle_dict_find(root, "ds_version"); v && v->kind == K::kString) {
    out.ds_version = v->text;
  }
  if (const PickleValue* v = pickle_dict_find(root, "ds_config")) {
    out.ds_config = model.json(*v, "ds_config");
  }
  const PickleValue* sched = pickle_dict_find(root, "lr_scheduler");
  out.lr_scheduler = sched ? model.json(*sched, "lr_scheduler") : nullptr;
  out.client_state = nlohmann::ordered_json::object();
  for (const auto& [key, value] : root.entries) {
    if (key->kind != K::kString) continue;
    if (engine_keys().count(key->text) == 0) {
      out.client_state[key->text] = model.json(*value, key->text);
    } else if ((key->text == "data_sampler" || key->text == "random_ltd" ||
                key->text == "sparse_tensor_module_names") &&
               value->kind != K::kNone &&
               !(value->kind == K::kList && value->items.empty()) &&
               !(value->kind == K::kDict && value->entries.empty())) {
      out.not_carried.push_back(key->text);
    }
  }
  if (const PickleValue* shared = pickle_dict_find(root, "shared_params")) {
    for (const auto& [k, v] : shared->entries) {
      if (k->kind == K::kString && v->kind == K::kString) out.shared[k->text] = v->text;
    }
  }

  // The module: buffers, dtypes, and (stages 1-2) the whole weights.
  const PickleValue& module = model.at(root, "module", K::kDict, "");
  std::map<std::string, at::Tensor> module_tensors;
  for (const auto& [key, value] : module.entries) {
    if (key->kind == K::kString && value->kind == K::kTensor) {
      module_tensors[key->text] = model.tensor(*value, "module." + key->text);
    }
  }
  if (const PickleValue* names = pickle_dict_find(root, "buffer_names")) {
    for (const auto& n : names->items) {
      if (n->kind != K::kString) continue;
      auto it = module_tensors.find(n->text);
      TANDEM_CHECK_FILE(it != module_tensors.end(), "'{}': buffer '{}' is not in the module",
                   model.path(), n->text);
      out.buffers.emplace_back(n->text, it->second);
    }
  }

  // Trainable parameters from the partitions.
  const auto groups = param_shapes(model);
  const int world = out.world_size;
  for (const auto& rank : optim.ranks) {
    TANDEM_CHECK_FILE(rank.fp32.size() == groups.size(),
                 "'{}': the optimizer has {} param group(s) but param_shapes lists {}", tag_dir,
                 rank.fp32.size(), groups.size());
  }
  auto state_names = [&](std::size_t g) {
    std::vector<std::string> names;
    for (const auto& [n, t] : optim.ranks[0].state[g]) names.push_back(n);
    return names;
  };
  auto state_of = [&](const RankPartition& rank, std::size_t g, const std::string& n) {
    for (const auto& [name, t] : rank.state[g]) {
      if (name == n) return t;
    }
    TANDEM_THROW(CheckpointError, "'{}': optimizer state '{}' of param group {} is missing on "
                                  "some ranks",
                 tag_dir, n, g);
  };
  auto module_like = [&](const std::string& name, const at::Tensor& master,
                         const std::vector<int64_t>& shape) {
    auto it = module_tensors.find(name);
    if (it != module_tensors.end() && it->second.numel() == master.numel()) {
      return it->second.reshape(shape);  // stages 1-2: the module's own weights
    }
    const auto dtype = it != module_tensors.end() ? it->second.scalar_type() : at::kFloat;
    return master.to(dtype).reshape(shape);
  };
  if (optim.zero_stage <= 2) {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      std::vector<at::Tensor> pieces;
      for (const auto& rank : optim.ranks) pieces.push_back(rank.fp32[g]);
      const at::Tensor flat = at::cat(pieces);
      std::vector<std::pair<std::string, at::Tensor>> states;
      for (const auto& n : state_names(g)) {
        std::vector<at::Tensor> parts;
        for (const auto& rank : optim.ranks) parts.push_back(state_of(rank, g, n));
        states.emplace_back(n, at::cat(parts));
      }
      const auto& pads = optim.ranks[0].alignment_paddings;
      int64_t offset = 0;
      for (std::size_t i = 0; i < groups[g].size(); ++i) {
        const auto& [name, shape] = groups[g][i];
        const int64_t n = numel_of(shape);
        TANDEM_CHECK_FILE(offset + n <= flat.numel(),
                     "'{}': param group {} holds {} elements, too few for its parameters "
                     "(at '{}')",
                     tag_dir, g, flat.numel(), name);
        DeepSpeedParameter p = parameter(name, shape, static_cast<int>(g));
        p.master = flat.narrow(0, offset, n).reshape(shape).clone();
        for (const auto& [sn, st] : states) {
          p.state.emplace_back(sn, st.narrow(0, offset, n).reshape(shape).clone());
        }
        p.value = module_like(name, p.master, shape);
        out.parameters.push_back(std::move(p));
        offset += n + (g < pads.size() && i < pads[g].size() ? pads[g][i] : 0);
      }
    }
  } else {
    // Each rank's groups back to back; every parameter takes ceil(n/world).
    std::vector<at::Tensor> flats;
    std::vector<std::map<std::string, at::Tensor>> rank_states;
    std::vector<std::string> names = state_names(0);
    for (const auto& rank : optim.ranks) {
      flats.push_back(at::cat(rank.fp32));
      auto& m = rank_states.emplace_back();
      for (const auto& n : names) {
        std::vector<at::Tensor> parts;
        for (std::size_t g = 0; g < groups.size(); ++g) parts.push_back(state_of(rank, g, n));
        m[n] = at::cat(parts);
      }
    }
    int64_t offset = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (const auto& [name, shape] : groups[g]) {
        const int64_t n = numel_of(shape);
        const int64_t part = (n + world - 1) / world;
        auto gather = [&](auto piece_of) {
          std::vector<at::Tensor> pieces;
          for (int r = 0; r < world; ++r) {
            const at::Tensor& src = piece_of(r);
            TANDEM_CHECK_FILE(offset + part <= src.numel(),
                         "'{}': rank {}'s partition holds {} elements, too few for its "
                         "parameters (at '{}')",
                         tag_dir, r, src.numel(), name);
            pieces.push_back(src.narrow(0, offset, part));
          }
          return at::cat(pieces).narrow(0, 0, n).reshape(shape).clone();
        };
        DeepSpeedParameter p = parameter(name, shape, static_cast<int>(g));
        p.master = gather([&](int r) -> const at::Tensor& { return flats[r]; });
        for (const auto& sn : names) {
          p.state.emplace_back(sn, gather([&](int r) -> const at::Tensor& {
                                 return rank_states[r].at(sn);
                               }));
        }
        p.value = module_like(name, p.master, shape);
        out.parameters.push_back(std::move(p));
        offset += part;
      }
    }
  }

  // Frozen parameters: whole at stages 1-2, a ceil(n/world) piece per rank
  // at stage 3.
  if (const PickleValue* shapes = pickle_dict_find(root, "frozen_param_shapes");
      shapes != nullptr && shapes->kind == K::kDict) {
    for (const auto& [key, value] : shapes->entries) {
      if (key->kind != K::kString) continue;
      const std::string& name = key->text;
      const std::vector<int64_t> shape = shape_of(model, *value, name);
      std::vector<at::Tensor> pieces;
      for (auto& file : models) {
        const PickleValue& frags =
            file->at(file->root(), "frozen_param_fragments", K::kDict, "");
        pieces.push_back(
            file->tensor(file->at(frags, name, K::kTensor, "frozen_param_fragments"), name)
                .reshape({-1}));
      }
      at::Tensor whole = at::cat(pieces);
      TANDEM_CHECK_FILE(whole.numel() >= numel_of(shape),
                   "'{}': frozen parameter '{}' has {} elements saved, [{}] needs {}", tag_dir,
                   name, whole.numel(), fmt::join(shape, ", "), numel_of(shape));
      DeepSpeedParameter p = parameter(name, shape, -1);
      p.value = whole.narrow(0, 0, numel_of(shape)).reshape(shape).clone();
      out.parameters.push_back(std::move(p));
    }
  }
  // Parameters no list names (stage 1 keeps frozen ones only in the
  // module): frozen, whole from the module.
  std::set<std::string> covered;
  for (const auto& p : out.parameters) covered.insert(p.name);
  for (const auto& [name, t] : out.buffers) covered.insert(name);
  for (const auto& [alias, name] : out.shared) covered.insert(alias);
  for (const auto& [name, t] : module_tensors) {
    if (covered.count(name)) continue;
    TANDEM_CHECK_FILE(t.numel() > 0 || optim.zero_stage < 3,
                 "'{}': module entry '{}' is partitioned but the folder keeps no fragments of "
                 "it (frozen_param_fragments)",
                 model.path(), name);
    DeepSpeedParameter p = parameter(name, t.sizes().vec(), -1);
    p.value = t;
    out.parameters.push_back(std::move(p));
  }
  out.module_dtype = "F32";
  for (const auto& p : out.parameters) {
    auto it = module_tensors.find(p.name);
    if (it != module_tensors.end() && it->second.is_floating_point()) {
      const auto t = it->second.scalar_type();
      out.module_dtype = t == at::kBFloat16 ? "BF16" : t == at::kHalf ? "F16" : "F32";
      break;
    }
  }
  return out;
}

}  // namespace tandem::detail
