#include "config/config_wizard.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "tandem/config/config.h"
#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

constexpr int64_t kMaxCount = 1 << 20;

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

// Lower case with '_' read as '-', so MULTI_GPU matches multi-gpu.
std::string fold(const std::string& text) {
  std::string out = trim(text);
  for (auto& c : out) {
    c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::optional<int64_t> parse_int(const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

Question choice(std::string key, std::string prompt, std::vector<Choice> choices,
                std::string default_answer) {
  Question q;
  q.key = std::move(key);
  q.prompt = std::move(prompt);
  q.kind = AnswerKind::kChoice;
  q.choices = std::move(choices);
  q.default_answer = std::move(default_answer);
  return q;
}

Question value(std::string key, std::string prompt, AnswerKind kind, std::string default_answer,
               int64_t min = 0, int64_t max = 0) {
  Question q;
  q.key = std::move(key);
  q.prompt = std::move(prompt);
  q.kind = kind;
  q.default_answer = std::move(default_answer);
  q.min = min;
  q.max = max;
  return q;
}

const char* kClusterNote =
    "On a cluster, srun or mpirun starts the processes and tandem reads the rank, world size "
    "and main address from Slurm (SLURM_PROCID, SLURM_NTASKS, ...) or Open MPI "
    "(OMPI_COMM_WORLD_RANK, ...) itself: start your program with them, not with `tandem "
    "launch`. The machine questions are skipped; the rest set how it trains.";

}  // namespace

int Question::default_index() const {
  int index = match_choice(*this, default_answer);
  return index < 0 ? 0 : index;
}

int match_choice(const Question& question, const std::string& text) {
  const std::string folded = fold(text);
  if (folded.empty()) return -1;
  for (size_t i = 0; i < question.choices.size(); ++i) {
    if (fold(question.choices[i].name) == folded || fold(question.choices[i].label) == folded) {
      return static_cast<int>(i);
    }
  }
  auto index = parse_int(folded);
  if (index && *index >= 0 && *index < static_cast<int64_t>(question.choices.size())) {
    return static_cast<int>(*index);
  }
  return -1;
}

ConfigWizard::ConfigWizard(WizardContext context) : context_(context) {
  current_ = next_question();
}

std::string ConfigWizard::get(const std::string& key, const std::string& fallback) const {
  auto it = answers_.find(key);
  return it == answers_.end() ? fallback : it->second;
}

int64_t ConfigWizard::get_int(const std::string& key, int64_t fallback) const {
  auto it = answers_.find(key);
  if (it == answers_.end()) return fallback;
  return parse_int(it->second).value_or(fallback);
}

// The flow: the first question that applies and has no answer yet.
std::optional<Question> ConfigWizard::next_question() const {
  auto missing = [&](const char* key) { return answers_.count(key) == 0; };
  if (missing("compute_environment")) {
    return choice("compute_environment", "In which compute environment are you running?",
                  {{"local", "This machine"},
                   {"cluster", "A Slurm or MPI cluster (srun or mpirun starts the processes)"}},
                  "local");
  }
  if (missing("distributed_type")) {
    return choice("distributed_type", "Which type of machine are you using?",
                  {{"no", "No distributed training"},
                   {"multi-cpu", "multi-CPU"},
                   {"multi-gpu", "multi-GPU"}},
                  "no");
  }
  const std::string type = get("distributed_type");
  const bool distributed = type != "no";
  const bool local = get("compute_environment") == "local";
  if (distributed && local) {
    if (missing("num_machines")) {
      return value("num_machines",
                   "How many different machines will you use (more than 1 for multi-node "
                   "training)?",
                   AnswerKind::kInteger, "1", 1, kMaxCount);
    }
    const int64_t machines = get_int("num_machines", 1);
    if (machines > 1) {
      if (missing("machine_rank")) {
        return value("machine_rank",
                     fmt::format("What is the rank of this machine (0 to {})?", machines - 1),
                     AnswerKind::kInteger, "0", 0, machines - 1);
      }
      if (missing("main_process_ip")) {
        return value("main_process_ip",
                     "What is the IP address of the machine that will host the main process "
                     "(machine rank 0)?",
                     AnswerKind::kAddress, "");
      }
      if (missing("main_process_port")) {
        return value("main_process_port",
                     "What is the port you will use to communicate with the main process?",
                     AnswerKind::kInteger, "29500", 1, 65535);
      }
    }
  }
  if (distributed && missing("num_processes")) {
    const int64_t machines = get_int("num_machines", 1);
    const bool gpu = type == "multi-gpu";
    const int64_t per_machine = gpu ? std::max(1, context_.local_gpus) : 1;
    // One GPU process on one machine is refused (validate()): not offered.
    const int64_t total = gpu && machines == 1 ? std::max<int64_t>(2, per_machine)
                                               : machines * per_machine;
    return value("num_processes",
                 gpu ? "How many processes in total, across all machines (one per GPU)?"
                     : "How many CPU processes in total, across all machines?",
                 AnswerKind::kInteger, std::to_string(total), 1, kMaxCount);
  }
  // On a cluster the scheduler picks the GPUs (CUDA_VISIBLE_DEVICES).
  if (type == "multi-gpu" && local && missing("gpu_ids")) {
    return value("gpu_ids",
                 "Which GPUs (by id) should be used on this machine, as a comma-separated list?",
                 AnswerKind::kGpuIds, "all");
  }
  if (missing("mixed_precision")) {
    // A multi-CPU file trains on the CPU (use_cpu), where the Accelerator
    // refuses fp16: not offered (validate() says why when it is typed).
    if (type == "multi-cpu") {
      return choice("mixed_precision",
                    "Do you wish to use mixed precision (bf16 on CPUs; fp16 needs a GPU)?",
                    {{"no", "no"}, {"bf16", "bf16"}}, "no");
    }
    return choice("mixed_precision", "Do you wish to use mixed precision?",
                  {{"no", "no"}, {"bf16", "bf16"}, {"fp16", "fp16"}}, "no");
  }
  if (distributed) {
    if (missing("zero_stage")) {
      return choice("zero_stage", "Which ZeRO stage (DeepSpeed-style sharding)?",
                    {{"0", "none: plain data parallel (DDP)"},
                     {"1", "shard the optimizer states"},
                     {"2", "shard the optimizer states and gradients"},
                     {"3", "shard the optimizer states, gradients and parameters"}},
                    "0");
    }
    const int64_t stage = get_int("zero_stage", 0);
    if (stage >= 1 && missing("offload_optimizer_device")) {
      return choice("offload_optimizer_device", "Where should the optimizer states be offloaded?",
                    {{"none", "none"}, {"cpu", "cpu"}}, "none");
    }
    if (stage == 3 && missing("offload_param_device")) {
      return choice("offload_param_device", "Where should the parameters be offloaded?",
                    {{"none", "none"}, {"cpu", "cpu"}}, "none");
    }
  }
  if (missing("gradient_accumulation_steps")) {
    return value("gradient_accumulation_steps", "How many gradient accumulation steps?",
                 AnswerKind::kInteger, "1", 1, kMaxCount);
  }
  if (missing("gradient_clipping")) {
    return value("gradient_clipping", "Clip gradients to which global norm (0: no clipping)?",
                 AnswerKind::kNumber, "0");
  }
  return std::nullopt;
}

// Returns why `text` is not a valid answer, or "" after writing the
// canonical form to *canonical.
std::string ConfigWizard::validate(const Question& question, const std::string& text,
                                   std::string* canonical) const {
  switch (question.kind) {
    case AnswerKind::kChoice: {
      int index = match_choice(question, text);
      if (index < 0 && question.key == "mixed_precision" && fold(text) == "fp16") {
        return "fp16 needs a CUDA device, and a multi-CPU config trains on the CPU, where the "
               "Accelerator refuses it: answer bf16 (or no)";
      }
      if (index < 0) {
        std::string names;
        for (size_t i = 0; i < question.choices.size(); ++i) {
          names += fmt::format("{}{} ({})", i == 0 ? "" : ", ", i, question.choices[i].name);
        }
        return fmt::format("'{}' is not one of the choices; type a number or a name: {}", text,
                           names);
      }
      *canonical = question.choices[index].name;
      return "";
    }
    case AnswerKind::kInteger: {
      auto number = parse_int(text);
      if (!number) return fmt::format("'{}' is not a whole number", text);
      if (*number < question.min || *number > question.max) {
        return fmt::format("{} is out of range: answer a number from {} to {}", *number,
                           question.min, question.max);
      }
      if (question.key == "num_processes") {
        const int64_t machines = get_int("num_machines", 1);
        // Accelerate's wizard refuses this too: one GPU on one machine is
        // no distributed training.
        if (*number == 1 && machines == 1 && get("distributed_type") == "multi-gpu") {
          return "multi-GPU with 1 process on 1 machine is no distributed training: answer 2 or "
                 "more, or start again and choose 'no' distributed training";
        }
        if (*number % machines != 0) {
          return fmt::format(
              "{} processes cannot be split evenly over {} machines; every machine runs the "
              "same number, so answer a multiple of {}",
              *number, machines, machines);
        }
      }
      *canonical = std::to_string(*number);
      return "";
    }
    case AnswerKind::kNumber: {
      if (fold(text) == "none") {
        *canonical = "0";
        return "";
      }
      char* end = nullptr;
      double number = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(number)) {
        return fmt::format("'{}' is not a number", text);
      }
      if (number < 0) return fmt::format("{} is negative: answer 0 (no clipping) or more", text);
      *canonical = text;
      return "";
    }
    case AnswerKind::kAddress: {
      if (text.empty()) {
        return "an address is needed: the other machines connect to it (e.g. 10.0.0.1 or "
               "node001)";
      }
      const std::string problem = host_address_problem(text);
      if (!problem.empty()) return problem;
      *canonical = text;
      return "";
    }
    case AnswerKind::kGpuIds: {
      if (fold(text) == "all") {
        *canonical = "all";
        return "";
      }
      std::set<int64_t> seen;
      std::string ids;
      size_t start = 0;
      while (start <= text.size()) {
        size_t comma = text.find(',', start);
        std::string item = trim(text.substr(start, comma == std::string::npos ? comma : comma - start));
        auto id = parse_int(item);
        if (!id || *id < 0 || *id > 1023) {
          return fmt::format("'{}' is not a list of GPU ids: write e.g. 0,1,3 or all", text);
        }
        if (!seen.insert(*id).second) return fmt::format("GPU {} is listed twice", *id);
        ids += (ids.empty() ? "" : ",") + std::to_string(*id);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      const int64_t per_machine = get_int("num_processes", 1) / get_int("num_machines", 1);
      if (static_cast<int64_t>(seen.size()) < per_machine) {
        return fmt::format(
            "{} names {} GPU(s) but each machine runs {} processes, one per GPU: name at least "
            "{} or answer all",
            ids, seen.size(), per_machine, per_machine);
      }
      *canonical = ids;
      return "";
    }
  }
  return "unknown question kind";
}

AnswerOutcome ConfigWizard::answer(const std::string& text) {
  const Question& question = *current_;
  std::string given = trim(text);
  if (given.empty()) {
    if (question.default_answer.empty()) {
      return {false, validate(question, "", &given)};
    }
    given = question.default_answer;
  }
  std::string canonical;
  std::string error = validate(question, given, &canonical);
  if (!error.empty()) return {false, error};

  answers_[question.key] = canonical;
  AnswerOutcome outcome{true, ""};
  if (question.key == "compute_environment" && canonical == "cluster") {
    outcome.message = kClusterNote;
  }
  if (question.key == "distributed_type" && canonical == "multi-gpu" && context_.local_gpus == 0) {
    outcome.message =
        "No GPU is visible on this machine; the config is still written, for a machine that "
        "has them.";
  }
  current_ = next_question();
  return outcome;
}

Config ConfigWizard::config() const {
  Config config;
  config.format = ConfigFormat::kTandemYaml;
  const std::string type = get("distributed_type", "no");
  config.distributed_type = type == "multi-gpu"   ? DistributedType::kMultiGpu
                            : type == "multi-cpu" ? DistributedType::kMultiCpu
                                                  : DistributedType::kNo;
  config.use_cpu = type == "multi-cpu";
  config.num_processes = static_cast<int>(get_int("num_processes", 1));
  config.num_machines = static_cast<int>(get_int("num_machines", 1));
  if (config.num_machines > 1) {
    config.machine_rank = static_cast<int>(get_int("machine_rank", 0));
    config.main_process_ip = get("main_process_ip");
    config.main_process_port = static_cast<int>(get_int("main_process_port", 29500));
  }
  config.gpu_ids = get("gpu_ids", "all");
  const std::string precision = get("mixed_precision", "no");
  config.mixed_precision = precision == "bf16"   ? MixedPrecision::kBf16
                           : precision == "fp16" ? MixedPrecision::kFp16
                                                 : MixedPrecision::kNo;
  config.zero.stage = static_cast<int>(get_int("zero_stage", 0));
  config.zero.offload_optimizer =
      get("offload_optimizer_device") == "cpu" ? OffloadDevice::kCpu : OffloadDevice::kNone;
  config.zero.offload_param =
      get("offload_param_device") == "cpu" ? OffloadDevice::kCpu : OffloadDevice::kNone;
  // One step is what an absent value means too; leaving it out keeps the
  // batch triple free for resolve_config() to infer.
  const int64_t accumulation = get_int("gradient_accumulation_steps", 1);
  if (accumulation > 1) config.gradient_accumulation_steps = accumulation;
  config.gradient_clipping = std::strtod(get("gradient_clipping", "0").c_str(), nullptr);
  return config;
}

Config basic_config(int local_gpus, MixedPrecision mixed_precision) {
  // Without a GPU the file says use_cpu: true, and the Accelerator refuses
  // fp16 on the CPU: the file would start every worker only to stop it.
  TANDEM_CHECK_ARG(local_gpus > 0 || mixed_precision != MixedPrecision::kFp16,
                   "--mixed-precision fp16 needs a CUDA device, and this machine has none, so "
                   "the file would train on the CPU (use_cpu: true), where the Accelerator "
                   "refuses fp16; nothing was written. Use --mixed-precision bf16 (or no) on a "
                   "CPU machine, or write the file on the machine with the GPUs");
  Config config;
  config.format = ConfigFormat::kTandemYaml;
  config.mixed_precision = mixed_precision;
  config.num_processes = std::max(1, local_gpus);
  config.distributed_type = local_gpus > 1 ? DistributedType::kMultiGpu : DistributedType::kNo;
  config.use_cpu = local_gpus == 0;
  return config;
}

}  // namespace tandem::cli
