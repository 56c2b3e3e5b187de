"""scripts/gpu_smoke.sh's parts that need no GPU.

The interpreter and torch build it picks (sample nvidia-smi outputs), its CUDA check, the script itself
up to its first sweep (a fake `nvidia-smi` and a `pip` that only records), output paths, and what the
summary checks (journals written by hand, and real CPU sweeps).
"""

import io
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from mlflow import MlflowClient

from kvsweep.grid import Cell
from kvsweep.names import Metric, ResultTag
from kvsweep.results import CRASHED, ERROR, OK, OOM, SKIPPED, TIMEOUT, CellResult
from kvsweep.tracking.journal import Journal, SweepHeader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the smoke script's helpers, imported as they import each other
import cuda_starts  # noqa: E402
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


# --- The smoke script itself, up to the first sweep, on a copy of the checkout whose `pip` only records
# what it was asked and with an `nvidia-smi` that prints what a real node would.

HELPERS = ("gpu_smoke.sh", "smoke_paths.sh", "smoke_summary.py", "torch_for_driver.py", "cuda_starts.py")


def checkout(tmp_path: Path, with_venv: bool) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in HELPERS:
        shutil.copy2(ROOT / "scripts" / name, repo / "scripts" / name)
    shutil.copy2(ROOT / "pyproject.toml", repo / "pyproject.toml")
    if with_venv:  # this session's interpreter (torch without CUDA) behind a pip that records
        venv = repo / ".venv" / "bin"
        venv.mkdir(parents=True)
        (venv / "activate").write_text(f'PATH="{venv}:$PATH"\n')
        executable(venv / "python", f'exec "{sys.executable}" "$@"')
        executable(venv / "pip", f'echo "$*" >> "{tmp_path / "pip.log"}"')
    return repo


def executable(path: Path, body: str) -> None:
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)


