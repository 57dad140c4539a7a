// MlflowWriter (tandem/accelerate/mlflow_writer.h): MLflow's REST API 2.0
// over HttpClient. Requests and answers are JSON; an error answer is
// {"error_code": ..., "message": ...}.

#include "tandem/accelerate/mlflow_writer.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/http_client.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

constexpr std::size_t kMetricsPerBatch = 1000;      // MLflow's MAX_METRICS_PER_BATCH
constexpr std::size_t kParamsTagsPerBatch = 100;    // MAX_PARAMS_TAGS_PER_BATCH
constexpr std::size_t kMaxParamLength = 6000;       // MAX_PARAM_VAL_LENGTH
constexpr std::size_t kMaxPendingMetrics = 1000000;  // kept while the server is away

const char* variable(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// A whole number of seconds (or retries) from the environment.
int64_t variable_int(const char* name, int64_t fallback) {
  const char* text = variable(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  TANDEM_CHECK_ARG(end != text && *end == '\0' && value >= 0,
                   "{}='{}' is not a whole number >= 0", name, text);
  return value;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Python's getpass.getuser(): the login variables, then the password file.
std::string user_name() {
  for (const char* name : {"LOGNAME", "USER", "LNAME", "USERNAME"}) {
    if (const char* value = variable(name)) return value;
  }
  const passwd* entry = ::getpwuid(::getuid());
  return entry != nullptr ? entry->pw_name : "";
}

std::string program_path() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, static_cast<std::size_t>(n)) : "";
}

nlohmann::json key_values(const std::map<std::string, std::string>& entries) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, value] : entries) out.push_back({{"key", key}, {"value", value}});
  return out;
}

// The string at `pointer` ("/run/info/run_id") in an answer; "" when the
// answer has none there.
std::string string_at(const nlohmann::json& answer, const char* pointer) {
  const nlohmann::json::json_pointer at(pointer);
  return answer.contains(at) && answer[at].is_string() ? answer[at].get<std::string>() : "";
}

std::string python_repr(const nlohmann::json& value);

// A JSON value as Python's str() writes what json.loads() makes of it, the
// text mlflow.set_tags stores (Accelerate's MLFLOW_TAGS): True/False, None,
// ints as they are, floats as repr() (1.0, 1e-05, 1e+16), lists and dicts
// with their items' repr().
std::string python_str(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::string:
      return value.get<std::string>();
    case nlohmann::json::value_t::boolean:
      return value.get<bool>() ? "True" : "False";
    case nlohmann::json::value_t::null:
      return "None";
    case nlohmann::json::value_t::number_float: {
      std::string text = fmt::format("{}", value.get<double>());
      if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
      return text;
    }
    case nlohmann::json::value_t::array: {
      std::string out = "[";
      for (const auto& item : value) out += (out.size() > 1 ? ", " : "") + python_repr(item);
      return out + "]";
    }
    case nlohmann::json::value_t::object: {
      std::string out = "{";
      for (const auto& [key, item] : value.items()) {
        out += (out.size() > 1 ? ", " : "") + python_repr(key) + ": " + python_repr(item);
      }
      return out + "}";
    }
    default:
      return value.dump();  // integers
  }
}

// repr(): strings quoted as Python quotes them, the rest as str().
std::string python_repr(const nlohmann::json& value) {
  if (!value.is_string()) return python_str(value);
  const std::string text = value.get<std::string>();
  const char quote =
      text.find('\'') != std::string::npos && text.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (char c : text) {
    if (c == '\\' || c == quote) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + quote;
}

bool retryable(int status) {
  return status == 0 || status == 429 || (status >= 500 && status != 501);
}

}  // namespace

MlflowOptions mlflow_options_from_environment(MlflowOptions options) {
  if (const char* uri = variable("MLFLOW_TRACKING_URI")) options.tracking_uri = uri;
  if (const char* name = variable("MLFLOW_EXPERIMENT_NAME")) options.experiment_name = name;
  if (const char* run = variable("MLFLOW_RUN_ID")) options.run_id = run;
  if (const char* tags = variable("MLFLOW_TAGS")) {
    const auto parsed = nlohmann::json::parse(tags, nullptr, /*allow_exceptions=*/false);
    TANDEM_CHECK_ARG(parsed.is_object(),
                     "MLFLOW_TAGS='{}' is not a JSON object; write it as "
                     "MLFLOW_TAGS='{{\"team\": \"nlp\", \"data\": \"v2\"}}'",
                     tags);
    options.tags.clear();
    for (const auto& [key, value] : parsed.items()) {
      options.tags[key] = python_str(value);
    }
  }
  return options;
}

