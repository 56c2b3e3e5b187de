#!/usr/bin/env bash
# Every strategy (offloaded ones included) once on one GPU, compile on and off, every weight quantization
# (quanto, bitsandbytes, torchao), on a node with two GPUs or more the model split over two GPUs per cell,
# then a summary to paste
# into a bug report: per cell the cache class generate really used, the per-repeat device peaks, its CPUs.
# Before any sweep: a Python >= pyproject's requires-python, a torch build the driver can run (installed
# from PyTorch's index for it: scripts/torch_for_driver.py) and proof that it starts CUDA. After the sweep,
# one cell whose CUDA is made to fail must come back as an error that says so. What only a GPU shows is
# checked from every cell's record (scripts/smoke_gpu_readings.py): NVML started afresh in each forked cell,
# joules per token (the GPU offering no energy counter is said, not failed; the repeats' spread is said),
# each CPU slot on the NUMA node its GPU hangs off, and in the two-GPU sweep both GPUs' UUIDs, a sharing
# probe of each and their energies summed.
# Exits non-zero when a cell that was not skipped failed or a check of scripts/smoke_summary.py fails.
# OUT=/abs/or/relative/folder picks where results go (default outputs/gpu_smoke).
# TORCH_INDEX_URL (a mirror, or another build) and TORCH_SPEC (default: torch) override the torch install.
# An existing .venv is kept when its torch starts CUDA (and neither override is set); one whose torch must
# be replaced is made anew, with the interpreter it was made with. PYTHON names the interpreter for a new
# .venv instead. Arguments are Hydra overrides for both sweeps (the second keeps its own caches and compile).
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "gpu_smoke: $*" >&2; exit 1; }

# The interpreter for a new .venv: $PYTHON, else python3, else the oldest python3.X new enough (binary
# wheels of the project's dependencies come first for older Pythons); one line when none is.
find_python() {
  local name verdict seen=()
  for name in ${PYTHON:-python3 python3.11 python3.12 python3.13 python3.14}; do
    command -v "$name" >/dev/null || { seen+=("$name: not found"); continue; }
    if verdict=$("$name" scripts/torch_for_driver.py python 2>/dev/null); then echo "$name"; return; fi
    seen+=("${verdict:-$name: $("$name" --version 2>&1 | head -n 1), which cannot run the check}")
  done
  fail "no Python new enough for kvsweep: $(IFS=';'; echo "${seen[*]}") (set PYTHON=/path/to/python3.11+)"
}

make_venv() {  # $1: the interpreter
  "$1" -m venv .venv >/dev/null 2>&1 ||
    { rm -rf .venv; fail "$1 -m venv failed (on Debian or Ubuntu: apt-get install python3-venv)"; }
  # shellcheck source=/dev/null
  . .venv/bin/activate
}

command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this node has no NVIDIA driver"
smi=$(nvidia-smi 2>&1) || fail "nvidia-smi failed: $(head -n 1 <<<"$smi")"
if [[ -d .venv ]]; then  # its own interpreter decides: the node's python3 may be older, or none at all
  # shellcheck source=/dev/null
  . .venv/bin/activate
else
  python=$(find_python)
  make_venv "$python"
fi
verdict=$(python scripts/torch_for_driver.py python 2>&1) ||
  fail "${verdict:-the python in .venv cannot run the check}: remove .venv to have it made anew"
cuda_starts() { env -u PYTORCH_NVML_BASED_CUDA_CHECK python scripts/cuda_starts.py <<<"$smi"; }
if [[ -z "${TORCH_INDEX_URL:-}${TORCH_SPEC:-}" ]] && cuda_starts >/dev/null 2>&1; then
  setup="kept .venv's torch, which starts CUDA"
else
  choice=$(python scripts/torch_for_driver.py choose <<<"$smi") || exit 1
  index=$(head -n 1 <<<"$choice")
  setup="$(tail -n 1 <<<"$choice") (index $index)"
  echo "$setup"
  # `pip uninstall torch` would leave triton and the CUDA wheels that torch brought (nvidia-*, cuda-*),
  # which the new build's loader may still find, and packages built against the old torch. Matching their
  # names is guesswork (nvidia-ml-py is the project's own), so a .venv that has a torch is made anew.
  if installed=$(python -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null); then
    if [[ -n "${PYTHON:-}" ]]; then python=$(find_python); else
      python=$(python -c 'import sys; print(sys._base_executable)')
    fi
    echo "making .venv anew with $python: it holds torch $installed, which this build replaces"
    if declare -F deactivate >/dev/null; then deactivate; fi
    rm -rf .venv
    make_venv "$python"
  fi
  pip install -q --index-url "$index" "${TORCH_SPEC:-torch}"
fi
pip install -q -e '.[quantized,test,cuda-weights]'  # keeps that torch: it satisfies the project's torch>=2.4
started=$(cuda_starts) || exit 1
echo "$started"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true

