#!/usr/bin/env bash
# Submit a sweep to a Ray cluster as a Ray job. The driver runs on the cluster and is the only
# process that talks to MLflow: point it at a tracking server the head node can reach.
# The repo is shipped as the job's working_dir (outputs, stores and venvs excluded) and imported from
# src/; the cluster's Python needs kvsweep's dependencies (torch, transformers, mlflow, hydra-core,
# psutil, nvidia-ml-py, and optimum-quanto/hqq for quantized caches).
#   RAY_ADDRESS=http://head:8265 MLFLOW_URI=http://mlflow-host:5000 scripts/submit_sweep.sh +sweep=long_context
set -euo pipefail
cd "$(dirname "$0")/.."
: "${RAY_ADDRESS:?set RAY_ADDRESS to the cluster's job server, e.g. http://head:8265}"
: "${MLFLOW_URI:?set MLFLOW_URI to a tracking server the cluster can reach, e.g. http://mlflow-host:5000}"
runtime_env=$(cat <<JSON
{"working_dir": ".", "excludes": ["outputs/", "mlruns/", "mlflow.db", ".venv/", ".git/", "test-artifacts/"],
 "env_vars": {"PYTHONPATH": "src", "RAY_USAGE_STATS_ENABLED": "0"}}
JSON
)
exec ray job submit --address "$RAY_ADDRESS" --runtime-env-json "$runtime_env" -- \
  python -m kvsweep ray.address=auto "mlflow.tracking_uri=$MLFLOW_URI" "$@"
