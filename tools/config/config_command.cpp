// `tandem config`: the wizard, `check` and `default`.

#include "config/config_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "config/config_wizard.h"
#include "config/wizard_terminal.h"
#include "tandem/config/config.h"
#include "tandem/config/config_keys.h"
#include "cli_parse.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem::cli {
namespace {

// The file `path` stands for: a symbolic link is written through, as
// Accelerate's open(path, "w") does, dangling or not.
std::string written_path(const std::string& path) {
  struct stat link {};
  if (::lstat(path.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) return path;
  if (char* real = ::realpath(path.c_str(), nullptr)) {
    std::string resolved(real);
    std::free(real);
    return resolved;
  }
  std::string target(static_cast<size_t>(link.st_size) + 1, '\0');
  const ssize_t size = ::readlink(path.c_str(), target.data(), target.size());
  if (size <= 0) return path;
  target.resize(static_cast<size_t>(size));
  const std::filesystem::path link_path(path);
  if (target.front() == '/' || !link_path.has_parent_path()) return target;
  return (link_path.parent_path() / target).string();
}

// Writes through a temporary file and a rename, so a reader never sees half
// a config and a failure leaves any old file as it was. An existing file
// keeps its permissions.
void write_config_file(const std::string& path, const std::string& text) {
  const std::string file = written_path(path);
  const std::filesystem::path target(file);
  std::error_code error;
  if (target.has_parent_path()) fs::create_directories(target.parent_path().string(), error);
  TANDEM_CHECK_ARG(!error, "cannot create the folder {} for {}: {}", target.parent_path().string(),
                   path, error.message());
  struct stat existing {};
  const bool replaces = ::stat(file.c_str(), &existing) == 0;
  const std::string temporary = file + ".tmp" + std::to_string(::getpid());
  const auto fail = [&](int code) {
    ::unlink(temporary.c_str());
    TANDEM_THROW(UsageError, "cannot write the config {}{}: {}; choose another path with "
                 "--config-file",
                 path, file == path ? "" : " (a link to " + file + ")", std::strerror(code));
  };
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                        replaces ? (existing.st_mode & 07777) : 0666);
  if (fd < 0) fail(errno);
  if (const int code = fs::write_all(fd, text.data(), text.size()); code != 0) {
    ::close(fd);
    fail(code);
  }
  // open() applies the umask; an existing file's own mode is put back.
  if (replaces && ::fchmod(fd, existing.st_mode & 07777) != 0) {
    const int code = errno;
    ::close(fd);
    fail(code);
  }
  if (::close(fd) != 0) fail(errno);
  if (::rename(temporary.c_str(), file.c_str()) != 0) fail(errno);
}

int local_gpu_count() { return static_cast<int>(torch::cuda::device_count()); }

std::string default_path() {
  std::string path = default_config_path(ConfigEnv::from_environment());
  TANDEM_CHECK_ARG(!path.empty(),
                   "neither XDG_CACHE_HOME nor HOME is set, so there is no default config "
                   "path; give one with --config-file");
  return path;
}

// One file: its warnings and verdict on stderr, and what
// resolved_config_json prints.
std::string check_one(const std::string& path, std::optional<int> world_size) {
  Config file = load_config_file(path);
  const int world = world_size.value_or(file.num_processes.value_or(1));
  Config resolved = resolve_config(file, ConfigEnv::from_environment(), {}, world);
  std::vector<std::string> warnings = file.warnings;
  for (const auto& w : resolved.warnings) {
    if (std::find(warnings.begin(), warnings.end(), w) == warnings.end()) warnings.push_back(w);
  }
  for (const auto& w : warnings) std::fprintf(stderr, "tandem config check: warning: %s\n", w.c_str());
  std::fprintf(stderr, "tandem config check: %s is a valid %s config\n", path.c_str(),
               to_string(file.format));
  return resolved_config_json(resolved, world);
}

int run_check(int argc, char** argv) {
  CLI::App app{
      "Validate config files (tandem YAML, Accelerate YAML or DeepSpeed JSON) and print the "
      "resolved config as JSON. Warnings go to stderr. With several files, one JSON line per "
      "file: {\"file\", \"valid\", \"config\"} or {\"file\", \"valid\": false, \"error\"}; "
      "exit 2 when any is refused.",
      "tandem config check"};
  std::vector<std::string> paths;
  std::optional<int> world_size;
  app.add_option("FILE", paths, "the config file(s)")->required();
  app.add_option("--world-size", world_size,
                 "processes to resolve the batch sizes for (default: each file's num_processes, "
                 "else 1)");
  if (auto code = parse_cli(app, argc, argv)) return *code;
  TANDEM_CHECK_ARG(!world_size || *world_size >= 1, "--world-size must be at least 1, got {}",
                   world_size.value_or(0));

  if (paths.size() == 1) {
    std::printf("%s\n", check_one(paths[0], world_size).c_str());
    return 0;
  }
  // Several files (scripts and the conformance test check many in one
  // process: LibTorch's start-up costs about 0.2 s a process). A refused
  // file does not stop the others.
  int status = 0;
  for (const auto& path : paths) {
    nlohmann::ordered_json line{{"file", path}};
    try {
      line["config"] = nlohmann::json::parse(check_one(path, world_size));
      line["valid"] = true;
    } catch (const UsageError& e) {
      std::fprintf(stderr, "tandem config check: error: %s\n", e.what());
      line["valid"] = false;
      line["error"] = e.what();
      status = 2;
    }
    const auto replace_bad_utf8 = nlohmann::ordered_json::error_handler_t::replace;
    std::printf("%s\n", line.dump(-1, ' ', false, replace_bad_utf8).c_str());
  }
  return status;
}

int run_default(int argc, char** argv) {
  CLI::App app{
      "Write a basic config without asking: multi-GPU with one process per GPU when this "
      "machine has two or more, else no distributed training (on the CPU when there is no "
      "GPU).",
      "tandem config default"};
  std::string path;
  std::string precision = "no";
  bool force = false;
  app.add_option("--config-file", path, "where to write (default: tandem's default config path)");
  app.add_option("--mixed-precision", precision, "no, bf16 or fp16");
  app.add_flag("--force", force, "replace an existing file");
  if (auto code = parse_cli(app, argc, argv)) return *code;

  const MixedPrecision mixed_precision = parse_mixed_precision(precision);
  if (path.empty()) path = default_path();
  if (fs::exists(path) && !force) {
    std::fprintf(stderr,
                 "tandem config default: %s already exists; it was left as it is. Edit it, run "
                 "`tandem config` to answer the questions again, or add --force to replace it\n",
                 path.c_str());
    return 1;
  }
  write_config_file(path, to_tandem_yaml(basic_config(local_gpu_count(), mixed_precision)));
  std::printf("tandem configuration saved at %s\n", path.c_str());
  return 0;
}

// `tandem config keys [--json]`: every key the readers accept and what
// tandem does with it (tandem/config/config_keys.h).
int run_keys(int argc, char** argv) {
  CLI::App app{"List every config key tandem reads, per format, and what it does with each: "
               "implemented, warn (accepted with a warning saying what tandem does instead) or "
               "refuse (an error with the fix).",
               "tandem config keys"};
  bool json = false;
  app.add_flag("--json", json, "one JSON array, an object per key and dialect");
  if (auto code = parse_cli(app, argc, argv)) return *code;
  const std::vector<ConfigKeyInfo> keys = config_keys();
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& k : keys) {
      nlohmann::json entry = {{"dialect", k.dialect}, {"key", k.key},
                              {"disposition", k.disposition}, {"note", k.note}};
      if (!k.quiet.empty()) entry["quiet"] = k.quiet;
      if (!k.type.empty()) entry["type"] = k.type;
      out.push_back(std::move(entry));
    }
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  for (const auto& k : keys) {
    std::printf("%-16s %-62s %-11s %s\n", k.dialect.c_str(),
                (k.key + (k.type.empty() ? "" : " (" + k.type + ")")).c_str(),
                k.disposition.c_str(), k.note.c_str());
  }
  return 0;
}