struct MlflowWriter::Impl {
  std::unique_ptr<detail::HttpClient> http;
  std::string uri;
  int64_t max_retries = 7;
  int64_t backoff_s = 2;
  std::string experiment_id;
  std::string run_id;
  std::vector<nlohmann::json> pending;  // metrics not yet sent, oldest first
  bool server_away = false;             // the last log_metrics() did not get through
  bool finished = false;

  // The answer of a request, tried 1 + max_retries times (or once) while the
  // failure is the network's or the server's (429, 5xx).
  detail::HttpResponse send(const std::string& method, const std::string& target,
                            const std::string& body, bool retry) {
    detail::HttpResponse response;
    for (int64_t attempt = 0;; ++attempt) {
      response = http->request(method, target, body);
      if (!retryable(response.status) || !retry || attempt >= max_retries) return response;
      const int64_t wait_s = std::min<int64_t>(120, backoff_s << std::min<int64_t>(attempt, 20));
      std::this_thread::sleep_for(std::chrono::seconds(wait_s));
    }
  }

  // "connection refused" or "RESOURCE_DOES_NOT_EXIST: Run ... (HTTP 404)".
  static std::string describe(const detail::HttpResponse& response) {
    if (response.status == 0) return response.error;
    const auto error = nlohmann::json::parse(response.body, nullptr, false);
    const std::string message = string_at(error, "/message");
    if (!message.empty()) {
      const std::string code = string_at(error, "/error_code");
      return fmt::format("{}: {} (HTTP {})", code.empty() ? "ERROR" : code, message,
                         response.status);
    }
    return fmt::format("HTTP {}: {}", response.status, response.body.substr(0, 300));
  }

  // A request that must succeed: its answer, or UsageError saying `what`.
  nlohmann::json call(const std::string& method, const std::string& target,
                      const nlohmann::json& body, const std::string& what) {
    const auto response = send(method, target, body.is_null() ? "" : body.dump(), true);
    TANDEM_CHECK_ARG(response.status == 200,
                     "MLflow at {}: {} failed: {}{}", uri, what, describe(response),
                     response.status == 0
                         ? ". Check MLFLOW_TRACKING_URI and that the server runs (mlflow "
                           "server --host HOST --port PORT)"
                         : "");
    const auto answer = nlohmann::json::parse(response.body, nullptr, false);
    return answer.is_discarded() ? nlohmann::json::object() : answer;
  }

  std::string find_or_create_experiment(const MlflowOptions& options) {
    const std::string& name = options.experiment_name;
    const auto found = send("GET", "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" +
                                       detail::url_encode(name), "", true);
    if (found.status == 200) {
      const auto answer = nlohmann::json::parse(found.body, nullptr, false);
      const std::string id = string_at(answer, "/experiment/experiment_id");
      TANDEM_CHECK_ARG(string_at(answer, "/experiment/lifecycle_stage") != "deleted",
                       "MLflow at {}: experiment '{}' is deleted; restore it (mlflow "
                       "experiments restore --experiment-id {}) or choose another name",
                       uri, name, id);
      TANDEM_CHECK_ARG(!id.empty(), "MLflow at {}: experiment '{}' came back without an id: {}",
                       uri, name, found.body.substr(0, 300));
      return id;
    }
    TANDEM_CHECK_ARG(found.status == 404, "MLflow at {}: looking up experiment '{}' failed: {}",
                     uri, name, describe(found));
    nlohmann::json create = {{"name", name}};
    if (!options.artifact_location.empty()) create["artifact_location"] = options.artifact_location;
    if (!options.tags.empty()) create["tags"] = key_values(options.tags);
    const auto made = send("POST", "/api/2.0/mlflow/experiments/create", create.dump(), true);
    const auto made_answer = nlohmann::json::parse(made.body, nullptr, false);
    if (made.status == 200 && !string_at(made_answer, "/experiment_id").empty()) {
      return string_at(made_answer, "/experiment_id");
    }
    // Another job made it in between: use that one.
    const auto again = call("GET", "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" +
                                       detail::url_encode(name), nullptr,
                            "creating experiment '" + name + "' (" + describe(made) + ")");
    const std::string id = string_at(again, "/experiment/experiment_id");
    TANDEM_CHECK_ARG(!id.empty(), "MLflow at {}: creating experiment '{}' failed: {}", uri, name,
                     describe(made));
    return id;
  }

