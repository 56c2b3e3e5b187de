"""Adding a strategy is one registry entry plus, at most, one byte-accounting function.

Here a test registers an HQQ 3-bit cache with groups of 32 under its own name, with its own byte
accounting written by hand, and sees it planned, run on a fresh Ray actor, logged to MLflow and
reported exactly like a built-in.
"""

import pytest

from conftest import cell_runs
from kvsweep.caches import CacheStrategy, Requirements, get_strategy, registered
from kvsweep.caches.accounting import quantized_bytes
from kvsweep.caches.strategy import KvDims


def hqq_3bit_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """HQQ packs 3-bit codes ten to an int32 down a group's 32 rows (padded to 40): 4 int32 per column."""

    def codes(elements: int, axis: int) -> int:
        return 4 * (elements // 32) * 4

    return quantized_bytes(strategy, shape, batch, dtype, prompt, decoded, codes)


NAME = "hqq-int3-g32"
HQQ_INT3 = CacheStrategy(
    name=NAME,
    family="quantized",
    implementation="quantized",
    stored_bytes=hqq_3bit_bytes,
    cache_class="QuantizedCache",
    layer_class="HQQQuantizedLayer",
    requires=Requirements(package="hqq", extra="quantized"),
    backend="hqq",
    nbits=3,
    q_group_size=32,
)
GRID = ["grid.models=[tiny-llama]", "grid.dtypes=[bfloat16]", "grid.context_lengths=[100]", "grid.max_new_tokens=[32]"]


def test_an_unregistered_strategy_is_refused_in_one_line(run_sweep):
    run = run_sweep(*GRID, f"grid.caches=[{NAME}]")
    assert run.code != 0
    line = next(line for line in run.err.splitlines() if NAME in line)
    assert "unknown cache" in line and "quantized-hqq-int4" in line  # names what is allowed


def test_a_registered_strategy_is_planned_run_logged_and_reported(run_sweep):
    # By hand, tiny-llama (4 layers, 2 KV heads of 32) in bf16, 100 prompt tokens and 31 decoded:
    # the 100 prompt tokens are quantized, 31 decoded ones stay in the residual.
    # Per K or V tensor of a layer: 2*32*100 = 6400 elements = 200 groups of 32;
    # codes 4 int32 x 200 columns = 3200 B; a scale and a zero per group in bf16 = 800 B.
    # 8 tensors x 4000 B = 32,000 B, plus the residual 2*4*2*32*31*2 B = 31,744 B.
    expected = 32_000 + 31_744
    with registered(HQQ_INT3):
        dry = run_sweep(*GRID, f"grid.caches=[dynamic,{NAME}]", "dry_run=true")
        run = run_sweep(*GRID, f"grid.caches=[dynamic,{NAME}]")
    assert dry.code == 0 and NAME in dry.out
    assert run.code == 0, run.out + run.err

    _, children = cell_runs(run.tracking_uri)
    cell = next(c for c in children if c.data.params["cache"] == NAME)
    assert cell.data.tags["kvsweep.status"] == "ok"
    assert cell.data.tags["kvsweep.cache_class"] == "QuantizedCache/HQQQuantizedLayer nbits=3 q_group_size=32"
    assert cell.data.metrics["predicted_kv_device_bytes"] == expected  # planned
    assert cell.data.metrics["kv_cache_bytes"] == expected  # measured on the real cache

    selection = (run.run_dir / "report" / "selection.md").read_text()
    assert NAME in selection
    assert NAME in (run.run_dir / "results.csv").read_text()
    with pytest.raises(KeyError):
        get_strategy(NAME)  # the registration ended with its block
