#!/usr/bin/env bash
# Start a local MLflow tracking server over a sqlite store; sweeps then use
#   python -m kvsweep mlflow.tracking_uri=http://127.0.0.1:${PORT}
set -euo pipefail
STORE=${STORE:-$PWD/mlflow.db}
PORT=${PORT:-5000}
exec mlflow server --backend-store-uri "sqlite:///$STORE" --host 127.0.0.1 --port "$PORT" \
  --artifacts-destination "${ARTIFACTS:-$PWD/mlartifacts}"
