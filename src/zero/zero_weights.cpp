// load_safetensors_into_shards: each rank pulls its shard's element ranges
// out of the file set through ZeroOptimizer::load_parameter_shards.

#include "tandem/zero/zero_weights.h"

#include <memory>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "checkpoint/weights_plan.h"
#include "tandem/checkpoint/safetensors_set.h"
#include "tandem/core/error.h"

namespace tandem {
namespace zero_weights {

constexpr const char* kCaller = "load_safetensors_into_shards";

// A failure of one rank, as every rank will rethrow it.
struct Failure {
  enum Kind : char { kNone = '-', kUsage = 'U', kCheckpoint = 'C', kOther = 'E' };
  Kind kind = kNone;
  std::string message;
  std::string encode() const {
    return kind == kNone ? std::string() : std::string(1, static_cast<char>(kind)) + message;
  }
};

// `text` without the "[rank r/N] " its own rank's error put in front, which
// the caller writes again as it names that rank.
std::string without_rank_prefix(const std::string& text) {
  if (text.rfind("[rank ", 0) != 0) return text;
  const std::size_t end = text.find("] ");
  return end == std::string::npos ? text : text.substr(end + 2);
}

Failure failure_of(const std::exception& e) {
  if (dynamic_cast<const UsageError*>(&e) != nullptr) return {Failure::kUsage, e.what()};
  if (dynamic_cast<const CheckpointError*>(&e) != nullptr) return {Failure::kCheckpoint, e.what()};
  return {Failure::kOther, e.what()};
}

// Every rank learns every rank's failure; all throw the first one (their
// own if they failed too), so no rank goes on into a collective alone.
// Under HSDP (`replicate` not null) the other shard groups load the same
// model on other hosts, where a file may be missing: each group's first
// failure goes across too, so the whole world throws or none of it.
void agree(ProcessGroup& pg, ProcessGroup* replicate, const Failure& mine, const char* when) {
  const std::vector<std::string> all = pg.all_gather_strings(mine.encode());
  if (replicate != nullptr) {
    std::string first;  // the same on every rank of this shard group
    for (std::size_t r = 0; r < all.size() && first.empty(); ++r) {
      if (all[r].empty()) continue;
      // Kind first, as encode() puts it; then the rank in its group.
      first = all[r].substr(0, 1) + fmt::format("[rank {}/{}] ", r, all.size()) +
              without_rank_prefix(all[r].substr(1));
    }
    const std::vector<std::string> groups = replicate->all_gather_strings(first);
    for (std::size_t g = 0; g < groups.size() && first.empty(); ++g) {
      if (groups[g].empty()) continue;
      const std::string message =
          fmt::format("[shard group {}/{}] {}{}", g, groups.size(), groups[g].substr(1), when);
      if (groups[g][0] == Failure::kUsage) TANDEM_THROW(UsageError, "{}", message);
      TANDEM_THROW(CheckpointError, "{}", message);
    }
  }
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const bool own = mine.kind != Failure::kNone;
    const char kind = own ? static_cast<char>(mine.kind) : all[r][0];
    const std::string message =
        own ? mine.message + when
            : fmt::format("[rank {}/{}] {}{}", r, all.size(), without_rank_prefix(all[r].substr(1)),
                          when);
    if (kind == Failure::kUsage) TANDEM_THROW(UsageError, "{}", message);
    TANDEM_THROW(CheckpointError, "{}", message);
  }
}

}  // namespace zero_weights

LoadSafetensorsResult load_safetensors_into_shards(ZeroOptimizer& zero, const std::string& path,
                                                   const LoadSafetensorsOptions& options) {
  using namespace zero_weights;
  ProcessGroup& pg = zero.process_group();
  std::unique_ptr<SafetensorsSet> set;
  detail::WeightPlan plan;
  Failure failure;
  try {
    set = std::make_unique<SafetensorsSet>(path);
    plan = detail::plan_weight_load(zero.module(), *set, options, kCaller, pg.rank(),
                                    pg.world_size());
  } catch (const std::exception& e) {
    failure = failure_of(e);
  }
  agree(pg, zero.replicate_group(), failure, " (nothing was loaded on any rank)");

  std::set<std::string> managed;
  for (const auto& group : zero.group_parameter_names()) managed.insert(group.begin(), group.end());
  // ZeRO names a tied parameter by its first name, as the plan does.
  std::unordered_map<std::string, const detail::WeightCopy*> sharded;
  std::vector<const detail::WeightCopy*> whole;
  for (const auto& copy : plan.copies) {
    if (!copy.is_buffer && managed.count(copy.names.front()) != 0) {
      sharded[copy.names.front()] = &copy;
    } else {
      whole.push_back(&copy);
    }
  }

  // Errors are kept, not thrown: the other ranks are in load_parameter_shards'
  // all-gathers, and must see this rank there too.
  auto guarded_read = [&](const detail::WeightCopy& copy, int64_t begin, const at::Tensor& dst) {
    if (failure.kind != Failure::kNone) return false;
    try {
      set->read_range_into(copy.entry->name, begin, dst);
      return true;
    } catch (const std::exception& e) {
      failure = failure_of(e);
      failure.message = fmt::format("{}: reading '{}' from '{}' failed: {}", kCaller,
                                    copy.entry->name, set->path(), failure.message);
      return false;
    }
  };
  zero.load_parameter_shards([&](const std::string& name, int64_t begin, const at::Tensor& dst) {
    const auto it = sharded.find(name);
    return it != sharded.end() && guarded_read(*it->second, begin, dst);
  });
  {
    torch::NoGradGuard no_grad;
    for (const detail::WeightCopy* copy : whole) guarded_read(*copy, 0, copy->tensor.detach());
  }
  agree(pg, zero.replicate_group(), failure, " (the model may now mix old and new values)");

  LoadSafetensorsResult& result = plan.result;
  for (const auto& copy : plan.copies) {
    result.loaded.insert(result.loaded.end(), copy.names.begin(), copy.names.end());
  }
  result.bytes_read = set->bytes_read();
  return result;
}

}  // namespace tandem
