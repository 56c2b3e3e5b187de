#!/usr/bin/env bash
# Every strategy (offloaded ones included) once on one GPU, compile on and off, then a summary to paste
# into a bug report: per cell the cache class generate really used and the per-repeat device peaks.
# Exits non-zero when a cell that was not skipped failed or its peaks climb from repeat to repeat.
# OUT=/abs/or/relative/folder picks where results go (default outputs/gpu_smoke).
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
out=$(scripts/smoke_paths.sh "${OUT:-outputs/gpu_smoke}")
status=0
python -m kvsweep +sweep=gpu_smoke "hydra.run.dir=$out" "mlflow.tracking_uri=sqlite:///$out/mlflow.db" "$@" || status=$?
python scripts/smoke_summary.py "$out" || status=$((status == 0 ? 1 : status))
echo "smoke run took ${SECONDS} s (setup, sweep with its compiles and quanto's CUDA build, summary)"
exit "$status"
