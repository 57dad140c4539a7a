// MlflowWriter and log_with "mlflow": MLflow's REST calls as a loopback
// server sees them (a fake one in a thread: the request sequence, chunked
// answers, a server that is away and comes back, refusals), the errors for
// what cannot work, and (MlflowInterop, CI only) a run written by tandem's
// Accelerator at 2 ranks next to one written by Accelerate's MLflowTracker
// on a real `mlflow server`, read back by MLflow's own client.

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/http_client.h"
#include "support/log_capture.h"
#include "support/reserved_port.h"
#include "support/scoped_env.h"
#include "support/scratch_dir.h"
#include "support/subprocess.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/mlflow_writer.h"
#include "tandem/core/error.h"

namespace tandem {
namespace mlflow_writer_test {
namespace {

using testing::ReservedPort;
using testing::run_ranks;
using testing::ScratchDir;

// The MLFLOW_* variables unset for one test (and restored after it).
class MlflowEnv : public testing::ScopedEnv {
 public:
  MlflowEnv() {
    for (const char* name : {"MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID",
                             "MLFLOW_RUN_ID", "MLFLOW_TAGS", "MLFLOW_TRACKING_TOKEN",
                             "MLFLOW_TRACKING_USERNAME", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"}) {
      set(name, nullptr);
    }
  }
};

struct Request {
  std::string method, target;
  nlohmann::json body;
};

// A loopback HTTP/1.1 server on a thread, one keep-alive connection at a
// time: each request gets handler(request) = {status, JSON body}, sent with
// a Content-Length or, with `chunked`, as two chunks.
class FakeMlflowServer {
 public:
  using Handler = std::function<std::pair<int, nlohmann::json>(const Request&)>;
  FakeMlflowServer(Handler handler, bool chunked) : handler_(std::move(handler)), chunked_(chunked) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 4) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        ::pipe2(stop_, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "the fake server cannot listen";
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeMlflowServer() {
    if (thread_.joinable()) {
      (void)!::write(stop_[1], "x", 1);
      thread_.join();
    }
    ::close(listen_fd_);
    ::close(stop_[0]);
    ::close(stop_[1]);
  }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }
  // The requests to `target` only.
  std::vector<Request> requests_to(const std::string& target) {
    std::vector<Request> out;
    for (auto& r : requests()) {
      if (r.target.rfind(target, 0) == 0) out.push_back(r);
    }
    return out;
  }

 private:
  // Waits for `fd` (or the stop pipe): false when told to stop.
  bool wait_readable(int fd) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_[0], POLLIN, 0}};
    while (::poll(fds, 2, -1) < 0) {
    }
    return (fds[1].revents & POLLIN) == 0;
  }
  void serve() {
    while (wait_readable(listen_fd_)) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::string data;
      while (serve_one(fd, data)) {
      }
      ::close(fd);
    }
  }
  // One request from `fd` (bytes already read in `data`); false when the
  // client closed the connection or the server stops.
  bool serve_one(int fd, std::string& data) {
    char buffer[8192];
    auto read_more = [&] {
      if (!wait_readable(fd)) return false;
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) return false;
      data.append(buffer, static_cast<std::size_t>(n));
      return true;
    };
    std::size_t end;
    while ((end = data.find("\r\n\r\n")) == std::string::npos) {
      if (!read_more()) return false;
    }
    const std::string head = data.substr(0, end);
    std::size_t length = 0;
    const auto at = head.find("Content-Length: ");
    if (at != std::string::npos) length = std::stoul(head.substr(at + 16));
    while (data.size() < end + 4 + length) {
      if (!read_more()) return false;
    }
    Request request;
    const auto space = head.find(' ');
    request.method = head.substr(0, space);
    request.target = head.substr(space + 1, head.find(' ', space + 1) - space - 1);
    const std::string body = data.substr(end + 4, length);
    request.body = body.empty() ? nlohmann::json() : nlohmann::json::parse(body);
    data.erase(0, end + 4 + length);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requests_.push_back(request);
    }
    const auto [status, answer] = handler_(request);
    const std::string text = answer.dump();
    std::string reply = "HTTP/1.1 " + std::to_string(status) + " X\r\n" +
                        "Content-Type: application/json\r\n";
    if (chunked_) {
      const std::size_t half = text.size() / 2;
      reply += "Transfer-Encoding: chunked\r\n\r\n";
      for (const std::string& part : {text.substr(0, half), text.substr(half)}) {
        reply += fmt::format("{:x}\r\n{}\r\n", part.size(), part);
      }
      reply += "0\r\n\r\n";
    } else {
      reply += "Content-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
    }
    return ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(reply.size());
  }

  Handler handler_;
  bool chunked_;
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<Request> requests_;
};

