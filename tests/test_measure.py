"""The measurement primitives against independent references: numpy, known sizes, known clocks."""

import numpy as np
import pytest
import torch

from kvsweep.measure import peak_memory
from kvsweep.measure.cache_identity import cache_bytes
from kvsweep.measure.peak_memory import PeakMemoryMeter
from kvsweep.measure.sampling import TokenTimes
from kvsweep.measure.statistics import median, percentile
from kvsweep.redact import redact_uri


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], list(np.random.rand(17))])
@pytest.mark.parametrize("q", [0, 50, 90, 100])
def test_percentile_matches_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert median(values) == pytest.approx(float(np.median(values)))


def test_token_times_from_clock():
    ms = 1_000_000
    times = TokenTimes.from_clock(0, [10 * ms, 12 * ms, 15 * ms, 16 * ms], 17 * ms)
    assert times.ttft_ms == pytest.approx(10)
    assert times.gaps_ms == pytest.approx([2, 3, 1])
    assert times.tpot_ms == pytest.approx(2)
    assert times.e2e_ms == pytest.approx(17)


def test_host_peak_sees_a_transient_allocation():
    size = 256 * 1024 * 1024
    meter = PeakMemoryMeter(None)
    meter.start()
    before = meter.stop()
    meter.start()
    block = torch.ones(size // 4, dtype=torch.float32)
    del block
    peak = meter.stop()
    assert peak.host_rss_bytes - before.host_rss_bytes > 0.9 * size
    assert peak.device_bytes is None


def test_where_the_kernels_mark_cannot_be_reset_a_sampling_thread_stands_in_and_says_so(monkeypatch):
    monkeypatch.setattr(peak_memory, "reset_host_peak", lambda: "clear_refs refused (PermissionError)")
    meter = PeakMemoryMeter(None)
    meter.start()
    peak = meter.stop()
    assert peak.host_method == "sampled every 2 ms (clear_refs refused (PermissionError))"
    assert peak.host_rss_bytes > 0 and meter.sampler is None
    meter.start()  # a call that raises is never read: its sampling thread still ends
    thread = meter.sampler.thread
    meter.abandon()
    assert not thread.is_alive() and meter.sampler is None


class _Layer:
    def __init__(self, **tensors):
        self.__dict__.update(tensors)


class _Cache:
    def __init__(self, layers):
        self.layers = layers


def test_cache_bytes_counts_storages_once_and_walks_payloads():
    keys = torch.zeros(2, 4, 10, 8)  # 2560 bytes
    payload = (torch.zeros(100, dtype=torch.uint8), {"scale": torch.zeros(10, dtype=torch.float16), "n": 4})
    layer = _Layer(keys=keys, values=keys[:, :, :5], length=torch.tensor(3), q=payload)
    assert cache_bytes(_Cache([layer])).total == 2560 + 100 + 20
    assert cache_bytes(None).total == 0


def test_redact_uri():
    assert redact_uri("http://user:pass@host:5000/x") == "http://***@host:5000/x"
    assert "s3cr3t" not in redact_uri("https://host/api?token=s3cr3t&x=1")
    assert redact_uri("sqlite:////tmp/a/mlflow.db") == "sqlite:////tmp/a/mlflow.db"
