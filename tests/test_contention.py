"""Host contention, read from the kernel's real counters while real processes compete for the CPUs.

Expectations come from the physics of the host: a process spinning on one of n CPUs takes 1/n of
them; our own busy loop is ours, not others'; a cell measured beside as many spinners as it has
CPUs loses about half of them.
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kvsweep.grid import MeasureProtocol
from kvsweep.measure.contention import CallContention, HostEvidence, HostMeter, gpu_verdict, merge
from kvsweep_testkit.cells import measure_cell

CPUS = sorted(os.sched_getaffinity(0))
SPIN = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass"


@contextmanager
def spinners(count: int) -> Iterator[None]:
    """`count` CPU-bound processes on this process's CPUs (children inherit the affinity)."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        time.sleep(0.5)  # let them start spinning
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_one_spinner_takes_one_cpu_of_the_cells_cpus():
    meter = HostMeter()
    with spinners(1):
        meter.start()
        time.sleep(1.5)  # we take nothing; the spinner takes one CPU
        reading = meter.stop()
    assert reading is not None
    assert reading.other_share == pytest.approx(1 / len(CPUS), abs=0.12)
    assert reading.resolution < 0.02


@pytest.mark.slow
def test_our_own_busy_loop_is_not_counted_as_others():
    meter = HostMeter()
    meter.start()
    ours = time.process_time()
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        pass
    ours = time.process_time() - ours
    reading = meter.stop()
    assert reading is not None
    # Counted as others, the loop alone would be `ours` (about a CPU-second); a shared host's background
    # (a CI guest has shown 0.2 CPU-s in such a second) stays well under half of it.
    assert ours > 0.8
    assert reading.other_s < 0.5 * ours, (reading, ours)


def test_no_counters_means_unknown_never_a_silent_pass(tmp_path):
    meter = HostMeter(path=str(tmp_path / "no-proc-stat"))
    meter.start()
    assert meter.stop() is None
    verdict, text = HostEvidence([None], limit=0.1).verdict()
    assert verdict == "unknown" and "unknown" in text
    assert HostEvidence([None], limit=0.1).metrics() == {}


def test_a_niced_cell_yields_to_anyone_so_any_other_work_counts():
    slight = CallContention(other_s=0.06, steal_s=0.0, capacity_s=1.0, cpus=1)  # 6% of one CPU-second
    assert HostEvidence([slight], limit=0.10).verdict()[0] == "false"
    verdict, text = HostEvidence([slight], limit=0.10, niceness=15).verdict()
    assert verdict == "true" and "nice 15" in text


def test_gpu_and_host_evidence_merge_into_one_verdict():
    clean = ("false", "host 0.01, steal 0.00")
    seen = gpu_verdict("true", {"GPU-a": [5678, 1234]})
    assert merge(clean, seen) == ("true", "host 0.01, steal 0.00; gpu pids 1234,5678")
    assert merge(clean, gpu_verdict("unknown", {}))[0] == "unknown"
    assert merge(("true", "host 0.62, steal 0.00"), gpu_verdict("unknown", {}))[0] == "true"
    assert merge(clean, None) == clean


CELL = {
    "model": "tiny-llama",
    "dtype": "float32",
    "context_length": 256,
    "batch_size": 1,
    "max_new_tokens": 16,
    "cache": "dynamic",
    "compile": False,
}
GUARDED = (
    MeasureProtocol.exact(warmup=1, repeats=3, seed=0, device="cpu", threads=0)
    .with_measure(max_host_contention=0.10, max_discarded=3)
    .to_dict()
)


@pytest.mark.slow
def test_a_cell_beside_spinners_is_re_measured_then_tagged_contended():
    with spinners(len(CPUS)):
        result = measure_cell(CELL, GUARDED)
    assert result["status"] == "ok", result["error"]
    metrics, tags, samples = result["metrics"], result["tags"], result["samples"]
    # As many spinners as CPUs: the cell's threads get about half of them.
    assert metrics["host_other_cpu_share"] > 0.3
    assert metrics["discarded_calls"] == 3  # the whole re-run budget was spent
    assert tags["kvsweep.contended"] == "true"
    assert tags["kvsweep.contention"].startswith("host 0.")
    # Nothing lost: the discarded calls are kept, each with what it saw.
    assert len(samples["discarded"]) == 3
    assert all(s["host_other_cpu_share"] > 0.10 + s["contention_resolution"] for s in samples["discarded"])
    assert len(samples["repeats"]) == metrics["repeats"] == 3


@pytest.mark.slow
def test_the_same_cell_on_a_quiet_host_is_not_tagged_and_its_intervals_bracket_its_medians():
    result = measure_cell(CELL, GUARDED)
    assert result["status"] == "ok", result["error"]
    metrics = result["metrics"]
    assert result["tags"]["kvsweep.contended"] == "false", result["tags"]["kvsweep.contention"]
    assert metrics["host_other_cpu_share"] < 0.10
    for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert metrics[f"{name}_ci_low"] <= metrics[name] <= metrics[f"{name}_ci_high"]
        assert metrics[f"{name}_ci_low"] < metrics[f"{name}_ci_high"]


@pytest.mark.slow
def test_a_precision_target_is_measured_to_and_recorded():
    # +-50%: any quiet cell gets there
    loose = MeasureProtocol.from_dict(GUARDED).with_measure(target_rel_ci=0.5, max_repeats=30).to_dict()
    result = measure_cell(CELL, loose)
    assert result["tags"]["kvsweep.ci_target"] == "met"
    assert result["metrics"]["repeats"] >= 6  # the fewest samples with a true 95% interval
    assert "kvsweep.ci_target" not in measure_cell(CELL, GUARDED)["tags"]  # no target, no claim
