"""scripts/gpu_smoke.sh's parts that need no GPU.

The interpreter and torch build it picks (sample nvidia-smi outputs), its CUDA check, the script itself
up to its first sweep (a fake `nvidia-smi` and a `pip` that only records), output paths, and what the
summary checks (journals written by hand, and real CPU sweeps).
"""

import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest
from mlflow import MlflowClient

from fake_nvml import FakeGpu, FakeNvml
from kvsweep.grid import Cell
from kvsweep.models.shape import KvShape
from kvsweep.names import Metric, ResultTag
from kvsweep.plan.cell_plan import skip_reason
from kvsweep.plan.triton_launcher import LauncherToolchain, launcher_problem
from kvsweep.results import CRASHED, ERROR, OK, OOM, SKIPPED, TIMEOUT, CellResult
from kvsweep.tracking.journal import Journal, SweepHeader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the smoke script's helpers, imported as they import each other
import cuda_starts  # noqa: E402
import smoke_gpu_readings  # noqa: E402
import smoke_summary  # noqa: E402
import torch_for_driver as builds  # noqa: E402


def absolute(folder: str, cwd: Path) -> str:
    script = ROOT / "scripts/smoke_paths.sh"
    done = subprocess.run([script, folder], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.slow  # makes two MLflow stores: about 12 s on two shared cores
def test_output_folder_absolute_or_relative_makes_a_working_mlflow_uri(tmp_path):
    assert absolute(str(tmp_path / "abs"), cwd=ROOT) == str(tmp_path / "abs")
    assert absolute("rel/out", cwd=tmp_path) == str(tmp_path / "rel/out")
    for folder in (absolute(str(tmp_path / "abs"), ROOT), absolute("rel/out", tmp_path)):
        Path(folder).mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db")  # the script's own form
        client.create_experiment("smoke")
        assert (Path(folder) / "mlflow.db").exists()


def test_summary_names_each_cells_cache_class_and_peaks(finished_sweep):
    """The shared sweep: contexts 64 and 192 x dynamic, static, offloaded, quantized-hqq-int4, 4 new tokens."""
    run = finished_sweep
    done = subprocess.run(
        [sys.executable, ROOT / "scripts/smoke_summary.py", run.run_dir], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("dynamic") and "DynamicCache/DynamicLayer" in line for line in lines), lines
    for context in (64, 192):  # a static cache holds context + new tokens - 1
        reserved = f"StaticCache/StaticLayer max_cache_len={context + 4 - 1}"
        assert any(line.startswith("static") and reserved in line for line in lines), (reserved, lines)
    assert any(line.startswith("offloaded") and "skipped" in line and "CUDA" in line for line in lines)
    assert "forked from a CUDA-clean template: 6 of 6 cells that ran" in lines  # 2 contexts x 3 CPU caches
    ratios = [line for line in lines if line.startswith("forecast: ") and " s: " in line and line.endswith("x")]
    assert len(ratios) == 6 and any(line.startswith("forecast: cells took") for line in lines)  # each cell, then all
    assert lines[-1] == "OK: 0 problem(s)"


def test_summary_fails_when_cells_were_not_forked_from_the_template(run_sweep):
    """On a GPU this is how a preload that initialised CUDA shows: the template refuses, cells run unforked."""
    run = run_sweep("grid.caches=[dynamic]", "measure.repeats=2", "ray.fork_cells=false")
    assert run.code == 0
    done = subprocess.run(
        [sys.executable, ROOT / "scripts/smoke_summary.py", run.run_dir], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "forked from a CUDA-clean template: 0 of 1 cells that ran" in done.stdout
    assert "NOT FORKED" in done.stdout and done.stdout.splitlines()[-1] == "FAILED: 1 problem(s)"


# --- Which torch build the smoke script installs, and whether it starts CUDA (scripts/torch_for_driver.py,
# scripts/cuda_starts.py): pure functions, fed what nvidia-smi prints on real nodes.

NVIDIA_SMI = """Thu Dec  3 10:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
+-----------------------------------------+------------------------+----------------------+
"""
INDEX = "https://download.pytorch.org/whl"


def smi(driver: str, cuda: str) -> str:
    return NVIDIA_SMI.format(driver=driver, cuda=cuda)


@pytest.mark.parametrize(
    ("driver", "cuda", "build"),
    [
        # CUDA minor-version compatibility: any 12.x driver runs a 12.x build, and 12.6 is the only 12.x
        # build PyTorch 2.12-2.14 publish as stable; a 13.x build needs a 13.x driver (>= 580).
        ("535.104.05", "12.2", "cu126"),
        ("550.54.14", "12.4", "cu126"),
        ("570.124.06", "12.8", "cu126"),
        ("580.65.06", "13.0", "cu130"),
        ("590.10.01", "13.1", "cu130"),  # newer than any build: the newest build
    ],
)
def test_the_build_is_the_newest_one_the_drivers_cuda_major_runs(driver, cuda, build):
    choice = builds.choose_build(builds.read_driver(smi(driver, cuda)))
    assert choice.index_url == f"{INDEX}/{build}"
    assert choice.reason.startswith(f"torch build {build} ") and f"driver {driver} (CUDA {cuda})" in choice.reason
    assert "\n" not in choice.reason


def test_a_12x_driver_is_told_why_not_cuda_13():
    reason = builds.choose_build(builds.read_driver(smi("550.54.14", "12.4"))).reason
    assert "runs on any 12.x driver" in reason and "cu130 needs driver >= 580.65.06" in reason


def test_without_a_cuda_version_in_the_header_the_driver_version_decides():
    """`nvidia-smi --query-gpu=driver_version --format=csv,noheader` (one line per GPU)."""
    assert builds.read_driver("550.54.14\n550.54.14\n") == builds.Driver("550.54.14", (12, 4), "550.54.14")
    assert builds.choose_build(builds.read_driver("580.82.07\n")).index_url == f"{INDEX}/cu130"  # 580 is 13.0
    assert builds.choose_build(builds.read_driver("525.60.13")).index_url == f"{INDEX}/cu126"  # 12.0's first
    header_without = smi("570.86.10", "N/A")
    assert builds.read_driver(header_without).cuda == (12, 8)  # 570.26 was 12.8's first driver


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (smi("520.61.05", "11.8"), "driver 520.61.05 (CUDA 11.8) is too old"),  # no current build runs
        ("", "could not read the driver's CUDA version"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "couldn't communicate"),
        ("| NVIDIA-SMI ??? | garbled\n", "garbled"),
    ],
)
def test_no_build_is_one_line_that_says_why_and_how_to_choose_one(text, says):
    with pytest.raises(builds.NoBuild) as refused:
        builds.choose_build(builds.read_driver(text))
    message = str(refused.value)
    assert says in message and "TORCH_INDEX_URL" in message and "\n" not in message


