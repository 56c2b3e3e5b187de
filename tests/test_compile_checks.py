"""A compiled cell measures what compiling promises: CUDA graphs in use, and the same work timed as eager.

Inductor's skipped CUDA graphs are read from torch's counters (a counters mapping stands in for a GPU
run); the kept static cache's reset is watched through a stand-in device allocator, whose
`synchronize` the token clock calls when the timed region starts and at every token.
"""

from dataclasses import replace

import pytest
import torch

from kvsweep.caches import get_strategy
from kvsweep.cell.call_inputs import random_ids
from kvsweep.cell.checks import CudaGraphsSkipped, check_cudagraphs_used
from kvsweep.cell.generate_session import GenerateSession
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.measure.phase_meters import cudagraph_skips
from kvsweep.models.build import build_model
from kvsweep.models.resolve import classify
from kvsweep_testkit.cells import measure_cell

PROTO = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1).to_dict()


def test_skipped_cuda_graphs_are_read_from_inductors_counter():
    assert cudagraph_skips({"inductor": {"cudagraph_skips": 3, "pattern_matcher_count": 9}}) == 3
    assert cudagraph_skips({"stats": {"unique_graphs": 2}}) == 0  # nothing compiled by Inductor yet


def test_a_compiled_cuda_cell_that_skipped_cuda_graphs_fails_and_a_cpu_one_does_not():
    with pytest.raises(CudaGraphsSkipped, match="compile_cudagraph_skips") as failed:
        check_cudagraphs_used(1, cuda=True)
    assert "1 graph(s) without CUDA graphs" in str(failed.value)
    check_cudagraphs_used(0, cuda=True)
    check_cudagraphs_used(2, cuda=False)  # CPU graphs never use CUDA graphs: nothing was skipped that could run


@pytest.mark.slow
def test_inductor_counts_a_graph_it_runs_without_cuda_graphs_under_that_name():
    """The installed torch's own event: reduce-overhead asks for CUDA graphs, a CPU graph cannot have one."""
    before = cudagraph_skips()
    compiled = torch.compile(lambda x: torch.sin(x) * 2, mode="reduce-overhead", dynamic=False)
    compiled(torch.ones(8))
    assert cudagraph_skips() - before == 1


@pytest.mark.slow
def test_a_compiled_cpu_cell_records_no_skipped_cuda_graphs():
    cell = dict(model="tiny-llama", dtype="float32", context_length=32, batch_size=1, max_new_tokens=4)
    result = measure_cell(cell | {"cache": "static", "compile": True}, PROTO)
    assert result["status"] == "ok", result["error"]
    assert result["metrics"]["compile_cudagraph_skips"] == 0
    eager = measure_cell(cell | {"cache": "static", "compile": False}, PROTO)
    assert "compile_cudagraph_skips" not in eager["metrics"]


class CacheWatcher:
    """A device allocator stand-in that notes, at each synchronize, how many of the kept cache's first
    layer's keys are non-zero (None: no kept cache yet). A reset zeroes them all."""

    def __init__(self) -> None:
        self.session: GenerateSession | None = None
        self.nonzero_at_syncs: list[int | None] = []

    def synchronize(self) -> None:
        cache = self.session.kept_cache if self.session else None
        self.nonzero_at_syncs.append(None if cache is None else int(cache.layers[0].keys.count_nonzero()))

    def reset_peak(self) -> None:
        pass

    def peak_bytes(self) -> int:
        return 0


def test_the_kept_static_cache_is_emptied_inside_the_timed_region():
    """An eager static call builds and zero-fills its cache inside `generate`, after the clock starts; the
    compiled cell's one kept cache must be zero-filled there too, so both TTFTs include the fill."""
    cell = Cell("tiny-llama", "float32", 16, 1, 4, "static", True)
    model = build_model(classify(cell.model), cell.dtype, "cpu", seed=0)
    inputs = random_ids(model.config.vocab_size, cell.batch_size, cell.context_length, 0)
    watcher = CacheWatcher()
    session = GenerateSession(model, inputs, cell, "cpu", None, device_memory=watcher)
    watcher.session = session
    strategy = get_strategy("static")
    first = session.call(strategy)
    watcher.nonzero_at_syncs.clear()
    second = session.call(strategy)
    assert torch.equal(second.new_tokens, first.new_tokens)  # emptied before its prefill: the same answer
    # Every sync of the second call, the clock's start included, saw a cache holding keys: the zero fill
    # happened between the start and the first token. A reset before the clock shows a 0 at the start.
    assert watcher.nonzero_at_syncs and 0 not in watcher.nonzero_at_syncs, watcher.nonzero_at_syncs
    eager = GenerateSession(model, inputs, replace(cell, compile=False), "cpu", None).call(strategy)
    assert torch.equal(eager.new_tokens, first.new_tokens)
