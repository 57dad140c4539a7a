#include "tandem/core/slurm.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "core/text.h"
#include "tandem/core/error.h"

extern char** environ;

namespace tandem {
namespace {

using detail::find_variable;
using VarMap = std::map<std::string, std::string>;

bool all_digits(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
}

[[noreturn]] void bad_list(const std::string& list, const std::string& why) {
  TANDEM_THROW(UsageError, "Slurm host list '{}' is malformed: {}", list, why);
}

// "a,b,,c" -> a b "" c (every item, empty ones too).
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  for (std::size_t comma; (comma = text.find(',', start)) != std::string::npos; start = comma + 1) {
    items.push_back(text.substr(start, comma - start));
  }
  items.push_back(text.substr(start));
  return items;
}

// The names one bracket expression stands for: "01-03,7" -> 01 02 03 7,
// each range keeping the width of its first bound.
std::vector<std::string> expand_bracket(const std::string& list, const std::string& inside) {
  std::vector<std::string> out;
  for (const std::string& item : split_commas(inside)) {
    const std::size_t dash = item.find('-');
    const std::string low = item.substr(0, dash);
    const std::string high = dash == std::string::npos ? low : item.substr(dash + 1);
    if (!all_digits(low) || !all_digits(high)) {
      bad_list(list, fmt::format("'{}' in [{}] is not a number or a range N-M", item, inside));
    }
    const unsigned long first = std::stoul(low), last = std::stoul(high);
    if (last < first) bad_list(list, fmt::format("range '{}' runs backwards", item));
    if (last - first > 1000000) bad_list(list, fmt::format("range '{}' is too long", item));
    for (unsigned long n = first; n <= last; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < low.size()) digits.insert(0, low.size() - digits.size(), '0');
      out.push_back(digits);
    }
  }
  return out;
}

// One group ("rack[1-2]-n[01-02]"): every combination, the first bracket
// outermost.
void expand_group(const std::string& list, const std::string& group,
                  std::vector<std::string>& out) {
  const std::size_t open = group.find('[');
  if (open == std::string::npos) {
    if (group.find(']') != std::string::npos) bad_list(list, "a ']' without its '['");
    out.push_back(group);
    return;
  }
  const std::size_t close = group.find(']', open);
  if (close == std::string::npos) bad_list(list, "a '[' without its ']'");
  const std::string prefix = group.substr(0, open);
  const std::string rest = group.substr(close + 1);
  for (const std::string& middle : expand_bracket(list, group.substr(open + 1, close - open - 1))) {
    expand_group(list, prefix + middle + rest, out);
  }
}

int read_int(const VarMap& vars, const char* name, int fallback, int min_value) {
  const std::string* text = find_variable(vars, name);
  if (text == nullptr) return fallback;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text->c_str(), &end, 10);
  if (errno != 0 || end == text->c_str() || *end != '\0' || value < min_value || value > 1 << 24) {
    TANDEM_THROW(UsageError, "environment variable {}='{}' is not an integer >= {}; Slurm sets it "
                 "for each task: unset it outside a Slurm job",
                 name, *text, min_value);
  }
  return static_cast<int>(value);
}

const std::string& first_set(const VarMap& vars, const char* name, const char* fallback_name,
                             const char** chosen) {
  static const std::string kEmpty;
  if (const std::string* text = find_variable(vars, name)) {
    *chosen = name;
    return *text;
  }
  if (const std::string* text = find_variable(vars, fallback_name)) {
    *chosen = fallback_name;
    return *text;
  }
  *chosen = name;
  return kEmpty;
}

}  // namespace

std::vector<std::string> expand_slurm_host_list(const std::string& list) {
  std::vector<std::string> hosts;
  std::string group;
  int depth = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) bad_list(list, "a ']' without its '['");
    if (c == ',' && depth == 0) {
      if (group.empty()) bad_list(list, "an empty host name");
      expand_group(list, group, hosts);
      group.clear();
      continue;
    }
    if (c == ' ' || c == '\t') bad_list(list, "a space");
    group += c;
  }
  if (depth != 0) bad_list(list, "a '[' without its ']'");
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& list) {
  std::vector<int> counts;
  for (const std::string& item : split_commas(list)) {
    const std::size_t paren = item.find("(x");
    const std::string count = item.substr(0, paren);
    std::string repeat = "1";
    if (paren != std::string::npos) {
      if (item.back() != ')') {
        TANDEM_THROW(UsageError, "Slurm tasks-per-node list '{}' is malformed at '{}'", list, item);
      }
      repeat = item.substr(paren + 2, item.size() - paren - 3);
    }
    if (!all_digits(count) || !all_digits(repeat) || count.size() > 6 || repeat.size() > 6) {
      TANDEM_THROW(UsageError,
                   "Slurm tasks-per-node list '{}' is malformed at '{}': expected N or N(xK)", list,
                   item);
    }
    counts.insert(counts.end(), std::stoul(repeat), std::stoi(count));
  }
  return counts;
}

int slurm_step_port(const std::string& job_id, const std::string& step_id) {
  TANDEM_CHECK_ARG(all_digits(job_id),
                   "SLURM_JOB_ID='{}' is not a job id (a number), so no rendezvous port can be "
                   "derived from it; unset it outside a Slurm job, or give MASTER_PORT",
                   job_id);
  TANDEM_CHECK_ARG(step_id.empty() || all_digits(step_id),
                   "SLURM_STEP_ID='{}' is not a step id (a number), so no rendezvous port can be "
                   "derived from it; unset it outside a Slurm job, or give MASTER_PORT",
                   step_id);
  const std::string digits = job_id.size() > 4 ? job_id.substr(job_id.size() - 4) : job_id;
  const std::string step_digits = step_id.size() > 4 ? step_id.substr(step_id.size() - 4) : step_id;
  const int step = step_digits.empty() ? 0 : std::stoi(step_digits) % 5;
  return 15000 + std::stoi(digits) + 10000 * step;
}