def test_torch_index_url_wins_and_is_named():
    mirror = "https://mirror.example/whl/cu128"
    for text in (smi("550.54.14", "12.4"), "garbled"):  # whatever the driver, the user's index is used
        choice = builds.choose_build(builds.read_driver(text), mirror)
        assert choice.index_url == mirror and f"TORCH_INDEX_URL={mirror}" in choice.reason


def test_interpreter_verdicts_follow_pyprojects_requires_python():
    import tomllib

    assert builds.required_python('requires-python = ">=3.12"') == (3, 12)
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = builds.required_python((ROOT / "pyproject.toml").read_text())
    assert ours.replace(" ", "") == f">={major}.{minor}"
    ok, line = builds.python_verdict("python3", (3, 10, 12, "final", 0), (3, 11))
    assert not ok and line == "python3 is Python 3.10.12, older than the 3.11 pyproject.toml requires"
    assert builds.python_verdict("python3.11", (3, 11, 0), (3, 11))[0]
    assert builds.python_verdict("python3.13", (3, 13, 1), (3, 11))[0]


def test_the_interpreter_check_parses_under_python_37():
    """An old `python3` must be able to run it, to say in one line that it is too old."""
    import ast

    ast.parse((ROOT / "scripts/torch_for_driver.py").read_text(), feature_version=(3, 7))


def test_cuda_that_does_not_start_is_one_line_naming_driver_and_torch_build():
    import torch

    driver = builds.read_driver(smi("550.54.14", "12.4"))
    ok, line = cuda_starts.check(driver)  # on this CPU-only torch, torch.cuda.init() really fails
    assert not ok and "\n" not in line
    assert "driver 550.54.14 (CUDA 12.4)" in line and f"torch {torch.__version__}" in line

    def old_driver():
        raise RuntimeError("The NVIDIA driver on your system is too old (found version 12040).\nPlease update")

    ok, line = cuda_starts.check(driver, start=old_driver)
    assert not ok and line.endswith("RuntimeError: The NVIDIA driver on your system is too old (found version 12040).")
    ok, line = cuda_starts.check(driver, start=lambda: "NVIDIA H100 80GB HBM3")
    assert ok and line.startswith("CUDA starts on NVIDIA H100 80GB HBM3: torch ")


# --- The smoke script itself on a copy of the checkout. Its .venv is a real virtual environment without
# pip or torch (made in milliseconds) whose `pip` only records what it was asked; the node's interpreters
# and `nvidia-smi` are stand-ins that print what a real node's would.

HELPERS = (
    "gpu_smoke.sh",
    "smoke_paths.sh",
    "smoke_summary.py",
    "smoke_gpu_readings.py",
    "torch_for_driver.py",
    "cuda_starts.py",
)
HOST_PYTHONS = ("python3", "python3.11", "python3.12", "python3.13", "python3.14")
TOO_OLD = 'echo "$0 is Python 3.10.12, older than the 3.11 pyproject.toml requires"; exit 1'


def checkout(tmp_path: Path, with_venv: bool) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in HELPERS:
        shutil.copy2(ROOT / "scripts" / name, repo / "scripts" / name)
    shutil.copy2(ROOT / "pyproject.toml", repo / "pyproject.toml")
    if with_venv:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", repo / ".venv"], check=True)
        executable(repo / ".venv/bin/pip", recording_pip(tmp_path))
    return repo


def recording_pip(tmp_path: Path) -> str:
    return f'echo "$*" >> "{tmp_path / "pip.log"}"'


def site_packages(repo: Path) -> Path:
    """Where the checkout's .venv imports packages from."""
    return next((repo / ".venv/lib").glob("python3*/site-packages"))


def installed(repo: Path, name: str, version: str, modules: dict[str, str]) -> None:
    """A package in the checkout's .venv as pip leaves one: its modules and its metadata."""
    write_package(site_packages(repo), name, version, modules)


def write_package(folder: Path, name: str, version: str, modules: dict[str, str]) -> None:
    for module, text in modules.items():
        (folder / module).parent.mkdir(parents=True, exist_ok=True)
        (folder / module).write_text(text)
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


# A torch whose CUDA libraries do not load: what a torch next to another build's nvidia-* wheels does.
LIBCUDNN_MISSING = "libcudnn.so.9: cannot open shared object file: No such file or directory"
TORCH_THAT_CANNOT_LOAD = {"torch/__init__.py": f"raise ImportError({LIBCUDNN_MISSING!r})\n"}
# A stand-in for a CUDA torch that starts on its GPU: just what scripts/cuda_starts.py calls.
TORCH_THAT_STARTS = {
    "torch/__init__.py": (
        "from . import cuda, version\n__version__ = '2.14.1+cu126'\n\n"
        "class Tensor:\n    def __init__(self, value): self.value = value\n"
        "    def __add__(self, other): return Tensor(self.value + other)\n"
        "    def item(self): return self.value\n\n"
        "def ones(n, device): return Tensor(1.0)\n"
    ),
    "torch/cuda.py": "def init(): pass\n\ndef get_device_name(index): return 'Stand-in GPU'\n",
    "torch/version.py": "cuda = '12.6'\n",
}


def executable(path: Path, body: str) -> None:
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)


def new_enough_python(tmp_path: Path) -> str:
    """A node's interpreter new enough for kvsweep: its `-m venv` makes the checkout's kind of .venv and
    notes who made it."""
    pip = tmp_path / "recording-pip"
    executable(pip, recording_pip(tmp_path))
    return (
        f'if [ "$1 $2" = "-m venv" ]; then echo "$(basename "$0")" >> "{tmp_path / "made_by.log"}"\n'
        f'  "{sys.executable}" -m venv --without-pip "$3" && exec cp "{pip}" "$3/bin/pip"\n'
        f"  exit 1\nfi\n"
        f'exec "{sys.executable}" "$@"'
    )