// MLflow's answers to the calls MlflowWriter makes: experiment "exp" does
// not exist until created (id "7"), runs are "run-1", "run-2", ...
// `log_batch` answers runs/log-batch (default: 200 {}).
FakeMlflowServer::Handler mlflow_answers(
    std::function<std::pair<int, nlohmann::json>(const Request&)> log_batch = nullptr) {
  auto runs = std::make_shared<int>(0);
  return [runs, log_batch](const Request& r) -> std::pair<int, nlohmann::json> {
    if (r.target.rfind("/api/2.0/mlflow/experiments/get-by-name", 0) == 0) {
      return {404, {{"error_code", "RESOURCE_DOES_NOT_EXIST"}, {"message", "no such"}}};
    }
    if (r.target == "/api/2.0/mlflow/experiments/create") return {200, {{"experiment_id", "7"}}};
    if (r.target == "/api/2.0/mlflow/runs/create") {
      return {200, {{"run", {{"info", {{"run_id", "run-" + std::to_string(++*runs)}}}}}}};
    }
    if (r.target.rfind("/api/2.0/mlflow/runs/get?run_id=", 0) == 0) {
      return {200, {{"run", {{"info", {{"run_id", r.target.substr(32)}, {"experiment_id", "7"}}}}}}};
    }
    if (r.target == "/api/2.0/mlflow/runs/log-batch" && log_batch) return log_batch(r);
    return {200, nlohmann::json::object()};
  };
}

