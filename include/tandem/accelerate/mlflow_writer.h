#pragma once
// MlflowWriter: one run on an MLflow tracking server, written through
// MLflow's REST API (experiments get-by-name/create, runs create/update/
// log-batch): what Python's mlflow client sends for Accelerate's
// MLflowTracker, with no Python. The Accelerator makes one for
// log_with "mlflow" (get_tracker<MlflowWriter>("mlflow")); a program can
// also make its own.
//
//   tandem::MlflowOptions options;            // MLFLOW_* variables beat these
//   options.tracking_uri = "http://127.0.0.1:5000";
//   options.experiment_name = "gpt";
//   tandem::MlflowWriter run(options);          // finds or creates both
//   run.log_params({{"lr", "0.0003"}});
//   run.log_metrics({{"loss", 2.1}}, /*step=*/10);
//   run.finish();                               // status FINISHED
//
// Plain http:// only: tandem links no TLS library (an ssh tunnel or a local
// proxy reaches an https server). The server's own store decides where the
// data lives (`mlflow server --backend-store-uri sqlite:///mlflow.db`).
//
// A server that stops answering does not stop training: log_metrics() keeps
// what it could not send (warning once), sends it with the next call that
// gets through, and finish() retries as MLflow's client does. Not
// thread-safe.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace tandem {

struct MlflowOptions {
  // The server, "http://host:port[/prefix]". MLFLOW_TRACKING_URI beats it.
  std::string tracking_uri;
  // The experiment, created when missing (with `artifact_location` and
  // `tags`, as Accelerate's tracker does). MLFLOW_EXPERIMENT_NAME beats it;
  // MLFLOW_EXPERIMENT_ID picks one by id. Neither: MLflow's "Default" (0).
  std::string experiment_name;
  std::string artifact_location;  // empty: the server's default
  // Log into this existing run (set RUNNING again) instead of creating one.
  // MLFLOW_RUN_ID beats it.
  std::string run_id;
  std::string run_name;     // a new run's name (mlflow.runName)
  std::string description;  // the run's description (mlflow.note.content)
  // Set on the run (and on a new experiment). MLFLOW_TAGS, a JSON object,
  // beats them; its values are stored as Python's str() writes them, as
  // Accelerate's tracker stores them ({"a": true, "b": 1.0, "c": null}:
  // "True", "1.0", "None").
  std::map<std::string, std::string> tags;
};

// `options` with the MLFLOW_* variables above applied. UsageError for an
// MLFLOW_TAGS that is not a JSON object.
MlflowOptions mlflow_options_from_environment(MlflowOptions options);

class MlflowWriter {
 public:
  // Applies the environment (mlflow_options_from_environment), then finds or
  // creates the experiment and creates (or resumes) the run. Credentials:
  // MLFLOW_TRACKING_TOKEN (bearer) or MLFLOW_TRACKING_USERNAME and
  // MLFLOW_TRACKING_PASSWORD (basic); each request waits up to
  // MLFLOW_HTTP_REQUEST_TIMEOUT s (120) and is retried up to
  // MLFLOW_HTTP_REQUEST_MAX_RETRIES times (7) with waits of
  // MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR x 2^n s (2; at most 120), as
  // MLflow's client. UsageError, with the server's answer, when there is no
  // http:// URI, no server answers or it refuses.
  explicit MlflowWriter(MlflowOptions options);
  // finish() when it was not called: FAILED while an exception unwinds,
  // FINISHED otherwise. Never throws (a failure is logged).
  ~MlflowWriter();
  MlflowWriter(const MlflowWriter&) = delete;
  MlflowWriter& operator=(const MlflowWriter&) = delete;

  // Metrics at `step`, stamped with the wall clock; NaN and infinities as
  // MLflow stores them. One request per 1000 metrics, tried once: when it
  // fails the metrics wait (a warning says so) for the next call or
  // finish(). UsageError when the server refuses them (a bad key).
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step);
  // Parameters (100 per request). A value over MLflow's 6000 characters is
  // dropped with a warning, as Accelerate does. UsageError when the server
  // refuses one (a run's parameter cannot change value).
  void log_params(const std::map<std::string, std::string>& params);
  void set_tags(const std::map<std::string, std::string>& tags);
  // Sends what waits, then ends the run with `status` (FINISHED, FAILED or
  // KILLED). Later calls do nothing. UsageError when it cannot.
  void finish(const std::string& status = "FINISHED");

  const std::string& tracking_uri() const;
  const std::string& experiment_id() const;
  const std::string& run_id() const;
  // Metrics not yet sent (a server that did not answer).
  int64_t pending_metrics() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