def run_smoke(
    repo: Path, tmp_path: Path, nvidia_smi: str, *args: str, pythons: dict[str, str] | None = None, **env: str
) -> subprocess.CompletedProcess:
    """The script with this node's `nvidia-smi`, and host interpreters (too old unless `pythons` says)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    executable(fake / "nvidia-smi", nvidia_smi)
    for name in HOST_PYTHONS:  # they shadow the real ones on PATH
        executable(fake / name, (pythons or {}).get(name, TOO_OLD))
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX_URL", "TORCH_SPEC", "PYTHON", "OUT")}
    environ.update(env, PATH=f"{fake}:{os.environ['PATH']}")
    return subprocess.run(
        [repo / "scripts/gpu_smoke.sh", *args], env=environ, capture_output=True, text=True, timeout=120, check=False
    )


def print_smi(text: str) -> str:
    return f"cat <<'SMI'\n{text}SMI"


def pip_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "pip.log"
    return log.read_text().splitlines() if log.exists() else []


def test_smoke_script_stops_in_one_line_when_no_python_is_new_enough(tmp_path):
    repo = checkout(tmp_path, with_venv=False)
    old = tmp_path / "old"
    old.mkdir()
    # One that ran the check and was too old, one too old to run it at all (an ancient python3).
    executable(old / "python3.10", TOO_OLD)
    executable(old / "python3.6", '[ "$1" = --version ] && echo "Python 3.6.15"; exit 1')
    done = run_smoke(repo, tmp_path, print_smi(smi("550.54.14", "12.4")), PYTHON=f"{old}/python3.10 {old}/python3.6")
    assert done.returncode == 1
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert "Python 3.10.12, older than the 3.11" in done.stderr and "Python 3.6.15" in done.stderr
    assert "PYTHON=" in done.stderr and not (repo / ".venv").exists()


@pytest.mark.parametrize(
    ("new_enough", "chosen"),
    [
        # Binary wheels of ray and hqq come first for older Pythons: the oldest that will do.
        (("python3.11", "python3.12", "python3.13", "python3.14"), "python3.11"),
        (("python3.12", "python3.14"), "python3.12"),
        (("python3", "python3.11", "python3.14"), "python3"),  # the node's default first
    ],
)
def test_a_new_venv_is_made_with_python3_else_the_oldest_python_new_enough(tmp_path, new_enough, chosen):
    repo = checkout(tmp_path, with_venv=False)
    pythons = dict.fromkeys(new_enough, new_enough_python(tmp_path))
    done = run_smoke(repo, tmp_path, print_smi(smi("550.54.14", "12.4")), pythons=pythons)
    assert (tmp_path / "made_by.log").read_text().splitlines() == [chosen], done.stderr
    assert f"install -q --index-url {INDEX}/cu126 torch" in pip_calls(tmp_path)


def test_an_existing_venv_needs_no_python_on_the_node(tmp_path):
    """Its interpreter may be one PATH does not hold (pyenv, uv, conda): every python3 on PATH is too old."""
    repo = checkout(tmp_path, with_venv=True)
    done = run_smoke(repo, tmp_path, print_smi(smi("550.54.14", "12.4")))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("torch build cu126 (CUDA 12.6) for driver 550.54.14 (CUDA 12.4)")
    assert pip_calls(tmp_path) == [  # torch from the driver's index, then the project; nothing to replace
        f"install -q --index-url {INDEX}/cu126 torch",
        "install -q -e .[quantized,test,cuda-weights]",
    ]
    # The recording pip installed nothing: the check after the install still finds no torch, and stops.
    assert done.stderr.splitlines()[-1] == (
        "CUDA does not start: driver 550.54.14 (CUDA 12.4), torch not installed: "
        "ModuleNotFoundError: No module named 'torch'"
    )
    assert not (repo / "outputs").exists()  # no sweep started


def test_a_venv_whose_torch_is_replaced_is_made_anew(tmp_path):
    """`pip uninstall torch` would leave the CUDA wheels of the old build behind; a new .venv has none."""
    repo = checkout(tmp_path, with_venv=True)
    installed(repo, "torch", "2.14.1+cu130", TORCH_THAT_CANNOT_LOAD)
    installed(repo, "nvidia_cudnn_cu13", "9.13.0.50", {"nvidia/cudnn/lib/libcudnn.so.9": ""})
    made_with = tmp_path / "pythons" / "python3.12"
    made_with.parent.mkdir()
    executable(made_with, new_enough_python(tmp_path))
    done = run_smoke(repo, tmp_path, print_smi(smi("550.54.14", "12.4")), PYTHON=str(made_with))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[:2] == [
        f"torch build cu126 (CUDA 12.6) for driver 550.54.14 (CUDA 12.4): "
        f"a CUDA 12.x build runs on any 12.x driver; cu130 needs driver >= 580.65.06 (index {INDEX}/cu126)",
        f"making .venv anew with {made_with}: it holds torch 2.14.1+cu130, which this build replaces",
    ]
    assert not list(site_packages(repo).glob("nvidia*")) and not list(site_packages(repo).glob("torch*"))
    assert (tmp_path / "made_by.log").read_text().splitlines() == ["python3.12"]
    assert pip_calls(tmp_path) == [
        f"install -q --index-url {INDEX}/cu126 torch",
        "install -q -e .[quantized,test,cuda-weights]",
    ]


def test_installs_what_torch_index_url_and_torch_spec_name(tmp_path):
    repo = checkout(tmp_path, with_venv=True)
    mirror = "https://mirror.example/whl/cu126"
    done = run_smoke(repo, tmp_path, print_smi("garbled"), TORCH_INDEX_URL=mirror, TORCH_SPEC="torch==2.13.0")
    assert done.returncode == 1
    assert f"install -q --index-url {mirror} torch==2.13.0" in pip_calls(tmp_path)


def test_a_torch_that_cannot_import_is_the_same_one_line(tmp_path):
    """Not a traceback: the line names the driver and the build pip installed, with the loader's reason."""
    write_package(tmp_path, "torch", "2.14.1+cu130", TORCH_THAT_CANNOT_LOAD)
    done = subprocess.run(
        [sys.executable, ROOT / "scripts/cuda_starts.py"],
        input=smi("550.54.14", "12.4"),
        env={**os.environ, "PYTHONPATH": str(tmp_path)},  # ahead of site-packages: this torch is the one found
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "CUDA does not start: driver 550.54.14 (CUDA 12.4), torch 2.14.1+cu130 (installed, not imported): "
        f"ImportError: {LIBCUDNN_MISSING}"
    ]


# The project's command line as a stand-in: it notes the arguments each sweep was started with.
SWEEP_THAT_RECORDS = "import json, os, sys\nprint(json.dumps(sys.argv[1:]), file=open(os.environ['SWEEPS'], 'a'))\n"