template <typename Fn>
std::string usage_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(MlflowWriter, SendsMlflowsRestCallsInOrderWithChunkedAnswersToo) {
  for (bool chunked : {false, true}) {
    SCOPED_TRACE(chunked ? "chunked answers" : "Content-Length answers");
    MlflowEnv env;
    FakeMlflowServer server(mlflow_answers(), chunked);
    env.set("MLFLOW_TAGS", R"({"team": "nlp", "round": 2})");
    MlflowOptions options;
    options.tracking_uri = server.uri() + "/";
    options.experiment_name = "exp";
    options.run_name = "first";
    options.description = "a test run";
    {
      MlflowWriter run(options);
      EXPECT_EQ(run.experiment_id(), "7");
      EXPECT_EQ(run.run_id(), "run-1");
      std::map<std::string, std::string> params;
      for (int i = 0; i < 150; ++i) params[fmt::format("p{:03}", i)] = std::to_string(i);
      params["too_long"] = std::string(6001, 'x');  // over MLflow's limit: left out
      run.log_params(params);
      run.log_metrics({{"loss", 0.25},
                       {"nan", std::nan("")},
                       {"inf", HUGE_VAL},
                       {"-inf", -HUGE_VAL}},
                      3);
      EXPECT_EQ(run.pending_metrics(), 0);
    }  // finished by the destructor
    const auto requests = server.requests();
    ASSERT_EQ(requests.size(), 7u);
    EXPECT_EQ(requests[0].method, "GET");
    EXPECT_EQ(requests[0].target, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=exp");
    EXPECT_EQ(requests[1].target, "/api/2.0/mlflow/experiments/create");
    EXPECT_EQ(requests[1].body["name"], "exp");
    EXPECT_EQ(requests[2].target, "/api/2.0/mlflow/runs/create");
    const auto& create = requests[2].body;
    EXPECT_EQ(create["experiment_id"], "7");
    EXPECT_EQ(create["run_name"], "first");
    std::map<std::string, std::string> tags;
    for (const auto& t : create["tags"]) tags[t["key"]] = t["value"];
    EXPECT_EQ(tags["team"], "nlp");
    EXPECT_EQ(tags["round"], "2");  // MLFLOW_TAGS' numbers as text
    EXPECT_EQ(tags["mlflow.note.content"], "a test run");
    EXPECT_EQ(tags["mlflow.source.type"], "LOCAL");
    EXPECT_TRUE(tags.count("mlflow.user"));
    // 150 params in batches of 100.
    EXPECT_EQ(requests[3].body["params"].size(), 100u);
    EXPECT_EQ(requests[4].body["params"].size(), 50u);
    EXPECT_EQ(requests[4].body["run_id"], "run-1");
    const auto& metrics = requests[5].body["metrics"];
    ASSERT_EQ(metrics.size(), 4u);
    std::map<std::string, nlohmann::json> values;
    for (const auto& m : metrics) {
      EXPECT_EQ(m["step"], 3);
      EXPECT_GT(m["timestamp"].get<int64_t>(), 1700000000000);
      values[m["key"]] = m["value"];
    }
    EXPECT_EQ(values["loss"], 0.25);
    EXPECT_EQ(values["nan"], "NaN");
    EXPECT_EQ(values["inf"], "Infinity");
    EXPECT_EQ(values["-inf"], "-Infinity");
    EXPECT_EQ(requests[6].target, "/api/2.0/mlflow/runs/update");
    EXPECT_EQ(requests[6].body["status"], "FINISHED");
    EXPECT_EQ(requests[6].body["run_id"], "run-1");
  }
}

TEST(MlflowWriter, MetricsWaitWhileTheServerIsAwayAndAllArriveInOrder) {
  MlflowEnv env;
  std::atomic<bool> away{false};
  FakeMlflowServer server(mlflow_answers([&](const Request&) -> std::pair<int, nlohmann::json> {
                            if (away) return {503, {{"message", "busy"}}};
                            return {200, nlohmann::json::object()};
                          }),
                          false);
  MlflowOptions options;
  options.tracking_uri = server.uri();
  MlflowWriter run(options);
  EXPECT_EQ(run.experiment_id(), "0");  // no experiment named: MLflow's Default
  run.log_metrics({{"loss", 1.0}}, 1);
  away = true;
  run.log_metrics({{"loss", 2.0}}, 2);  // tried once, kept: training is not held
  run.log_metrics({{"loss", 3.0}, {"lr", 0.5}}, 3);
  EXPECT_EQ(run.pending_metrics(), 3);
  away = false;
  run.log_metrics({{"loss", 4.0}}, 4);
  EXPECT_EQ(run.pending_metrics(), 0);
  run.finish("KILLED");
  std::vector<std::pair<int64_t, double>> delivered;
  for (const auto& r : server.requests_to("/api/2.0/mlflow/runs/log-batch")) {
    if (r.body.contains("metrics")) {
      for (const auto& m : r.body["metrics"]) {
        if (m["key"] == "loss") delivered.emplace_back(m["step"], m["value"]);
      }
    }
  }
  // Each failed attempt sent them too; the server kept only those it took.
  const std::vector<std::pair<int64_t, double>> expected = {{1, 1.0}, {2, 2.0}, {2, 2.0},
                                                            {3, 3.0}, {2, 2.0}, {3, 3.0},
                                                            {4, 4.0}};
  EXPECT_EQ(delivered, expected);
  const auto updates = server.requests_to("/api/2.0/mlflow/runs/update");
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].body["status"], "KILLED");
  run.log_metrics({{"loss", 5.0}}, 5);  // after finish: nothing is sent
  EXPECT_EQ(server.requests_to("/api/2.0/mlflow/runs/log-batch").size(), 4u);
}

TEST(MlflowWriter, ARefusalIsAUsageErrorWithTheServersMessage) {
  MlflowEnv env;
  FakeMlflowServer server(mlflow_answers([](const Request&) -> std::pair<int, nlohmann::json> {
                            return {400,
                                    {{"error_code", "INVALID_PARAMETER_VALUE"},
                                     {"message", "Names may only contain alphanumerics"}}};
                          }),
                          false);
  MlflowOptions options;
  options.tracking_uri = server.uri();
  MlflowWriter run(options);
  const std::string error = usage_error_of([&] { run.log_metrics({{"bad key!", 1.0}}, 1); });
  EXPECT_TRUE(has(error, "refused 1 metric(s): INVALID_PARAMETER_VALUE: Names may only contain "
                         "alphanumerics (HTTP 400)"))
      << error;
  EXPECT_EQ(run.pending_metrics(), 0);  // not kept to fail again
  EXPECT_TRUE(has(usage_error_of([&] { run.log_params({{"p", "2"}}); }),
                  "logging 1 params to run run-1 failed: INVALID_PARAMETER_VALUE"));
}

