"""Sweeps that survive a shared cluster: OOM inference, resume, interruption, MLflow outages, secrets."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import (
    FAST,
    cell_is_running,
    cell_runs,
    free_port,
    start_mlflow_server,
    statuses,
    stop,
    sweep_in_process,
    wait_until,
)
from kvsweep.cli import main
from kvsweep.tracking.journal import Journal

pytestmark = pytest.mark.heavy  # multi-process reliability: the heavy tier (CONTRIBUTING.md)

QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def test_oom_spares_larger_cells_of_the_same_family(run_sweep):
    run = run_sweep(
        "grid.context_lengths=[64,128]",
        "grid.batch_sizes=[1,2]",
        "grid.caches=[dynamic,static]",
        "+testing.faults=[{match: {cache: static, context_length: 64, batch_size: 1}, fault: oom}]",
    )
    assert run.code == 0
    _, children = cell_runs(run.tracking_uri)
    static = [c for c in children if c.data.params["cache"] == "static"]
    assert {c.data.tags["kvsweep.status"] for c in static} == {"oom"}
    inferred = [c for c in static if c.data.tags.get("kvsweep.inferred") == "true"]
    assert len(inferred) == 3  # ctx 128 bs 1, ctx 64 bs 2, ctx 128 bs 2 never ran
    assert all("inferred" in c.data.tags["kvsweep.error"] for c in inferred)
    assert all("repeats" not in c.data.metrics for c in inferred)
    assert {c.data.tags["kvsweep.status"] for c in children if c.data.params["cache"] == "dynamic"} == {"ok"}


def test_oom_inference_can_be_turned_off(run_sweep):
    run = run_sweep(
        "grid.context_lengths=[64,128]",
        "grid.caches=[static]",
        "infer_oom=false",
        "+testing.faults=[{match: {cache: static, context_length: 64}, fault: oom}]",
    )
    _, children = cell_runs(run.tracking_uri)
    assert statuses(run.tracking_uri, "context_length") == {"64": "oom", "128": "ok"}
    assert not any(c.data.tags.get("kvsweep.inferred") for c in children)


def test_same_command_resumes_and_rerun_starts_afresh(run_sweep):
    first = run_sweep("grid.caches=[dynamic,static]", "+testing.faults=[{match: {cache: static}, fault: error}]")
    assert first.code == 1
    parents, children = cell_runs(first.tracking_uri)
    assert statuses(first.tracking_uri, "cache") == {"dynamic": "ok", "static": "error"}
    dynamic_run = next(c for c in children if c.data.params["cache"] == "dynamic").info.run_id

    second = run_sweep("grid.caches=[dynamic,static]")  # same sweep, the error fixed
    assert second.code == 0
    assert "resuming: 1 of 2 cells" in second.out
    parents2, children2 = cell_runs(first.tracking_uri)
    assert [p.info.run_id for p in parents2] == [p.info.run_id for p in parents]  # parent reused
    assert len(children2) == 2  # the errored cell's child run was reused, not duplicated
    assert statuses(first.tracking_uri, "cache") == {"dynamic": "ok", "static": "ok"}
    assert next(c for c in children2 if c.data.params["cache"] == "dynamic").info.run_id == dynamic_run
    assert "static" in second.out and "ok" in second.out

    third = run_sweep("grid.caches=[dynamic,static]", "rerun=true")
    assert third.code == 0
    parents3, children3 = cell_runs(first.tracking_uri)
    assert len(parents3) == 2 and len(children3) == 4


SIX_CELLS = ("grid.caches=[dynamic,static,quantized-hqq-int4]", "grid.context_lengths=[64,128]")
THREE_CELLS = ("grid.context_lengths=[64]",)  # after SIX_CELLS: dynamic and static finish, hqq-int4 hangs


def _sweep_cmd(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kvsweep",
        *FAST,
        *SIX_CELLS,
        f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        *extra,
    ]


def _wait_for_lines(journal: Path, count: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if journal.exists() and len(Journal(journal.parent).read().results) >= count:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    raise AssertionError(f"journal never reached {count} results")


@pytest.mark.slow
def test_driver_killed_with_sigkill_then_rerun_completes_without_duplicates(tmp_path):
    env = {**os.environ, **QUIET}
    hang = "+testing.faults=[{match: {cache: quantized-hqq-int4, context_length: 64}, fault: hang}]"
    proc = subprocess.Popen(
        _sweep_cmd(tmp_path, f"hydra.run.dir={tmp_path}/a", hang, *THREE_CELLS),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _wait_for_lines(tmp_path / "a" / "journal.jsonl", 2, proc)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    wait_until(lambda: cell_is_running(uri, cache="quantized-hqq-int4", context_length=64), "the hung cell", proc)
    proc.kill()
    proc.wait(timeout=30)
    os.killpg(proc.pid, signal.SIGKILL) if _group_alive(proc.pid) else None  # Ray's processes with it
    before = {
        c.data.tags["kvsweep.cell_id"]
        for c in cell_runs(f"sqlite:///{tmp_path}/mlflow.db")[1]
        if "kvsweep.status" in c.data.tags
    }
    assert len(before) >= 2

    rerun = subprocess.run(
        _sweep_cmd(tmp_path, f"hydra.run.dir={tmp_path}/b", *THREE_CELLS),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    parents, children = cell_runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert len(parents) == 1 and len(children) == 3
    assert len({c.data.tags["kvsweep.cell_id"] for c in children}) == 3
    assert {c.data.tags["kvsweep.status"] for c in children} == {"ok"}
    assert f"resuming: {len(before)} of 3 cells" in rerun.stdout
    assert parents[0].info.status == "FINISHED"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_interrupt_kills_cells_marks_runs_killed_and_exits_fast(tmp_path):
    """SIGTERM, what a scheduler sends: Ray turns it into the same KeyboardInterrupt as Ctrl-C, so both go
    through one handler; which signal came (130 or 143) is checked for both without Ray below."""
    signum = signal.SIGTERM
    env = {**os.environ, **QUIET}
    hang = "+testing.faults=[{match: {cache: static, context_length: 64}, fault: hang}]"
    proc = subprocess.Popen(
        _sweep_cmd(tmp_path, f"hydra.run.dir={tmp_path}/a", hang),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _wait_for_lines(tmp_path / "a" / "journal.jsonl", 1, proc)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    wait_until(lambda: cell_is_running(uri, cache="static", context_length=64), "the hung static cell", proc)
    sent = time.monotonic()
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 30
    assert proc.returncode == 128 + signum, out  # the shell's convention: 130 after Ctrl-C, 143 after SIGTERM
    assert "interrupted" in out and "Run the same command again" in out
    parents, children = cell_runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert parents[0].info.status == "KILLED"
    hung = [c for c in children if c.data.params["cache"] == "static" and c.data.params["context_length"] == "64"]
    assert len(hung) == 1 and hung[0].info.status == "KILLED"
    assert Journal(tmp_path / "a").read().end["status"] == "KILLED"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_exit_code_names_the_signal_even_where_ray_replaces_the_exception(signum, code):
    from kvsweep.driver.sweep_finish import SignalInterrupts

    before = signal.getsignal(signum)
    interrupts = SignalInterrupts()
    with pytest.raises(KeyboardInterrupt), interrupts:
        try:
            os.kill(os.getpid(), signum)
            time.sleep(10)  # cut short: the handler raises as soon as the signal arrives
        except KeyboardInterrupt:
            raise KeyboardInterrupt() from None  # what ray.wait raises in place of the handler's exception
    assert (interrupts.name, interrupts.exit_code) == (signum.name, code)  # the README's 130/143
    assert signal.getsignal(signum) is before  # the driver's own handlers are back


def test_secrets_never_reach_mlflow_or_output(run_sweep, monkeypatch):
    secret = "hf_SuperSecretToken123"
    monkeypatch.setenv("HF_TOKEN", secret)
    run = run_sweep(f"grid.models=[tiny-llama,/models/{secret}/x]", "grid.caches=[dynamic]")
    _, children = cell_runs(run.tracking_uri)
    assert any(c.data.tags["kvsweep.status"] == "error" for c in children)
    for child in children:
        assert secret not in str(child.data.tags)
    assert secret not in run.out and secret not in run.err
    assert secret not in (run.run_dir / "journal.jsonl").read_text()
    assert secret not in (run.run_dir / ".hydra" / "config.yaml").read_text()
    assert "trust_remote_code=False" in run.out


def test_sync_is_idempotent_and_reports_what_it_sent(finished_sweep, capsys):
    """The shared sweep delivered all its 8 cells (2 contexts x 4 caches, skipped ones included)."""
    capsys.readouterr()
    assert main(["sync", str(finished_sweep.run_dir)]) == 0
    assert "sent 0, already in MLflow 8" in capsys.readouterr().out
    assert main(["sync", str(finished_sweep.run_dir.parent / "nope")]) == 2


def test_mlflow_server_down_mid_sweep_loses_nothing_after_sync(ray_cluster, cell_template, tmp_path, capsys):
    """The server goes away after the first result (stopped from a thread while the sweep runs here)."""
    port = free_port()
    server = start_mlflow_server(tmp_path, port)
    uri = f"http://127.0.0.1:{port}"
    journal = tmp_path / "a" / "journal.jsonl"

    def stop_after_first_result() -> None:
        wait_until(lambda: journal.exists() and Journal(journal.parent).read().results, "a first result")
        stop(server)

    stopper = threading.Thread(target=stop_after_first_result, daemon=True)
    stopper.start()
    try:
        run = sweep_in_process(tmp_path / "a", SIX_CELLS, uri)
    finally:
        stopper.join(timeout=300)
        stop(server)
    assert run.code == 0, run.out + run.err  # every cell reached a result; the sweep did not stop
    assert run.out.count("MLflow is not answering") == 1
    assert f"python -m kvsweep sync {tmp_path}/a" in run.out
    assert len(Journal(tmp_path / "a").read().results) == 6

    server = start_mlflow_server(tmp_path, port)  # the same store comes back
    try:
        capsys.readouterr()
        assert main(["sync", str(tmp_path / "a"), "--tracking-uri", uri]) == 0
        out = capsys.readouterr().out
        assert "already in MLflow" in out and "sent 0," not in out
        parents, children = cell_runs(uri)
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        assert len(children) == 6 and {c.data.tags["kvsweep.status"] for c in children} == {"ok"}
        assert len({c.data.tags["kvsweep.cell_id"] for c in children}) == 6

        assert main(["sync", str(tmp_path), "--tracking-uri", uri]) == 0
        assert "sent 0, already in MLflow 6" in capsys.readouterr().out
        assert len(cell_runs(uri)[1]) == 6  # nothing twice
    finally:
        stop(server)


@pytest.mark.slow
def test_host_ram_kill_by_rays_memory_monitor_is_host_oom(tmp_path):
    """A real kill: Ray's memory monitor with a threshold below what the node already uses."""
    env = {**os.environ, **QUIET, "RAY_memory_usage_threshold": "0.02", "RAY_memory_monitor_refresh_ms": "100"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvsweep",
            *FAST,
            "grid.caches=[dynamic]",
            "ray.max_retries=0",
            f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            f"hydra.run.dir={tmp_path}/r",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # oom is a result
    _, children = cell_runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert len(children) == 1
    tags = children[0].data.tags
    assert tags["kvsweep.status"] == "oom" and tags["kvsweep.oom_kind"] == "host"
    assert "memory monitor" in tags["kvsweep.error"]
