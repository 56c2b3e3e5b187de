#!/usr/bin/env bash
# Every strategy (offloaded ones included) once on one GPU, compile on and off, then the results table.
# Run it whenever a GPU is available: under five minutes on one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -d .venv ]]; then
  python3 -m venv .venv
  . .venv/bin/activate
  pip install -q -e '.[quantized,test]'
else
  . .venv/bin/activate
fi
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
out=${OUT:-outputs/gpu_smoke}
python -m kvsweep +sweep=gpu_smoke "hydra.run.dir=$out" "mlflow.tracking_uri=sqlite:///$PWD/$out/mlflow.db" "$@"