out=$(scripts/smoke_paths.sh "${OUT:-outputs/gpu_smoke}")
status=0
python -m kvsweep +sweep=gpu_smoke "hydra.run.dir=$out" "mlflow.tracking_uri=sqlite:///$out/mlflow.db" "$@" ||
  status=$?
# One cell whose CUDA initialisation is made to fail: every argument reaches it (a cluster's address, the
# model, trust_remote_code) but those that would change its one cache, its compile or its faults.
faulted=$out/cuda_init_fault
mkdir -p "$faulted"
its_own='^(\+\+?|~)?(grid\.(caches|compile)|testing\.faults)(=|$)'
forwarded=()
for arg in "$@"; do [[ $arg =~ $its_own ]] || forwarded+=("$arg"); done
# ${a[@]+"${a[@]}"}: an empty array is an unbound variable to `set -u` before bash 4.4
python -m kvsweep +sweep=gpu_smoke ${forwarded[@]+"${forwarded[@]}"} 'grid.caches=[dynamic]' 'grid.compile=[false]' \
  '+testing.faults=[{fault:cuda_init}]' "hydra.run.dir=$faulted" "mlflow.tracking_uri=sqlite:///$faulted/mlflow.db" \
  >"$faulted/sweep.log" 2>&1 || true
# Weights quantized by every scheme, each cell's stored weight bytes against the planner's exact figure.
weights_out=$out/weights
mkdir -p "$weights_out"
python -m kvsweep +sweep=gpu_smoke ${forwarded[@]+"${forwarded[@]}"} 'grid.caches=[dynamic]' 'grid.compile=[false]' \
  'grid.weights=[quanto-int8,quanto-int4,bnb-int8,bnb-nf4,torchao-int4]' "hydra.run.dir=$weights_out" \
  "mlflow.tracking_uri=sqlite:///$weights_out/mlflow.db" >"$weights_out/sweep.log" 2>&1 || true
# Your traffic, small: 8 requests of two prompt lengths through dynamic, static (sized for the longest) and paged,
# one at a time and continuously batched (paged, 4 in flight).
workload_out=$out/workload
mkdir -p "$workload_out"
python -m kvsweep +sweep=gpu_smoke ${forwarded[@]+"${forwarded[@]}"} 'grid.caches=[dynamic,static,paged]' \
  'grid.compile=[false]' grid.batch_sizes=[4] workload.source=lengths workload.name=smoke \
  'workload.input_lengths="fixed:256,1024"' 'workload.output_lengths="fixed:16,32"' workload.requests=8 \
  'workload.serving=[sequential,continuous]' "hydra.run.dir=$workload_out" \
  "mlflow.tracking_uri=sqlite:///$workload_out/mlflow.db" >"$workload_out/sweep.log" 2>&1 || true
# The forecast's per-dtype peaks: one prefill-heavy cell in float32 (CUDA cores, TF32 off) and one in bfloat16
# (tensor cores); the summary prints each one's measured prefill against its forecast.
dtypes_out=$out/dtypes
mkdir -p "$dtypes_out"
python -m kvsweep +sweep=gpu_smoke ${forwarded[@]+"${forwarded[@]}"} 'grid.caches=[dynamic]' 'grid.compile=[false]' \
  'grid.dtypes=[float32,bfloat16]' 'grid.context_lengths=[4096]' 'grid.max_new_tokens=[8]' \
  "hydra.run.dir=$dtypes_out" "mlflow.tracking_uri=sqlite:///$dtypes_out/mlflow.db" >"$dtypes_out/sweep.log" 2>&1 || true
# A node with two GPUs or more: a model split over two GPUs per cell (each GPU's layers and peak recorded),
# each GPU capped at 8 GB (the tag must name both; the smoke model needs far less).
split=()
if (( $(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU ') >= 2 )); then  # "GPU 0: NVIDIA H100 ..." each
  split_out=$out/two_gpus
  mkdir -p "$split_out"
  python -m kvsweep +sweep=gpu_smoke ${forwarded[@]+"${forwarded[@]}"} 'grid.caches=[dynamic,static]' \
    'grid.compile=[false]' ray.gpus_per_cell=2 measure.device_memory_limit_gb=8 "hydra.run.dir=$split_out" \
    "mlflow.tracking_uri=sqlite:///$split_out/mlflow.db" >"$split_out/sweep.log" 2>&1 || true
  split=(--expect-split "$split_out")
else
  echo "one GPU on this node: the split over two GPUs per cell is not run"
fi
python scripts/smoke_summary.py "$out" --expect-cuda-init-error "$faulted" --expect-weights "$weights_out" \
  --expect-workload "$workload_out" --expect-dtypes "$dtypes_out" \
  ${split[@]+"${split[@]}"} \
  --setup "$setup; $started" || status=$((status == 0 ? 1 : status))
echo "smoke run took ${SECONDS} s (setup, sweeps with their compiles and quanto's CUDA build, summary)"
exit "$status"
