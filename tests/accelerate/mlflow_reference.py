"""The Python side of MlflowInterop (tests/accelerate/test_mlflow_writer.cpp).

  mlflow_reference.py accelerate URI RUN_NAME
      Accelerate's MLflowTracker, through accelerate's Accelerator, writes
      the run the C++ test writes with tandem's: experiment "tracking", the
      same hyperparameters, metrics and description (MLFLOW_TAGS from the
      environment, as both read it).
  mlflow_reference.py dump URI
      Prints, as the last line, every run of experiment "tracking" as MLflow's
      own client reads it back: {run name: {experiment, status, params,
      metrics: {key: [[step, value]]}, tags}}, NaN as "nan". The tags the two
      programs cannot share (the run name, the program's path, a git commit)
      are left out.
"""
import json
import math
import os
import sys


def accelerate_run(uri, run_name):
    os.environ["MLFLOW_TRACKING_URI"] = uri
    from accelerate import Accelerator

    accelerator = Accelerator(log_with="mlflow", cpu=True)
    accelerator.init_trackers(
        "tracking",
        config={"lr": 3e-4, "batch_size": 64, "optimizer": "adamw", "amp": True},
        init_kwargs={"mlflow": {"run_name": run_name, "description": "the reference run"}},
    )
    for step in range(5):
        accelerator.log({"loss": 1.0 / (step + 1), "lr": 3e-4 * step}, step=step)
    accelerator.log({"nan_metric": float("nan")}, step=5)
    accelerator.end_training()


def dump(uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tracking")
    out = {}
    for run in client.search_runs([experiment.experiment_id]):
        metrics = {}
        for key in run.data.metrics:
            history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
            metrics[key] = [[m.step, "nan" if math.isnan(m.value) else m.value] for m in history]
        tags = {k: v for k, v in run.data.tags.items()
                if k != "mlflow.runName" and k != "mlflow.source.name"
                and not k.startswith("mlflow.source.git")}
        out[run.info.run_name] = {
            "experiment": experiment.name,
            "status": run.info.status,
            "params": run.data.params,
            "metrics": metrics,
            "tags": tags,
        }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    if sys.argv[1] == "accelerate":
        accelerate_run(sys.argv[2], sys.argv[3])
    else:
        dump(sys.argv[2])
