#include "tandem/core/error_file.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <typeinfo>

#include <nlohmann/json.hpp>

#include "tandem/core/file_system.h"
#include "tandem/core/rank_env.h"

namespace tandem {
namespace {

struct Installed {
  std::mutex mutex;
  std::string path;
  RankEnv env;
  std::terminate_handler previous = nullptr;
};

Installed& installed() {
  static Installed* state = new Installed();  // outlives static destruction
  return *state;
}

double now_epoch_s() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

std::string type_name(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name != nullptr ? name : type.name();
  std::free(name);
  return out;
}

// Writes next to `path`, then renames: a reader never sees half a file.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const bool written = fs::write_all(fd, text.data(), text.size()) == 0;
  ::close(fd);
  if (written) ::rename(tmp.c_str(), path.c_str());
}

void write_record(const std::string& type, const std::string& message) {
  Installed& state = installed();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.path.empty()) return;
  ErrorRecord record;
  record.rank = state.env.rank;
  record.local_rank = state.env.local_rank;
  record.restart_count = state.env.restart_count;
  record.host = host_name();
  record.pid = static_cast<int>(::getpid());
  record.type = type;
  record.message = message;
  record.time = now_epoch_s();
  write_atomically(state.path, to_json(record) + "\n");
}

[[noreturn]] void on_terminate() {
  static std::atomic<bool> entered{false};
  if (!entered.exchange(true)) {
    std::string type = "std::terminate";
    std::string message = "std::terminate was called without an active exception";
    if (std::exception_ptr current = std::current_exception()) {
      try {
        std::rethrow_exception(current);
      } catch (const std::exception& e) {
        type = type_name(typeid(e));
        message = e.what();
      } catch (...) {
        type = "unknown";
        message = "an exception of a type not derived from std::exception";
      }
    }
    write_record(type, message);
  }
  std::terminate_handler previous = installed().previous;
  if (previous != nullptr) previous();  // prints the exception, then aborts
  std::abort();
}

}  // namespace

std::string to_json(const ErrorRecord& record) {
  nlohmann::json j = {{"rank", record.rank},
                      {"local_rank", record.local_rank},
                      {"restart_count", record.restart_count},
                      {"host", record.host},
                      {"pid", record.pid},
                      {"type", record.type},
                      {"message", record.message},
                      {"time", record.time}};
  if (record.exit_code >= 0) j["exit_code"] = record.exit_code;
  if (record.signal != 0) j["signal"] = record.signal;
  // Invalid UTF-8 in a message must not lose the record.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<ErrorRecord> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  ErrorRecord record;
  auto number = [&](const nlohmann::json& obj, const char* key, auto fallback) {
    auto it = obj.find(key);
    return it != obj.end() && it->is_number() ? it->template get<decltype(fallback)>() : fallback;
  };
  auto text_of = [&](const nlohmann::json& obj, const char* key) {
    auto it = obj.find(key);
    return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto message = j.find("message");
  if (message != j.end() && message->is_object()) {  // torchelastic's @record
    record.type = "python";
    record.message = text_of(*message, "message");
    auto extra = message->find("extraInfo");
    if (extra != message->end() && extra->is_object()) {
      std::string stamp = text_of(*extra, "timestamp");
      record.time = stamp.empty() ? 0 : std::atof(stamp.c_str());
    }
    return record;
  }
  record.rank = number(j, "rank", -1);
  record.local_rank = number(j, "local_rank", -1);
  record.restart_count = number(j, "restart_count", 0);
  record.host = text_of(j, "host");
  record.pid = number(j, "pid", 0);
  record.type = text_of(j, "type");
  record.message = text_of(j, "message");
  record.time = number(j, "time", 0.0);
  record.exit_code = number(j, "exit_code", -1);
  record.signal = number(j, "signal", 0);
  return record;
}

void record_error(const std::exception& error) {
  try {
    write_record(type_name(typeid(error)), error.what());
  } catch (...) {
    // Reporting must never become the failure.
  }
}

namespace detail {

void install_error_file_handler(const RankEnv& env) {
  if (env.error_file.empty()) return;
  Installed& state = installed();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.path = env.error_file;
  state.env = env;
  if (state.previous == nullptr) {
    state.previous = std::set_terminate(on_terminate);
    if (state.previous == on_terminate) state.previous = nullptr;
  }
}

}  // namespace detail
}  // namespace tandem