  // Sends the pending metrics in batches, each tried once (or with retries):
  // true when all went. UsageError, dropping the batch, when the server
  // refuses one.
  bool flush(bool retry, std::string& why) {
    while (!pending.empty()) {
      const std::size_t n = std::min(pending.size(), kMetricsPerBatch);
      nlohmann::json batch = {{"run_id", run_id}, {"metrics", nlohmann::json::array()}};
      for (std::size_t i = 0; i < n; ++i) batch["metrics"].push_back(pending[i]);
      const auto response = send("POST", "/api/2.0/mlflow/runs/log-batch", batch.dump(), retry);
      if (response.status != 200 && retryable(response.status)) {
        why = describe(response);
        return false;
      }
      pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(n));
      TANDEM_CHECK_ARG(response.status == 200, "MLflow at {}: run {} refused {} metric(s): {}",
                       uri, run_id, n, describe(response));
    }
    return true;
  }

  // log-batch of params or tags, 100 per request.
  void log_entries(const char* field, const std::map<std::string, std::string>& entries) {
    auto it = entries.begin();
    while (it != entries.end()) {
      std::map<std::string, std::string> chunk;
      for (; it != entries.end() && chunk.size() < kParamsTagsPerBatch; ++it) chunk.insert(*it);
      call("POST", "/api/2.0/mlflow/runs/log-batch", {{"run_id", run_id}, {field, key_values(chunk)}},
           fmt::format("logging {} {} to run {}", chunk.size(), field, run_id));
    }
  }

  void end(const std::string& status, bool retry) {
    finished = true;
    std::string why;
    if (!flush(retry, why)) {
      TANDEM_THROW(UsageError, "MLflow at {}: {} metric(s) of run {} could not be sent: {}", uri,
                   pending.size(), run_id, why);
    }
    const nlohmann::json body = {{"run_id", run_id}, {"status", status}, {"end_time", now_ms()}};
    const auto response = send("POST", "/api/2.0/mlflow/runs/update", body.dump(), retry);
    TANDEM_CHECK_ARG(response.status == 200, "MLflow at {}: ending run {} as {} failed: {}", uri,
                     run_id, status, describe(response));
  }
};

MlflowWriter::MlflowWriter(MlflowOptions options) : impl_(std::make_unique<Impl>()) {
  options = mlflow_options_from_environment(std::move(options));
  TANDEM_CHECK_ARG(!options.tracking_uri.empty(),
                   "MlflowWriter: no tracking server. Set MLFLOW_TRACKING_URI=http://HOST:PORT "
                   "(or MlflowOptions::tracking_uri) to a running `mlflow server`");
  const auto url = detail::HttpUrl::parse(options.tracking_uri, "MLFLOW_TRACKING_URI");
  impl_->uri = url.text();
  detail::HttpClient::Headers headers;
  if (const char* token = variable("MLFLOW_TRACKING_TOKEN")) {
    headers.emplace_back("Authorization", std::string("Bearer ") + token);
  } else if (const char* user = variable("MLFLOW_TRACKING_USERNAME")) {
    const char* password = variable("MLFLOW_TRACKING_PASSWORD");
    headers.emplace_back("Authorization",
                         "Basic " + detail::base64_encode(std::string(user) + ":" +
                                                          (password ? password : "")));
  }
  const int64_t timeout_s = variable_int("MLFLOW_HTTP_REQUEST_TIMEOUT", 120);
  impl_->max_retries = variable_int("MLFLOW_HTTP_REQUEST_MAX_RETRIES", 7);
  impl_->backoff_s = variable_int("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", 2);
  impl_->http = std::make_unique<detail::HttpClient>(
      url, std::move(headers), std::chrono::seconds(std::max<int64_t>(1, timeout_s)));

  if (!options.run_id.empty()) {
    // Resume it, as mlflow.start_run(run_id=...): RUNNING again, its tags set.
    const auto run = impl_->call("GET", "/api/2.0/mlflow/runs/get?run_id=" +
                                            detail::url_encode(options.run_id), nullptr,
                                 "finding run '" + options.run_id + "' (MLFLOW_RUN_ID)");
    impl_->run_id = options.run_id;
    impl_->experiment_id = string_at(run, "/run/info/experiment_id");
    impl_->call("POST", "/api/2.0/mlflow/runs/update",
                {{"run_id", impl_->run_id}, {"status", "RUNNING"}},
                "setting run " + impl_->run_id + " RUNNING");
    auto tags = options.tags;
    if (!options.description.empty()) tags["mlflow.note.content"] = options.description;
    if (!tags.empty()) impl_->log_entries("tags", tags);
    return;
  }
  if (!options.experiment_name.empty()) {
    impl_->experiment_id = impl_->find_or_create_experiment(options);
  } else if (const char* id = variable("MLFLOW_EXPERIMENT_ID")) {
    impl_->experiment_id = id;
  } else {
    impl_->experiment_id = "0";  // MLflow's Default experiment
  }
  auto tags = options.tags;
  tags.emplace("mlflow.user", user_name());
  tags.emplace("mlflow.source.name", program_path());
  tags.emplace("mlflow.source.type", "LOCAL");
  if (!options.description.empty()) tags["mlflow.note.content"] = options.description;
  nlohmann::json create = {{"experiment_id", impl_->experiment_id},
                           {"start_time", now_ms()},
                           {"tags", key_values(tags)}};
  if (!options.run_name.empty()) create["run_name"] = options.run_name;
  const auto made = impl_->call("POST", "/api/2.0/mlflow/runs/create", create,
                                "creating a run in experiment " + impl_->experiment_id);
  impl_->run_id = string_at(made, "/run/info/run_id");
  TANDEM_CHECK_ARG(!impl_->run_id.empty(), "MLflow at {}: runs/create gave no run id: {}",
                   impl_->uri, made.dump());
}