TEST(MlflowWriter, ARunEndsFailedWhenAnExceptionUnwindsAndResumesByRunId) {
  MlflowEnv env;
  FakeMlflowServer server(mlflow_answers(), false);
  MlflowOptions options;
  options.tracking_uri = server.uri();
  try {
    MlflowWriter run(options);
    throw std::runtime_error("training failed");
  } catch (const std::runtime_error&) {
  }
  env.set("MLFLOW_RUN_ID", "run-1");
  options.tags = {{"resumed", "yes"}};
  {
    MlflowWriter resumed(options);
    EXPECT_EQ(resumed.run_id(), "run-1");
  }
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 6u);
  EXPECT_EQ(requests[1].body["status"], "FAILED");
  EXPECT_EQ(requests[2].method, "GET");
  EXPECT_EQ(requests[2].target, "/api/2.0/mlflow/runs/get?run_id=run-1");
  EXPECT_EQ(requests[3].body["status"], "RUNNING");
  EXPECT_EQ(requests[4].body["tags"][0]["key"], "resumed");
  EXPECT_EQ(requests[5].body["status"], "FINISHED");
}

TEST(MlflowWriter, WhatCannotWorkIsRefusedSayingHowToFixIt) {
  MlflowEnv env;
  EXPECT_TRUE(has(usage_error_of([] { MlflowWriter run(MlflowOptions{}); }),
                  "no tracking server. Set MLFLOW_TRACKING_URI=http://HOST:PORT"));
  MlflowOptions options;
  options.tracking_uri = "https://mlflow.example.com";
  EXPECT_TRUE(has(usage_error_of([&] { MlflowWriter run(options); }), "has no TLS"));
  options.tracking_uri = "sqlite:///mlflow.db";
  EXPECT_TRUE(has(usage_error_of([&] { MlflowWriter run(options); }),
                  "MLFLOW_TRACKING_URI 'sqlite:///mlflow.db' is not an http:// URL"));
  options.tracking_uri = "http://127.0.0.1:99999";
  EXPECT_TRUE(has(usage_error_of([&] { MlflowWriter run(options); }),
                  "port '99999' is not a number from 1 to 65535"));
  env.set("MLFLOW_TAGS", "team=nlp");
  EXPECT_TRUE(has(usage_error_of([&] { MlflowWriter run(options); }),
                  "MLFLOW_TAGS='team=nlp' is not a JSON object"));
  env.set("MLFLOW_TAGS", nullptr);
  // Nobody listens on a reserved port.
  ReservedPort port(false);
  env.set("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0");
  options.tracking_uri = "http://127.0.0.1:" + std::to_string(port.port());
  const std::string error = usage_error_of([&] { MlflowWriter run(options); });
  EXPECT_TRUE(has(error, "Connection refused")) << error;
  EXPECT_TRUE(has(error, "Check MLFLOW_TRACKING_URI and that the server runs")) << error;
  // log_with "mlflow" stops the Accelerator on every rank, before training.
  AcceleratorOptions accelerator_options;
  accelerator_options.log_with = {"mlflow"};
  EXPECT_TRUE(has(usage_error_of([&] { Accelerator accelerator(accelerator_options); }),
                  "log_with \"mlflow\" needs a tracking server"));
  // "all" leaves MLflow out when no server is named.
  accelerator_options.log_with = {"all"};
  EXPECT_NO_THROW(Accelerator accelerator(accelerator_options));
}