int run_wizard_command(int argc, char** argv) {
  CLI::App app{"Answer a few questions to write the config `tandem launch` and the Accelerator "
               "read.",
               "tandem config"};
  std::string path;
  app.add_option("--config-file", path, "where to write (default: tandem's default config path)");
  app.footer(
      "On a terminal, choose with the arrow keys (or a number) and Enter; otherwise give one "
      "answer per line, an empty line taking the default.\n"
      "\n"
      "Other forms:\n"
      "  tandem config check FILE... [--world-size N]  validate, print the resolved JSON\n"
      "  tandem config keys [--json]                   every key tandem reads, and what it does\n"
      "  tandem config default [--config-file F] [--mixed-precision M] [--force]\n"
      "                                              write a basic config without questions");
  if (auto code = parse_cli(app, argc, argv)) return *code;
  if (path.empty()) path = default_path();

  ConfigWizard wizard(WizardContext{local_gpu_count()});
  run_wizard(wizard, STDIN_FILENO, stdout, ::isatty(STDIN_FILENO) == 1);
  write_config_file(path, to_tandem_yaml(wizard.config()));
  std::printf("tandem configuration saved at %s\n", path.c_str());
  return 0;
}

}  // namespace

int run_config_command(int argc, char** argv) {
  const std::string sub = argc >= 2 ? argv[1] : "";
  if (sub == "check") return run_check(argc - 1, argv + 1);
  if (sub == "default") return run_default(argc - 1, argv + 1);
  if (sub == "keys") return run_keys(argc - 1, argv + 1);
  TANDEM_CHECK_ARG(sub.empty() || sub[0] == '-',
                   "unknown subcommand '{}': use `tandem config` (questions), `tandem config "
                   "check FILE`, `tandem config default` or `tandem config keys`",
                   sub);
  return run_wizard_command(argc, argv);
}

}  // namespace tandem::cli