MlflowWriter::~MlflowWriter() {
  if (!impl_ || impl_->finished) return;
  const std::string status = std::uncaught_exceptions() > 0 ? "FAILED" : "FINISHED";
  try {
    impl_->end(status, /*retry=*/false);
  } catch (const std::exception& e) {
    log_warn("{}", e.what());
  }
}

void MlflowWriter::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  if (impl_->finished) return;
  const int64_t stamp = now_ms();
  for (const auto& [key, value] : metrics) {
    nlohmann::json entry = {{"key", key}, {"timestamp", stamp}, {"step", step}};
    // Protobuf's JSON spelling of the doubles JSON has no number for.
    if (std::isnan(value)) {
      entry["value"] = "NaN";
    } else if (std::isinf(value)) {
      entry["value"] = value > 0 ? "Infinity" : "-Infinity";
    } else {
      entry["value"] = value;
    }
    impl_->pending.push_back(std::move(entry));
  }
  if (impl_->pending.size() > kMaxPendingMetrics) {
    const std::size_t dropped = impl_->pending.size() - kMaxPendingMetrics;
    impl_->pending.erase(impl_->pending.begin(),
                         impl_->pending.begin() + static_cast<std::ptrdiff_t>(dropped));
    log_warn("MLflow at {}: dropped the {} oldest unsent metrics (more than {} wait)", impl_->uri,
             dropped, kMaxPendingMetrics);
  }
  const std::size_t waiting = impl_->pending.size();
  std::string why;
  if (impl_->flush(/*retry=*/false, why)) {
    if (impl_->server_away) {
      log_info("MLflow at {} answers again: sent {} metric(s) that waited", impl_->uri, waiting);
    }
    impl_->server_away = false;
    return;
  }
  if (!impl_->server_away) {
    log_warn("MLflow at {} did not take the metrics of step {} ({}); training goes on, and they "
             "wait ({} now) for the next log() or end_training()",
             impl_->uri, step, why, impl_->pending.size());
  }
  impl_->server_away = true;
}

void MlflowWriter::log_params(const std::map<std::string, std::string>& params) {
  std::map<std::string, std::string> kept;
  for (const auto& [key, value] : params) {
    if (value.size() > kMaxParamLength) {
      log_warn("MLflow: parameter '{}' is {} characters, over MLflow's {}; it is not logged", key,
               value.size(), kMaxParamLength);
    } else {
      kept.emplace(key, value);
    }
  }
  if (!impl_->finished) impl_->log_entries("params", kept);
}

void MlflowWriter::set_tags(const std::map<std::string, std::string>& tags) {
  if (!impl_->finished) impl_->log_entries("tags", tags);
}

void MlflowWriter::finish(const std::string& status) {
  TANDEM_CHECK_ARG(status == "FINISHED" || status == "FAILED" || status == "KILLED",
                   "MlflowWriter::finish: status '{}' is not FINISHED, FAILED or KILLED", status);
  if (!impl_->finished) impl_->end(status, /*retry=*/true);
}

const std::string& MlflowWriter::tracking_uri() const { return impl_->uri; }
const std::string& MlflowWriter::experiment_id() const { return impl_->experiment_id; }
const std::string& MlflowWriter::run_id() const { return impl_->run_id; }
int64_t MlflowWriter::pending_metrics() const {
  return static_cast<int64_t>(impl_->pending.size());
}

}  // namespace tandem