@pytest.mark.parametrize(
    "user",
    [
        (),  # no argument: an empty list must still expand under `set -u` (bash before 4.4)
        (
            "ray.address=auto",
            "device=cuda",
            "trust_remote_code=true",
            "grid.models=[llama-3.2-1b]",
            "grid.caches=[static]",
            "grid.compile=[true]",
            "+testing.faults=[{fault:oom}]",
        ),
    ],
)
def test_both_sweeps_get_the_users_arguments_but_the_faulted_one_keeps_its_cell(tmp_path, user):
    """A .venv whose torch starts CUDA is kept; the CUDA-fault sweep reaches the same cluster and model."""
    repo = checkout(tmp_path, with_venv=True)
    installed(repo, "torch", "2.14.1+cu126", TORCH_THAT_STARTS)
    installed(repo, "kvsweep", "0.0.0", {"kvsweep/__init__.py": "", "kvsweep/__main__.py": SWEEP_THAT_RECORDS})
    out = tmp_path / "out"
    done = run_smoke(
        repo, tmp_path, print_smi(smi("550.54.14", "12.4")), *user, OUT=str(out), SWEEPS=str(tmp_path / "sweeps")
    )
    # torch kept, not replaced
    assert pip_calls(tmp_path) == ["install -q -e .[quantized,test,cuda-weights]"], done.stderr
    started = "CUDA starts on Stand-in GPU: torch 2.14.1+cu126 (built for CUDA 12.6), driver 550.54.14 (CUDA 12.4)"
    assert started in done.stdout.splitlines()
    sweeps = [json.loads(line) for line in (tmp_path / "sweeps").read_text().splitlines()]
    measured, faulted, weights, workload, dtypes = sweeps
    # The measured sweep gets every argument, after its own (so the user's win).
    assert measured == [
        "+sweep=gpu_smoke",
        f"hydra.run.dir={out}",
        f"mlflow.tracking_uri=sqlite:///{out}/mlflow.db",
        *user,
    ]
    faulted_dir = out / "cuda_init_fault"
    assert faulted == [
        "+sweep=gpu_smoke",
        *user[:4],  # the cluster, the device, remote code, the model: all but its cache, compile and faults
        "grid.caches=[dynamic]",
        "grid.compile=[false]",
        "+testing.faults=[{fault:cuda_init}]",
        f"hydra.run.dir={faulted_dir}",
        f"mlflow.tracking_uri=sqlite:///{faulted_dir}/mlflow.db",
    ]
    weights_dir = out / "weights"  # one GPU on the stand-in node: no split sweep after it
    assert weights == [
        "+sweep=gpu_smoke",
        *user[:4],
        "grid.caches=[dynamic]",
        "grid.compile=[false]",
        "grid.weights=[quanto-int8,quanto-int4,bnb-int8,bnb-nf4,torchao-int4]",
        f"hydra.run.dir={weights_dir}",
        f"mlflow.tracking_uri=sqlite:///{weights_dir}/mlflow.db",
    ]
    workload_dir = out / "workload"  # the small workload sweep: dynamic, static and paged, two serving modes
    assert workload == [
        "+sweep=gpu_smoke",
        *user[:4],
        "grid.caches=[dynamic,static,paged]",
        "grid.compile=[false]",
        "grid.batch_sizes=[4]",
        "workload.source=lengths",
        "workload.name=smoke",
        'workload.input_lengths="fixed:256,1024"',
        'workload.output_lengths="fixed:16,32"',
        "workload.requests=8",
        "workload.serving=[sequential,continuous]",
        f"hydra.run.dir={workload_dir}",
        f"mlflow.tracking_uri=sqlite:///{workload_dir}/mlflow.db",
    ]
    dtypes_dir = out / "dtypes"  # the forecast's per-dtype peaks: one long prefill in float32, one in bfloat16
    assert dtypes == [
        "+sweep=gpu_smoke",
        *user[:4],
        "grid.caches=[dynamic]",
        "grid.compile=[false]",
        "grid.dtypes=[float32,bfloat16]",
        "grid.context_lengths=[4096]",
        "grid.max_new_tokens=[8]",
        f"hydra.run.dir={dtypes_dir}",
        f"mlflow.tracking_uri=sqlite:///{dtypes_dir}/mlflow.db",
    ]


def test_the_dtype_sweep_prints_each_dtypes_prefill_against_its_forecast(tmp_path):
    """float32 and bfloat16 each have their prefill against the forecast's per-dtype peak; a dtype whose cell did
    not run is a problem (the check could not be made)."""
    f32 = from_cell(Cell("m", "float32", 4096, 1, 8, "dynamic", False))
    f32.metrics.update({Metric.TTFT_MS: 120.0, Metric.FORECAST_RATIO_TTFT: 1.4})
    folder = write_journal(tmp_path / "dtypes", [f32])
    code, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--expect-dtypes", str(folder))
    assert "prefill float32: ttft 120.0 ms, 1.40x its forecast (CUDA cores, TF32 off)" in lines
    assert any(line.startswith("DTYPE PREFILL: bfloat16 cell missing") for line in lines), lines
    assert code == 1


# --- What the summary checks, on journals written by hand: one result per situation a GPU run can meet.


def cell(cache: str = "dynamic", compile: bool = False, context: int = 1024) -> Cell:
    return Cell("HuggingFaceTB/SmolLM2-135M", "bfloat16", context, 1, 32, cache, compile)


def from_cell(cell: Cell, status: str = OK, error: str = "", forked: bool = True, **environment) -> CellResult:
    """A result the cell's own process sent back: the environment it and its actor record."""
    env = {"device_name": "NVIDIA H100 80GB HBM3", "torch_version": "2.14.1+cu126", "torch_threads": 2}
    env |= {"ray_node_id": "node-a", "started_at": 100.0, "ended_at": 160.0, "cpus": "4,5", "cpus_from": "slot"}
    env |= {"threads_from": "ray.cpus_per_cell", "gpu_uuid": "GPU-a", "gpu_uuids": "GPU-a"}
    env |= {"template": {"pid": 7}, "nvml": "restarted"} if forked else {}  # NVML started afresh after the fork
    metrics = {Metric.COMPILE_RECAPTURES: 0.0, Metric.COMPILE_CUDAGRAPH_SKIPS: 0.0} if cell.compile else {}
    metrics[Metric.JOULES_PER_TOKEN] = 0.25
    return CellResult(f"id-{cell}", cell, status, error, metrics=metrics, environment=env | environment)


def by_driver(cell: Cell, status: str, error: str, **tags: str) -> CellResult:
    """A result the driver wrote itself: no process of the cell ever answered."""
    return CellResult(f"id-{cell}", cell, status, error, tags=tags)


def summarize(tmp_path: Path, results: list[CellResult], device: str = "cuda", *args: str) -> tuple[int, list[str]]:
    folder = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    journal = Journal(folder)
    journal.write_header(SweepHeader("gpu_smoke", "key", "kvsweep", "sqlite:///x.db", device, ""))
    for result in results:
        journal.append(result)
    out = io.StringIO()
    with redirect_stdout(out):
        code = smoke_summary.main([str(folder), *args])
    return code, out.getvalue().splitlines()


