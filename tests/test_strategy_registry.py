"""Adding a strategy is one registry entry plus, at most, one byte-accounting function.

Here a test registers HQQ's 3-bit cache, which no built-in entry covers and whose codes pack
differently from every other backend's, and sees it planned, run on a fresh Ray actor, logged to
MLflow and reported exactly like a built-in.
"""

import pytest

from conftest import cell_runs
from kvsweep.caches import CacheStrategy, Requirements, get_strategy, registered
from kvsweep.caches.accounting import quantized_bytes
from kvsweep.caches.strategy import KvDims


def hqq_3bit_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """HQQ packs 3-bit codes ten to an int32 down a group's 64 rows (padded to 70): 7 int32 per column."""

    def codes(elements: int) -> int:
        return 7 * (elements // 64) * 4

    return quantized_bytes(shape, batch, dtype, prompt, decoded, codes)


HQQ_INT3 = CacheStrategy(
    name="quantized-hqq-int3",
    family="quantized",
    implementation="quantized",
    stored_bytes=hqq_3bit_bytes,
    cache_class="QuantizedCache",
    layer_class="HQQQuantizedLayer",
    requires=Requirements(package="hqq", extra="quantized"),
    backend="hqq",
    nbits=3,
)
GRID = ["grid.models=[tiny-llama]", "grid.dtypes=[bfloat16]", "grid.context_lengths=[100]", "grid.max_new_tokens=[32]"]


def test_an_unregistered_strategy_is_refused_in_one_line(run_sweep):
    run = run_sweep(*GRID, "grid.caches=[quantized-hqq-int3]")
    assert run.code != 0
    line = next(line for line in run.err.splitlines() if "quantized-hqq-int3" in line)
    assert "unknown cache" in line and "quantized-hqq-int4" in line  # names what is allowed


def test_a_registered_strategy_is_planned_run_logged_and_reported(run_sweep):
    # By hand, tiny-llama (4 layers, 2 KV heads of 32) in bf16, 100 prompt tokens and 31 decoded:
    # the 100 prompt tokens are quantized, 31 decoded ones stay in the residual.
    # Per K or V tensor of a layer: 2*32*100 = 6400 elements = 100 groups of 64;
    # codes 7 int32 x 100 columns = 2800 B; a scale and a zero per group in bf16 = 400 B.
    # 8 tensors x 3200 B = 25,600 B, plus the residual 2*4*2*32*31*2 B = 31,744 B.
    expected = 25_600 + 31_744
    with registered(HQQ_INT3):
        dry = run_sweep(*GRID, "grid.caches=[dynamic,quantized-hqq-int3]", "dry_run=true")
        run = run_sweep(*GRID, "grid.caches=[dynamic,quantized-hqq-int3]")
    assert dry.code == 0 and "quantized-hqq-int3" in dry.out
    assert run.code == 0, run.out + run.err

    _, children = cell_runs(run.tracking_uri)
    cell = next(c for c in children if c.data.params["cache"] == "quantized-hqq-int3")
    assert cell.data.tags["kvsweep.status"] == "ok"
    assert (
        "HQQQuantizedLayer" in cell.data.tags["kvsweep.cache_class"]
        and "nbits=3" in cell.data.tags["kvsweep.cache_class"]
    )
    assert cell.data.metrics["predicted_kv_device_bytes"] == expected  # planned
    assert cell.data.metrics["kv_cache_bytes"] == expected  # measured on the real cache

    selection = (run.run_dir / "report" / "selection.md").read_text()
    assert "quantized-hqq-int3" in selection
    assert "quantized-hqq-int3" in (run.run_dir / "results.csv").read_text()
    with pytest.raises(KeyError):
        get_strategy("quantized-hqq-int3")  # the registration ended with its block
