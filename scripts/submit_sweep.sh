#!/usr/bin/env bash
# Submit a sweep to a Ray cluster as a Ray job. The driver runs on the cluster and is the only
# process that talks to MLflow: point it at a tracking server the head node can reach.
# The repo is shipped as the job's working_dir (outputs, stores and venvs excluded) and imported from
# src/; the cluster's Python needs kvsweep's dependencies (torch, transformers, mlflow, hydra-core,
# psutil, nvidia-ml-py, and optimum-quanto/hqq for quantized caches).
# The variables are Ray's and MLflow's own: RAY_ADDRESS is the job server here, and Ray sets it to the
# cluster for the job's entrypoint, which kvsweep joins; MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME
# (optional, default kvsweep) travel with the job and are honoured there as MLflow honours them, as do
# MLflow's credential variables when set (anyone who can read the job's runtime env sees them).
#   RAY_ADDRESS=http://head:8265 MLFLOW_TRACKING_URI=http://mlflow-host:5000 scripts/submit_sweep.sh +sweep=long_context
set -euo pipefail
cd "$(dirname "$0")/.."
: "${RAY_ADDRESS:?set RAY_ADDRESS to the cluster job server, e.g. http://head:8265}"
: "${MLFLOW_TRACKING_URI:?set MLFLOW_TRACKING_URI to a tracking server the cluster can reach, e.g. http://mlflow-host:5000}"
runtime_env() {
  python3 -c '
import json, os
names = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
         "MLFLOW_TRACKING_TOKEN")
env = {"PYTHONPATH": "src", "RAY_USAGE_STATS_ENABLED": "0", **{n: os.environ[n] for n in names if os.environ.get(n)}}
excludes = ["outputs/", "mlruns/", "mlflow.db", ".venv/", ".git/", "test-artifacts/"]
print(json.dumps({"working_dir": ".", "excludes": excludes, "env_vars": env}))'
}
exec ray job submit --address "$RAY_ADDRESS" --runtime-env-json "$(runtime_env)" -- python -m kvsweep "$@"