def test_driver_made_results_are_failures_of_their_own_not_unforked_cells(tmp_path):
    results = [
        from_cell(cell("dynamic")),
        from_cell(cell("static"), started_at=200.0, ended_at=260.0),
        by_driver(cell("offloaded"), CRASHED, "cell process died (exit code 1)"),
        by_driver(cell("offloaded_static"), TIMEOUT, "cell timed out after 3600 s"),
        by_driver(
            cell("static", context=2048),
            OOM,
            "inferred: the smaller cell ... ran out of memory",
            **{ResultTag.INFERRED: "true"},
        ),
        by_driver(cell("quantized-quanto-int4"), SKIPPED, "quantized-quanto-int4 needs the 'optimum-quanto' package"),
    ]
    code, lines = summarize(tmp_path, results)
    assert "forked from a CUDA-clean template: 2 of 2 cells that ran" in lines
    assert not any("NOT FORKED" in line for line in lines)
    assert any(line.startswith("made by the driver") and "crashed 1, oom 1, timeout 1" in line for line in lines)
    assert code == 1 and lines[-1] == "FAILED: 3 problem(s)"  # crashed, timeout, oom; the skip is none


def test_a_cell_measured_outside_the_template_is_still_not_forked(tmp_path):
    code, lines = summarize(tmp_path, [from_cell(cell("dynamic"), forked=False)])
    assert "forked from a CUDA-clean template: 0 of 1 cells that ran" in lines and "NOT FORKED" in lines[-2]
    assert code == 1 and lines[-1] == "FAILED: 1 problem(s)"


# Two cells on one node; (cpus, cpus_from, node, start, end) of the second; the first: 4,5 slot node-a 100-160.
@pytest.mark.parametrize(
    ("second", "problems", "says"),
    [
        (("6,7", "slot", "node-a", 120.0, 180.0), 0, None),  # at once, disjoint cores
        (("5,6", "slot", "node-a", 120.0, 180.0), 1, "sharing CPUs 5"),  # at once, core 5 twice
        (("4,5", "slot", "node-a", 160.0, 220.0), 0, None),  # same cores, one after the other
        (("4,5", "slot", "node-b", 120.0, 180.0), 0, None),  # same core numbers, another node
        (("6,7", "shared", "node-a", 200.0, 260.0), 1, "from shared, not a slot of its own"),
        (("", "", "node-a", 200.0, 260.0), 1, "from nothing, not a slot of its own"),  # no slot recorded at all
    ],
)
def test_on_cuda_each_cell_that_ran_had_cpus_of_its_own(tmp_path, second, problems, says):
    cpus, cpus_from, node, start, end = second
    other = from_cell(cell("static"), cpus=cpus, cpus_from=cpus_from, ray_node_id=node, started_at=start, ended_at=end)
    code, lines = summarize(tmp_path, [from_cell(cell("dynamic")), other])
    assert any(line.startswith("dynamic ") and "| cpus 4,5 (slot) threads 2" in line for line in lines)
    assert lines[-1] == f"{'FAILED' if problems else 'OK'}: {problems} problem(s)" and code == (1 if problems else 0)
    assert not says or any(line.startswith("CPU SLOT: ") and says in line for line in lines), lines


def test_cpu_cells_keep_sharing_the_hosts_cores(tmp_path):
    shared = [from_cell(cell(c), cpus="0,1,2,3", cpus_from="shared") for c in ("dynamic", "static")]
    code, lines = summarize(tmp_path, shared, "cpu")
    assert code == 0 and not any(line.startswith("CPU SLOT") for line in lines)


@pytest.mark.parametrize(
    ("status", "skips", "device", "problems"),
    [
        (OK, 0.0, "cuda", 0),
        (OK, 2.0, "cuda", 1),  # ran without CUDA graphs: the compiled numbers are not what they claim
        (OK, None, "cuda", 1),  # not counted: the smoke cannot tell
        (OK, None, "cpu", 0),  # Inductor on CPU records no CUDA graphs
        (ERROR, 3.0, "cuda", 1),  # the cell failed on its skips: one problem, not two
    ],
)
def test_compiled_cells_that_skip_cuda_graphs_fail(tmp_path, status, skips, device, problems):
    result = from_cell(cell("static", compile=True), status, "CUDA graphs skipped" if status == ERROR else "")
    result.metrics.pop(Metric.COMPILE_CUDAGRAPH_SKIPS)
    if skips is not None:
        result.metrics[Metric.COMPILE_CUDAGRAPH_SKIPS] = skips
    code, lines = summarize(tmp_path, [result], device)
    assert code == (1 if problems else 0)
    shown = "-" if skips is None else f"{skips:.0f}"
    assert any(line.startswith("static compiled") and f"cudagraph skips {shown}" in line for line in lines), lines
    assert lines[-1] == f"{'FAILED' if problems else 'OK'}: {problems} problem(s)"


def test_compiled_cells_skipped_for_the_toolchain_are_counted_by_the_planners_reason(tmp_path):
    # The planner's own reasons: a node without a C compiler, and a model too short for the cell.
    no_compiler = LauncherToolchain(None, None, "/usr/include/python3.11", python_headers=True)
    launcher = launcher_problem(no_compiler, where="node 10.0.0.7")
    compiled_long = cell("static", compile=True, context=4096)
    shape = KvShape(30, 3, 64, max_positions=2048)  # the reason reads the same on any device
    too_long = skip_reason(compiled_long, "cpu", shape, lambda _: True)
    assert launcher and too_long and not too_long.startswith(launcher[:20])
    results = [
        from_cell(cell("static")),
        by_driver(cell("static", compile=True), SKIPPED, launcher),
        from_cell(cell("static", context=2048), started_at=200.0, ended_at=260.0),
        by_driver(cell("static", compile=True, context=2048), SKIPPED, launcher),
        from_cell(cell("static", context=4096), started_at=300.0, ended_at=360.0),
        by_driver(compiled_long, SKIPPED, too_long),  # its eager twin ran, but the toolchain is not why
    ]
    code, lines = summarize(tmp_path, results)
    assert "compiled cells skipped for the toolchain: 2" in lines
    assert sum(line.startswith("static compiled") and launcher[:100] in line for line in lines) == 2
    assert code == 0


def test_a_cell_whose_cuda_cannot_start_is_told_by_the_cells_own_error():
    """The summary matches the error's start against the class the cell raises, by name."""
    from kvsweep.cell.environment import CudaStartError

    assert CudaStartError.__name__ == smoke_summary.CUDA_START_ERROR


def cuda_start_error() -> str:
    """The error a cell records when CUDA cannot start: the cell's own code, with a failing initialiser."""
    from kvsweep.cell.environment import start_device
    from kvsweep.cell.run_cell import record_failure

    def driver_too_old():
        raise RuntimeError("The NVIDIA driver on your system is too old (found version 12040).")

    result = CellResult("id", cell(), OK)
    try:
        start_device("cuda", cuda_init=driver_too_old)
    except Exception as exc:
        record_failure(result, ERROR, exc)
    return result.error