std::optional<bool> slurm_batch_flag(const std::string& scontrol_show_job) {
  // Fields are "Key=Value" separated by spaces (one line with -o).
  const std::string key = "BatchFlag=";
  for (std::size_t at = scontrol_show_job.find(key); at != std::string::npos;
       at = scontrol_show_job.find(key, at + 1)) {
    if (at > 0 && !std::isspace(static_cast<unsigned char>(scontrol_show_job[at - 1]))) continue;
    const std::size_t value_at = at + key.size();
    const char value = value_at < scontrol_show_job.size() ? scontrol_show_job[value_at] : '\0';
    if (value == '0' || value == '1') return value == '1';
  }
  return std::nullopt;
}

std::string SlurmStep::describe() const {
  return fmt::format("Slurm job {}{} on {}: node {} of {}, task {} of {}", job_id,
                     in_batch_script() ? " (batch script)" : "." + step_id, node_list, node_id,
                     num_nodes(), proc_id, num_tasks);
}

std::optional<SlurmStep> SlurmStep::from_environment() {
  VarMap vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string kv(*entry);
    const auto eq = kv.find('=');
    if (eq != std::string::npos && kv.rfind("SLURM", 0) == 0) {
      vars.emplace(kv.substr(0, eq), kv.substr(eq + 1));
    }
  }
  return from_map(vars);
}

std::optional<SlurmStep> SlurmStep::from_map(const VarMap& vars) {
  if (!find_variable(vars, "SLURM_PROCID") ||
      (!find_variable(vars, "SLURM_JOB_ID") && !find_variable(vars, "SLURM_NTASKS"))) {
    return std::nullopt;
  }
  SlurmStep step;
  if (const std::string* id = find_variable(vars, "SLURM_JOB_ID")) step.job_id = *id;
  if (const std::string* id = find_variable(vars, "SLURM_STEP_ID")) step.step_id = *id;
  const char* list_name = nullptr;
  step.node_list = first_set(vars, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", &list_name);
  if (step.node_list.empty()) step.node_list = first_set(vars, "SLURM_NODELIST", "", &list_name);
  step.hosts = step.node_list.empty() ? std::vector<std::string>{"localhost"}
                                      : expand_slurm_host_list(step.node_list);
  const char* tasks_name = nullptr;
  const std::string& per_node =
      first_set(vars, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", &tasks_name);
  step.num_tasks = read_int(vars, find_variable(vars, "SLURM_STEP_NUM_TASKS")
                                      ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS",
                            0, 1);
  if (!per_node.empty()) {
    step.tasks_per_node = expand_slurm_tasks_per_node(per_node);
  } else {
    // Without the list (an environment written by hand): the same count on
    // every node, SLURM_NTASKS_PER_NODE or the tasks over the nodes.
    const int nodes = read_int(vars, "SLURM_NNODES", step.num_nodes(), 1);
    const int each = read_int(vars, "SLURM_NTASKS_PER_NODE", std::max(1, step.num_tasks / nodes), 1);
    step.tasks_per_node.assign(step.hosts.size(), each);
  }
  if (step.tasks_per_node.size() != step.hosts.size()) {
    TANDEM_THROW(UsageError,
                 "Slurm's {}='{}' gives {} nodes' task counts but {}='{}' names {} hosts; the "
                 "job's environment is inconsistent",
                 tasks_name, per_node, step.tasks_per_node.size(), list_name, step.node_list,
                 step.hosts.size());
  }
  int sum = 0;
  for (int n : step.tasks_per_node) sum += n;
  if (step.num_tasks == 0) step.num_tasks = sum;
  if (!per_node.empty() && sum != step.num_tasks) {
    TANDEM_THROW(UsageError,
                 "Slurm's {}='{}' adds up to {} tasks, not the step's {}; the job's environment "
                 "is inconsistent",
                 tasks_name, per_node, sum, step.num_tasks);
  }
  step.node_id = read_int(vars, "SLURM_NODEID", 0, 0);
  step.proc_id = read_int(vars, "SLURM_PROCID", 0, 0);
  step.local_id = read_int(vars, "SLURM_LOCALID", 0, 0);
  step.cpus_per_task = read_int(vars, "SLURM_CPUS_PER_TASK", 0, 1);
  step.restart_count = read_int(vars, "SLURM_RESTART_COUNT", 0, 0);
  if (step.node_id >= step.num_nodes()) {
    TANDEM_THROW(UsageError, "SLURM_NODEID={} is past {}='{}' ({} hosts)", step.node_id, list_name,
                 step.node_list, step.num_nodes());
  }
  if (step.proc_id >= step.num_tasks) {
    TANDEM_THROW(UsageError, "SLURM_PROCID={} is not below the step's {} tasks", step.proc_id,
                 step.num_tasks);
  }
  if (step.local_id >= step.local_tasks()) {
    TANDEM_THROW(UsageError, "SLURM_LOCALID={} is not below the {} tasks on node {}",
                 step.local_id, step.local_tasks(), step.node_id);
  }
  return step;
}

}  // namespace tandem