def run_smoke(repo: Path, tmp_path: Path, nvidia_smi: str, **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    executable(fake / "nvidia-smi", nvidia_smi)
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX_URL", "TORCH_SPEC", "PYTHON")}
    environ.update(env, PATH=f"{fake}:{os.environ['PATH']}")
    return subprocess.run(
        [repo / "scripts/gpu_smoke.sh"], env=environ, capture_output=True, text=True, timeout=120, check=False
    )


def print_smi(text: str) -> str:
    return f"cat <<'SMI'\n{text}SMI"


def test_smoke_script_stops_in_one_line_when_no_python_is_new_enough(tmp_path):
    repo = checkout(tmp_path, with_venv=False)
    old = tmp_path / "old"
    old.mkdir()
    # One that ran the check and was too old, one too old to run it at all (an ancient python3).
    verdict = "python3.10 is Python 3.10.12, older than the 3.11 pyproject.toml requires"
    executable(old / "python3.10", f'echo "{verdict}"; exit 1')
    executable(old / "python3.6", '[ "$1" = --version ] && echo "Python 3.6.15"; exit 1')
    done = run_smoke(repo, tmp_path, print_smi(smi("550.54.14", "12.4")), PYTHON=f"{old}/python3.10 {old}/python3.6")
    assert done.returncode == 1
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert "Python 3.10.12, older than the 3.11" in done.stderr and "Python 3.6.15" in done.stderr
    assert "PYTHON=" in done.stderr and not (repo / ".venv").exists()


def test_smoke_script_stops_in_one_line_when_nvidia_smi_fails(tmp_path):
    repo = checkout(tmp_path, with_venv=False)
    failing = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9'
    done = run_smoke(repo, tmp_path, failing)
    assert done.returncode == 1 and done.stderr.splitlines() == [
        "gpu_smoke: nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    ]


@pytest.mark.slow  # imports torch twice (the CUDA check before and after the install)
def test_smoke_script_installs_the_drivers_build_first_and_stops_when_cuda_does_not_start(tmp_path):
    import torch

    repo = checkout(tmp_path, with_venv=True)
    done = run_smoke(repo, tmp_path, print_smi(smi("550.54.14", "12.4")))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("torch build cu126 (CUDA 12.6) for driver 550.54.14 (CUDA 12.4)")
    assert (tmp_path / "pip.log").read_text().splitlines() == [  # torch from the driver's index, then the project
        "uninstall -q -y torch",
        f"install -q --index-url {INDEX}/cu126 torch",
        "install -q -e .[quantized,test]",
    ]
    last = done.stderr.splitlines()[-1]
    assert last.startswith("CUDA does not start: driver 550.54.14 (CUDA 12.4), torch ") and torch.__version__ in last
    assert not (repo / "outputs").exists()  # no sweep started


@pytest.mark.slow
def test_smoke_script_installs_what_torch_index_url_and_torch_spec_name(tmp_path):
    repo = checkout(tmp_path, with_venv=True)
    mirror = "https://mirror.example/whl/cu126"
    done = run_smoke(repo, tmp_path, print_smi("garbled"), TORCH_INDEX_URL=mirror, TORCH_SPEC="torch==2.13.0")
    assert done.returncode == 1
    assert f"install -q --index-url {mirror} torch==2.13.0" in (tmp_path / "pip.log").read_text().splitlines()


# --- What the summary checks, on journals written by hand: one result per situation a GPU run can meet.


def cell(cache: str = "dynamic", compile: bool = False, context: int = 1024) -> Cell:
    return Cell("HuggingFaceTB/SmolLM2-135M", "bfloat16", context, 1, 32, cache, compile)


def from_cell(cell: Cell, status: str = OK, error: str = "", forked: bool = True, **environment) -> CellResult:
    """A result the cell's own process sent back: the environment it and its actor record."""
    env = {"device_name": "NVIDIA H100 80GB HBM3", "torch_version": "2.14.1+cu126", "torch_threads": 2}
    env |= {"ray_node_id": "node-a", "started_at": 100.0, "ended_at": 160.0, "cpus": "4,5", "cpus_from": "slot"}
    env |= {"template": {"pid": 7}} if forked else {}
    metrics = {Metric.COMPILE_RECAPTURES: 0.0, Metric.COMPILE_CUDAGRAPH_SKIPS: 0.0} if cell.compile else {}
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


def test_compiled_cells_skipped_for_the_toolchain_are_counted_with_their_reason(tmp_path):
    triton = "torch.compile needs a C compiler and Python's headers for Triton's launcher: no cc on this node"
    quanto = "quantized-quanto-int4 needs a CUDA build of quanto's kernels: no nvcc"
    results = [
        from_cell(cell("static")),
        by_driver(cell("static", compile=True), SKIPPED, triton),
        from_cell(cell("dynamic"), started_at=200.0, ended_at=260.0),
        by_driver(cell("dynamic", compile=True), SKIPPED, triton),
        by_driver(cell("quantized-quanto-int4"), SKIPPED, quanto),  # skipped eager too: not compile's doing
        by_driver(cell("quantized-quanto-int4", compile=True), SKIPPED, quanto),
    ]
    code, lines = summarize(tmp_path, results)
    assert "compiled cells skipped for the toolchain: 2" in lines
    assert sum(line.startswith("static compiled") and "no cc on this node" in line for line in lines) == 1
    assert code == 0


@pytest.mark.parametrize(
    ("results", "problems"),
    [
        ([from_cell(cell(), ERROR, "RuntimeError: CUDA failed to initialise (injected)", forked=True)], 0),
        ([by_driver(cell(), CRASHED, "cell process died (exit code 1)")], 1),  # the reason hidden
        ([from_cell(cell(), ERROR, "ValueError: something else")], 1),  # an error, but not CUDA's
        ([], 1),  # nothing came back at all
    ],
)
def test_a_cell_whose_cuda_cannot_start_must_come_back_as_an_error_naming_cuda(tmp_path, results, problems):
    faulted = tmp_path / "cuda_init"
    journal = Journal(faulted)
    journal.write_header(SweepHeader("gpu_smoke", "key2", "kvsweep", "sqlite:///y.db", "cuda", ""))
    for result in results:
        journal.append(result)
    code, lines = summarize(tmp_path, [from_cell(cell())], "cuda", "--expect-cuda-init-error", str(faulted))
    assert any(line.startswith("CUDA that cannot start: ") for line in lines)
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
    assert any(line.startswith("CUDA that cannot start: dynamic ctx64 error: ") for line in lines), lines
    assert code == 0 and lines[-1] == "OK: 0 problem(s)"