@pytest.mark.parametrize(
    ("made", "problems", "says"),
    [
        (lambda: [from_cell(cell(), ERROR, cuda_start_error())], 0, "(as it should)"),
        # An error that names CUDA, from a kernel, is not CUDA failing to start.
        (lambda: [from_cell(cell(), ERROR, "RuntimeError: CUDA error: device-side assert triggered")], 1, "SHOULD BE"),
        (lambda: [by_driver(cell(), CRASHED, "cell process died (exit code 1)")], 1, "NOT THE DRIVER"),  # hidden
        (lambda: [by_driver(cell(), ERROR, cuda_start_error())], 1, "NOT THE DRIVER"),  # the text, not from a cell
        (lambda: [replace(from_cell(cell(), ERROR, cuda_start_error()), attempt=2)], 1, "FIRST ATTEMPT"),  # retried
        (lambda: [from_cell(cell(), ERROR, "ValueError: something else")], 1, "SHOULD BE"),
        (lambda: [], 1, "NO RESULT"),  # nothing came back at all
    ],
)
def test_a_cell_whose_cuda_cannot_start_must_come_back_as_its_own_first_error(tmp_path, made, problems, says):
    faulted = tmp_path / "cuda_init"
    journal = Journal(faulted)
    journal.write_header(SweepHeader("gpu_smoke", "key2", "kvsweep", "sqlite:///y.db", "cuda", ""))
    for result in made():
        journal.append(result)
    code, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--expect-cuda-init-error", str(faulted))
    assert any(line.startswith("CUDA that cannot start: ") and says in line for line in lines), lines
    assert lines[-1] == f"{'FAILED' if problems else 'OK'}: {problems} problem(s)" and code == (1 if problems else 0)


@pytest.mark.parametrize(
    ("threads", "threads_from", "cpus", "device", "problems"),
    [
        (2, "ray.cpus_per_cell", "4,5", "cuda", 0),
        (1, "ray.cpus_per_cell", "4,5", "cuda", 1),  # auto threads follow the 2 CPUs Ray reserved: not 1
        (3, "measure.threads", "4,5", "cuda", 1),  # 3 threads on 2 cores contend with themselves
        (1, "measure.threads", "4,5", "cuda", 0),  # fewer, as asked
        (4, "OMP_NUM_THREADS", "4,5,6,7", "cuda", 0),
        (8, "cpu affinity", "0,1", "cpu", 0),  # a CPU cell is not held to its slot
    ],
)
def test_on_cuda_a_cells_threads_fit_its_cpus(tmp_path, threads, threads_from, cpus, device, problems):
    cpus_from = "slot" if device == "cuda" else "shared"
    result = from_cell(cell(), torch_threads=threads, threads_from=threads_from, cpus=cpus, cpus_from=cpus_from)
    code, lines = summarize(tmp_path, [result], device)
    assert any(f"| cpus {cpus} ({cpus_from}) threads {threads}" in line for line in lines), lines
    assert lines[-1] == f"{'FAILED' if problems else 'OK'}: {problems} problem(s)" and code == (1 if problems else 0)
    assert not problems or any(line.startswith("THREADS: ") and f"{threads} threads" in line for line in lines)


# Published peaks (GB/s, NVIDIA's data sheets) and the window 0.3-1.1 x peak, worked by hand.
@pytest.mark.parametrize(
    ("device_name", "gbps", "device", "problems"),
    [
        ("NVIDIA H100 80GB HBM3", 2900.0, "cuda", 0),  # SXM, 3350: 87%
        ("NVIDIA H100 80GB HBM3", 3800.0, "cuda", 1),  # above 1.1 x 3350 = 3685: no memory is that fast
        ("NVIDIA H100 80GB HBM3", 900.0, "cuda", 1),  # below 0.3 x 3350 = 1005: a broken reading
        ("NVIDIA H100 PCIe", 2900.0, "cuda", 1),  # the PCIe card's 2000 (ceiling 2200), not the SXM's
        ("NVIDIA H200", 4300.0, "cuda", 0),  # 4800: 90%
        ("NVIDIA A100 80GB PCIe", 1700.0, "cuda", 0),  # the A100 80GB's 2039, not the A10's 600
        ("NVIDIA A100-SXM4-40GB", 1800.0, "cuda", 1),  # 40 GB: 1555, ceiling 1710.5
        ("NVIDIA L40S", 250.0, "cuda", 1),  # 864: floor 259.2; not the L4's 300
        ("NVIDIA L4", 250.0, "cuda", 0),  # 300: 83%
        ("Tesla T4", 280.0, "cuda", 0),  # 320
        ("NVIDIA H200 MIG 1g.18gb", 500.0, "cuda", 0),  # a slice's share of the bandwidth: printed only
        ("NVIDIA RTX PRO 6000 Blackwell", 50000.0, "cuda", 0),  # no published peak known here: printed only
        ("cpu", 20.0, "cpu", 0),
    ],
)
def test_the_copy_bandwidth_is_printed_and_held_to_the_gpus_published_peak(
    tmp_path, device_name, gbps, device, problems
):
    result = from_cell(cell(), device_name=device_name, cpus_from="slot" if device == "cuda" else "shared")
    result.metrics[Metric.MEM_BANDWIDTH_GBPS] = gbps
    code, lines = summarize(tmp_path, [result], device)
    assert any(line.startswith("dynamic ") and f" bw {gbps:.0f} GB/s" in line for line in lines), lines
    assert lines[-1] == f"{'FAILED' if problems else 'OK'}: {problems} problem(s)" and code == (1 if problems else 0)


def test_a_sweep_that_left_no_result_fails(tmp_path):
    code, lines = summarize(tmp_path, [])
    assert code == 1 and any(line.startswith("NO RESULTS in ") for line in lines)


def test_the_header_says_what_the_smoke_script_chose(tmp_path):
    chose = "torch build cu126 (CUDA 12.6) for driver 550.54.14 (CUDA 12.4)"
    _, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--setup", chose)
    assert lines[0].startswith("kvsweep GPU smoke, ") and "NVIDIA H100 80GB HBM3" in lines[0]
    assert lines[1] == f"setup: {chose}"


def test_the_cuda_init_check_passes_on_a_real_sweeps_injected_failure(run_sweep, tmp_path):
    """What the smoke script's second sweep does on a GPU, here on CPU: the check reads what a cell really sends."""
    run = run_sweep("grid.caches=[dynamic]", "+testing.faults=[{fault:cuda_init}]")
    code, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--expect-cuda-init-error", str(run.run_dir))
    assert any(line.startswith("CUDA that cannot start: dynamic ctx64 error (attempt 1): ") for line in lines), lines
    assert code == 0 and lines[-1] == "OK: 0 problem(s)"


def write_journal(folder: Path, results: list[CellResult]) -> Path:
    journal = Journal(folder)
    journal.write_header(SweepHeader("gpu_smoke", "key", "kvsweep", "sqlite:///x.db", "cuda", ""))
    for result in results:
        journal.append(result)
    return folder


