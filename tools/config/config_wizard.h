#pragma once
// The questions `tandem config` asks, as a pure engine: no terminal, no
// files, no environment. The terminal layer (wizard_terminal.h) shows
// current() and feeds answer() what the user typed or picked; tests drive
// the engine directly.
//
// The questions follow `accelerate config`: compute environment, machine
// type, machines (rank, main address and port), processes, GPU ids, mixed
// precision, then DeepSpeed-style ZeRO stage, offload devices, gradient
// accumulation and clipping. Which questions come depends on earlier answers.
//
// Not thread-safe; one wizard per session.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tandem/config/config.h"

namespace tandem::cli {

struct Choice {
  std::string name;   // short token accepted as an answer, e.g. "multi-gpu"
  std::string label;  // what the menu shows, e.g. "multi-GPU"
};

enum class AnswerKind {
  kChoice,   // one of `choices`: by index (0-based, as Accelerate's menu), name or label
  kInteger,  // a whole number in [min, max]
  kNumber,   // a decimal number >= 0
  kAddress,  // a host name or IP address
  kGpuIds,   // "all" or distinct GPU ids "0,1,3"
};

struct Question {
  std::string key;     // stable id, also the answers() key: "num_machines"
  std::string prompt;  // "How many machines will you use?"
  AnswerKind kind = AnswerKind::kChoice;
  std::vector<Choice> choices;  // kChoice only
  std::string default_answer;   // what an empty answer takes; empty: an answer is required
  int64_t min = 0;              // kInteger bounds
  int64_t max = 0;

  // Index of the choice an empty answer takes (0 when there is no default).
  int default_index() const;
};

// Matches `text` against a choice question: a 0-based index, a name or a
// label, ignoring case and treating '_' as '-'. Returns -1 when none matches.
int match_choice(const Question& question, const std::string& text);

struct AnswerOutcome {
  bool accepted = false;
  // Refused: why, to show before asking again. Accepted: an optional note
  // (e.g. what the cluster answer means), empty when there is nothing to say.
  std::string message;
};

// Facts about this machine the questions' defaults depend on.
struct WizardContext {
  int local_gpus = 0;
};

class ConfigWizard {
 public:
  explicit ConfigWizard(WizardContext context = {});

  // True once every question that applies has an accepted answer.
  bool done() const { return !current_.has_value(); }

  // The question to ask now. Precondition: !done().
  const Question& current() const { return *current_; }

  // Answers current() with what the user typed; an empty (or all blank)
  // text takes the default. Moves on when accepted; otherwise the same
  // question stays current and the outcome says why.
  AnswerOutcome answer(const std::string& text);

  // The accepted answers so far, canonical (choice names, trimmed numbers).
  const std::map<std::string, std::string>& answers() const { return answers_; }

  // The config the answers describe (tandem YAML format). Precondition: done().
  Config config() const;

 private:
  std::optional<Question> next_question() const;
  std::string validate(const Question& question, const std::string& text,
                       std::string* canonical) const;
  std::string get(const std::string& key, const std::string& fallback = "") const;
  int64_t get_int(const std::string& key, int64_t fallback) const;

  WizardContext context_;
  std::map<std::string, std::string> answers_;
  std::optional<Question> current_;
};

// The config `tandem config default` writes, without questions, for a
// machine with `local_gpus` GPUs: two or more GPUs: multi-GPU with one
// process per GPU; one GPU: no distributed training; none: no distributed
// training on the CPU (use_cpu), as Accelerate's write_basic_config does.
// Throws UsageError for fp16 without a GPU: the Accelerator refuses fp16 on
// the CPU.
Config basic_config(int local_gpus, MixedPrecision mixed_precision);

}  // namespace tandem::cli