// With log_with "mlflow" and no experiment named, init_trackers' file stem
// names it (up to the last dot, "gpt.v2.jsonl": gpt.v2); a file name
// without a stem goes to MLflow's Default experiment with a warning that
// says how to name one.
TEST(MlflowWriter, InitTrackersNamesTheExperimentAfterTheFilesStemAndWarnsWithoutOne) {
  MlflowEnv env;
  ScratchDir dir;
  FakeMlflowServer server(mlflow_answers(), false);
  env.set("MLFLOW_TRACKING_URI", server.uri().c_str());
  AcceleratorOptions options;
  options.log_with = {"mlflow"};
  const std::string log = testing::info_log_of([&] {
    for (const char* file : {"gpt.v2.jsonl", ".jsonl"}) {
      Accelerator accelerator(options);
      accelerator.init_trackers(dir / file);
      accelerator.end_training();
    }
  });
  const auto lookups = server.requests_to("/api/2.0/mlflow/experiments/get-by-name");
  ASSERT_EQ(lookups.size(), 1u);
  EXPECT_EQ(lookups[0].target, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=gpt.v2");
  const auto runs = server.requests_to("/api/2.0/mlflow/runs/create");
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].body["experiment_id"], "7");
  EXPECT_EQ(runs[1].body["experiment_id"], "0");
  EXPECT_TRUE(has(log, "init_trackers(\"" + dir / ".jsonl" +
                           "\"): the file name has no stem to name the MLflow experiment"))
      << log;
  EXPECT_TRUE(has(log, "set AcceleratorOptions::mlflow.experiment_name or MLFLOW_EXPERIMENT_NAME"))
      << log;
}

TEST(MlflowWriter, HttpHelpersEncodeAsTheRfcsSay) {
  EXPECT_EQ(detail::url_encode("my exp/1&x=é"), "my%20exp%2F1%26x%3D%C3%A9");
  EXPECT_EQ(detail::base64_encode("user:pass"), "dXNlcjpwYXNz");
  EXPECT_EQ(detail::base64_encode("ab"), "YWI=");
  EXPECT_EQ(detail::base64_encode("a"), "YQ==");
  EXPECT_EQ(detail::HttpUrl::parse("http://[::1]:8080/mlflow/", "URI").text(),
            "http://[::1]:8080/mlflow");
  EXPECT_EQ(detail::HttpUrl::parse("http://tracker", "URI").text(), "http://tracker:80");
}

// ---- Against a real MLflow server and Accelerate's MLflowTracker (CI) -------

// tests/accelerate/mlflow_reference.py `args` under the peer Python: its
// exit code, and its stdout and stderr in `output`.
int run_mlflow_reference(const std::string& args, std::string& output) {
  return testing::run_shell_capture(std::string(TANDEM_PEER_PYTHON) + " " + TANDEM_SOURCE_DIR +
                                        "/tests/accelerate/mlflow_reference.py " + args + " 2>&1",
                                    output);
}

bool peer_has_mlflow() {  // asked once per process: the imports take seconds
  static const bool has = [] {
    const std::string command =
        std::string(TANDEM_PEER_PYTHON) + " -c 'import mlflow, accelerate'";
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }();
  return has;
}