def test_quantized_weights_must_occupy_exactly_what_the_planner_predicted(tmp_path):
    """Each scheme's cell: ok, and `weights_bytes` equal to `predicted_weights_bytes`; a byte off is a problem."""
    weights = [from_cell(replace(cell(), weights=w)) for w in ("bnb-nf4", "torchao-int4")]
    for result, stored in zip(weights, (1000.0, 1001.0), strict=True):
        result.metrics.update({Metric.WEIGHTS_BYTES: stored, Metric.PREDICTED_WEIGHTS_BYTES: 1000.0})
    folder = write_journal(tmp_path / "weights", weights)
    code, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--expect-weights", str(folder))
    assert any(line.startswith("quantized weights: bnb-nf4 ok") and "as it should" in line for line in lines)
    assert any(line.startswith("quantized weights: torchao-int4 ok") and "SHOULD EQUAL" in line for line in lines)
    assert code == 1 and lines[-1] == "FAILED: 1 problem(s)"


def workload_record(cache: str, requests: int, pool: float = 0.0, predicted: float = 0.0) -> CellResult:
    c = replace(cell(cache), workload="smoke", serving="sequential")
    result = from_cell(c)
    result.samples["requests"] = [{"ttft_ms": 10.0, "e2e_ms": 50.0} for _ in range(requests)]
    result.metrics.update({Metric.KV_CACHE_BYTES: pool, Metric.PREDICTED_KV_DEVICE_BYTES: predicted})
    return result


def test_the_workload_sweep_must_time_every_request_and_size_the_pool_as_planned(tmp_path):
    """8 requests asked for: a cell that timed 7 is a problem; a paged pool a byte off the planner's is one."""
    good = workload_record("dynamic", 8)
    short = workload_record("static", 7)
    pool_off = workload_record("paged", 8, pool=1001.0, predicted=1000.0)
    folder = write_journal(tmp_path / "workload", [good, short, pool_off])
    code, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--expect-workload", str(folder))
    assert any(line.startswith("workload: dynamic") and "as it should" in line for line in lines), lines
    assert any(line.startswith("workload: static") and "ALL 8 REQUESTS" in line for line in lines), lines
    assert any(line.startswith("workload: paged") and "PAGE POOL" in line for line in lines), lines
    assert code == 1 and lines[-1] == "FAILED: 2 problem(s)"


def test_a_split_cell_must_record_both_gpus_and_its_largest_peak(tmp_path):
    good = split_cell_record()  # placed over both GPUs, a peak on each, both metered and probed
    one_gpu = from_cell(cell("static"))  # ran on one GPU: no placement
    folder = write_journal(tmp_path / "split", [good, one_gpu])
    code, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--expect-split", str(folder))
    assert any("two GPUs per cell: dynamic" in line and "as it should" in line for line in lines), lines
    assert any("two GPUs per cell: static" in line and "PLACEMENT OVER 2 GPUS" in line for line in lines), lines
    assert code == 1 and lines[-1] == "FAILED: 1 problem(s)"


# --- What only a GPU shows, read back from each cell's record: NVML after fork, energy, NUMA, both GPUs of a
# split cell. The records are made by the cell's own code on NVML's stand-in (fake_nvml.py) where it writes them.


def energy_unknown(nvml: FakeNvml) -> str:
    """The `kvsweep.energy` tag a cell writes when its counter cannot be had: the cell's own reason."""
    from kvsweep.measure.energy import nvml_energy_counter

    return f"unknown: {nvml_energy_counter('cuda', ('GPU-a',), nvml)}"


def test_the_summary_matches_the_cells_own_energy_reasons_by_their_start():
    from kvsweep.measure.energy import NO_COUNTER, NVML_DID_NOT_START

    assert (smoke_gpu_readings.NO_COUNTER, smoke_gpu_readings.NVML_DID_NOT_START) == (NO_COUNTER, NVML_DID_NOT_START)


@pytest.mark.parametrize(
    ("nvml", "problems", "says"),
    [
        ("restarted", 0, None),
        ("failed to start: NVMLError_DriverNotLoaded: Driver Not Loaded", 1, "NVML DID NOT START IN THE FORKED CELL"),
        (None, 1, "NVML NOT RESTARTED IN THE FORKED CELL"),  # a forked cell that never said
    ],
)
def test_a_forked_cell_whose_nvml_did_not_start_afresh_fails(tmp_path, nvml, problems, says):
    result = from_cell(cell())
    if nvml is None:
        result.environment.pop("nvml")
    else:
        result.environment["nvml"] = nvml
    code, lines = summarize(tmp_path, [result])
    assert lines[-1] == f"{'FAILED' if problems else 'OK'}: {problems} problem(s)" and code == (1 if problems else 0)
    assert not says or any(line.startswith("dynamic ") and says in line for line in lines), lines


def test_a_gpu_without_an_energy_counter_is_said_and_nvml_that_did_not_start_fails(tmp_path):
    no_counter = from_cell(cell("dynamic"))
    no_counter.tags[ResultTag.ENERGY] = energy_unknown(FakeNvml([FakeGpu("GPU-a", energy_mj=None)]))
    no_nvml = from_cell(cell("static"), started_at=200.0, ended_at=260.0)
    no_nvml.tags[ResultTag.ENERGY] = energy_unknown(FakeNvml([FakeGpu("GPU-a")], starts=False))
    for result in (no_counter, no_nvml):
        result.metrics.pop(Metric.JOULES_PER_TOKEN)
    code, lines = summarize(tmp_path, [no_counter, no_nvml])
    assert any(line.startswith("dynamic ") and "energy: this GPU offers no energy counter" in line for line in lines)
    assert any(line.startswith("static ") and "ENERGY UNKNOWN: NVML could not start" in line for line in lines)
    assert code == 1 and lines[-1] == "FAILED: 1 problem(s)"


@pytest.mark.parametrize(
    ("each", "says"),
    [
        ([0.20, 0.21, 0.22], "(repeats spread 10%)"),  # (0.22 - 0.20) / 0.21
        ([0.20, 0.30, 0.25], "(repeats spread 40%)  ENERGY SPREAD over 20%"),  # (0.30 - 0.20) / 0.25: said only
    ],
)
def test_the_repeats_energy_spread_is_said_not_failed(tmp_path, each, says):
    result = from_cell(cell())
    result.samples["energy"] = {"joules_per_gpu": [12.0], "tokens": 48, "joules_per_token_per_repeat": each}
    code, lines = summarize(tmp_path, [result])
    assert any(line.startswith("dynamic ") and f"J/token 0.25 {says}" in line for line in lines), lines
    assert code == 0


# (the GPU's node as the cell read it, the node its actor asked for, the nodes of its CPUs), problems, says
@pytest.mark.parametrize(
    ("gpu_nodes", "asked", "cpus_on", "problems", "says"),
    [
        ("1", 1, "1", 0, "NUMA: 1 of 1 cells with a CPU slot had it on their GPU's node (0 where"),
        ("1", 0, "0", 1, "its actor asked for node 0, its GPU hangs off node 1"),  # the actor's lookup is wrong
        ("1", 1, "0", 1, "CPUs on node(s) 0, its GPU on node 1"),  # asked right, placed wrong (or the node full)
        ("-1", -1, "0", 0, "NUMA: 0 of 1 cells with a CPU slot had it on their GPU's node (1 where"),  # not known
    ],
)
def test_on_cuda_a_cells_cpus_sit_on_its_gpus_numa_node(tmp_path, gpu_nodes, asked, cpus_on, problems, says):
    numa = {"gpu_numa_nodes": gpu_nodes, "cpus_near_numa_node": asked, "cpus_numa_nodes": cpus_on}
    code, lines = summarize(tmp_path, [from_cell(cell(), **numa)])
    shown_on = "NUMA SLOT: " if problems else "NUMA: "  # a problem on a line of its own, else the count
    assert any(line.startswith(shown_on) and says in line for line in lines), lines
    assert lines[-1] == f"{'FAILED' if problems else 'OK'}: {problems} problem(s)" and code == (1 if problems else 0)


def memory_limit_tag(gpus: int) -> str:
    """What the cell's own code tags for an 8 GB limit on `gpus` GPUs of 80 GB."""
    from kvsweep.cell.memory_limit import memory_limit

    class Eighty:
        def total_memory(self, index: int) -> int:
            return 80 * 10**9

        def set_fraction(self, fraction: float, index: int) -> None:
            pass

    with memory_limit("cuda", 8.0, gpus, Eighty()) as how:
        return how


def test_a_split_cell_whose_memory_limit_capped_one_gpu_fails_the_summary(tmp_path):
    one_capped = split_cell_record()
    one_capped.tags[ResultTag.MEMORY_LIMIT] = memory_limit_tag(gpus=1)  # what kvsweep did before: GPU 0 only
    folder = write_journal(tmp_path / "split", [one_capped])
    code, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--expect-split", str(folder))
    assert any("THE MEMORY LIMIT SHOULD CAP BOTH GPUS" in line for line in lines), lines
    assert code == 1


def split_cell_record(second_energy: bool = True, second_probed: bool = True, joules: float | None = None):
    """A cell of the two-GPU sweep, its energy and sharing records made by the cell's own code on NVML's
    stand-in: the measured phase draws 300 J on the first GPU and 100 J on the second over 1,600 tokens."""
    from kvsweep.measure.energy import EnergyMeter, EnergyReads, nvml_energy_counter, per_token
    from kvsweep.measure.gpu_sharing import SharingProbe, nvml_processes

    gpus = [FakeGpu("GPU-a", pids=[42]), FakeGpu("GPU-b", pids=[42])]
    nvml = FakeNvml(gpus)
    meter = EnergyMeter(EnergyReads(nvml_energy_counter("cuda", ("GPU-a", "GPU-b"), nvml)))
    meter.start()
    gpus[0].energy_mj += 300_000
    gpus[1].energy_mj += 100_000 if second_energy else 0
    energy = per_token(meter.stop(), 1600)
    probe = SharingProbe(["GPU-a", "GPU-b"] if second_probed else ["GPU-a"], lambda u: nvml_processes(u, nvml), 42)
    result = from_cell(cell(), gpu_uuids="GPU-a,GPU-b", **probe.stop().record())
    result.tags[ResultTag.PLACEMENT] = "0-14 | 15-29"
    result.tags[ResultTag.MEMORY_LIMIT] = memory_limit_tag(gpus=2)
    result.metrics[Metric.JOULES_PER_TOKEN] = energy.joules_per_token if joules is None else joules
    result.samples = {
        "placement": {"devices": ["cuda:0", "cuda:1"], "layers": [[0, 14], [15, 29]], "predicted_peak_bytes": [5, 6]},
        "repeats": [{"peak_device_mem_bytes_per_gpu": [3, 4], Metric.PEAK_DEVICE_MEM_BYTES: 4}],
        "energy": energy.record(),
    }
    return result


@pytest.mark.parametrize(
    ("made", "problems", "says"),
    [
        (lambda: split_cell_record(), 0, "J per GPU 300.0 + 100.0 J/token 0.25"),  # (300 + 100) J / 1,600 tokens
        (lambda: split_cell_record(second_energy=False), 1, "SHOULD MEASURE ENERGY ON BOTH GPUS"),
        (lambda: split_cell_record(joules=300 / 1600), 1, "SHOULD BE BOTH GPUS' ENERGY OVER THE TOKENS"),  # one's
        (lambda: split_cell_record(second_probed=False), 1, "SHOULD PROBE BOTH GPUS FOR OTHER PROCESSES"),
    ],
)
def test_a_split_cell_must_meter_and_probe_both_gpus(tmp_path, made, problems, says):
    folder = write_journal(tmp_path / "split", [made()])
    code, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--expect-split", str(folder))
    assert any(line.startswith("two GPUs per cell: dynamic") and says in line for line in lines), lines
    assert lines[-1] == f"{'FAILED' if problems else 'OK'}: {problems} problem(s)" and code == problems


def test_the_summary_fails_a_cache_whose_bytes_on_the_device_are_not_the_planners_for_that_moment():
    """An offloaded tiny-llama cell, context 64, 4 new tokens, float32: when `generate` returns one of its 4 moved
    layers is on the device (67 tokens x 2 KV heads x 32 x K and V x 4 bytes); a prediction of the two layers of a
    decode step's peak is the mismatch the GPU run must show."""
    from kvsweep.models.resolve import classify, kv_shape, load_config
    from kvsweep.plan.cell_plan import plan_cell

    cell = Cell("tiny-llama", "float32", 64, 1, 4, "offloaded", False)
    one_layer = 67 * 2 * 32 * 2 * 4
    planned = plan_cell(cell, "cuda", kv_shape(load_config(classify("tiny-llama"))))
    assert planned.kv_device_bytes == one_layer
    measured = {Metric.KV_CACHE_DEVICE_BYTES: float(one_layer), Metric.KV_CACHE_HOST_BYTES: float(3 * one_layer)}
    right = CellResult("c", cell, OK, metrics={**measured, Metric.PREDICTED_KV_DEVICE_BYTES: float(one_layer)})
    assert smoke_summary.kv_device_reading(right) == ("", False)
    peak = CellResult("c", cell, OK, metrics={**measured, Metric.PREDICTED_KV_DEVICE_BYTES: float(2 * one_layer)})
    text, wrong = smoke_summary.kv_device_reading(peak)
    assert wrong and "KV ON DEVICE 0.033 MiB, PREDICTED 0.065 MiB" in text