// `mlflow server` on a reserved loopback port with a SQLite store in `dir`,
// in its own process group (uvicorn's worker with it), ended as a group.
// Without its job runner, which would start huey consumers and leave a
// folder in /dev/shm.
class MlflowServer {
 public:
  explicit MlflowServer(const std::string& dir) : dir_(dir) {
    {
      ReservedPort reserved(true);
      port_ = reserved.port();
    }
    const std::string mlflow = std::string(TANDEM_PEER_PYTHON);
    const std::string bin = mlflow.substr(0, mlflow.rfind('/')) + "/mlflow";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false", 1);
      const std::string log = dir + "/server.log";
      std::freopen(log.c_str(), "w", stdout);
      std::freopen(log.c_str(), "a", stderr);
      ::execl(bin.c_str(), bin.c_str(), "server", "--host", "127.0.0.1", "--port",
              std::to_string(port_).c_str(), "--workers", "1", "--backend-store-uri",
              ("sqlite:///" + dir + "/mlflow.db").c_str(), "--default-artifact-root",
              (dir + "/artifacts").c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
  }
  ~MlflowServer() {
    ::kill(-pid_, SIGTERM);
    if (!testing::wait_for_exit(pid_, 20)) ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    ::kill(-pid_, SIGKILL);  // any worker left behind
  }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Waits until /health answers (the server imports for about 15 s): woken
  // by each write to its log in `dir_` (uvicorn says when it listens), not
  // by a clock.
  bool wait_ready(double timeout_s) {
    detail::HttpClient http(detail::HttpUrl::parse(uri(), "uri"), {}, std::chrono::seconds(2));
    bool ready = false;
    testing::wait_for_files(
        dir_,
        [&] {
          const bool listening =
              testing::read_file(dir_ + "/server.log").find("Uvicorn running on") !=
              std::string::npos;
          ready = listening && http.request("GET", "/health").status == 200;
          return ready || !testing::process_alive(pid_);
        },
        timeout_s);
    return ready;
  }

 private:
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

TEST(MlflowInterop, AnAcceleratorRunAtTwoRanksReadsBackLikeAccelerates) {
  if (!peer_has_mlflow()) GTEST_SKIP() << "no mlflow or accelerate in " << TANDEM_PEER_PYTHON;
  MlflowEnv env;
  ScratchDir dir;
  MlflowServer server(dir.path());
  ASSERT_TRUE(server.wait_ready(120)) << testing::read_file(dir / "server.log");
  env.set("MLFLOW_TRACKING_URI", server.uri().c_str());
  env.set("MLFLOW_TAGS", R"({"team": "nlp"})");
  // Accelerate's tracker, through accelerate's Accelerator.
  std::string output;
  ASSERT_EQ(run_mlflow_reference("accelerate '" + server.uri() + "' python", output),
            0)
      << output;
  // tandem's, at 2 ranks: the main process writes, the other sends nothing.
  run_ranks(2, [&](ProcessGroup& pg) {
    AcceleratorOptions options;
    options.log_with = {"mlflow"};
    options.mlflow.run_name = "tandem";
    options.mlflow.description = "the reference run";
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
    // Experiment "tracking": the file's stem, as Accelerate's project_name.
    accelerator.init_trackers(dir / "tracking.jsonl", {{"lr", 3e-4},
                                                       {"batch_size", 64},
                                                       {"optimizer", "adamw"},
                                                       {"amp", true}});
    for (int step = 0; step < 5; ++step) {
      accelerator.log({{"loss", 1.0 / (step + 1)}, {"lr", 3e-4 * step}}, step);
    }
    accelerator.log({{"nan_metric", std::nan("")}}, 5);
    auto* writer = accelerator.get_tracker<MlflowWriter>("mlflow");
    EXPECT_EQ(writer != nullptr, accelerator.is_main_process());
    accelerator.end_training();
  });
  output.clear();
  ASSERT_EQ(run_mlflow_reference("dump '" + server.uri() + "'", output),
            0)
      << output;
  const auto runs = nlohmann::json::parse(output.substr(output.rfind("\n{") + 1));
  ASSERT_TRUE(runs.contains("python") && runs.contains("tandem")) << output;
  const auto& python = runs["python"];
  const auto& tandem = runs["tandem"];
  EXPECT_EQ(tandem["experiment"], "tracking");
  EXPECT_EQ(tandem["experiment"], python["experiment"]);
  EXPECT_EQ(tandem["status"], "FINISHED");
  EXPECT_EQ(tandem["status"], python["status"]);
  // What Accelerate wrote is all there, so that the comparisons below are not
  // of empty runs.
  EXPECT_EQ(python["params"]["lr"], "0.0003");
  EXPECT_EQ(python["params"]["amp"], "True");
  EXPECT_EQ(python["metrics"]["loss"].size(), 5u);
  EXPECT_EQ(python["metrics"]["nan_metric"], nlohmann::json::parse(R"([[5, "nan"]])"));
  EXPECT_EQ(python["tags"]["team"], "nlp");
  EXPECT_EQ(python["tags"]["mlflow.note.content"], "the reference run");
  EXPECT_EQ(tandem["params"], python["params"]) << output;
  EXPECT_EQ(tandem["metrics"], python["metrics"]) << output;
  EXPECT_EQ(tandem["tags"], python["tags"]) << output;
}

}  // namespace
}  // namespace mlflow_writer_test
}  // namespace tandem
