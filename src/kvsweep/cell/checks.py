"""Checks that a cell's numbers belong to the strategy it names, and the tags that say so.

- the cache `generate` returned is the one the strategy registry says it must produce;
- a compiled cell really compiled (torch's own counter of compiled graphs), and compiled nothing
  more while it was measured (`compile_recaptures`);
- a compiled CUDA cell ran its graphs as CUDA graphs (`compile_cudagraph_skips`);
- decode did not move more bytes per second than the device can (`kvsweep.implausible`);
- how each host peak was taken (`kvsweep.host_peak`).
"""

from typing import Any

from kvsweep.caches import CacheStrategy
from kvsweep.cell.generate_session import GenerateSession, MeasuredCall
from kvsweep.grid import Cell
from kvsweep.measure.bandwidth import Bandwidth
from kvsweep.measure.cache_identity import mismatch
from kvsweep.measure.decode_bound import implausible
from kvsweep.measure.peak_memory import HWM
from kvsweep.names import ResultTag


class WrongCacheError(Exception):
    """`generate` ran something other than what the cell asked for (a silent fallback)."""


def check_cache(strategy: CacheStrategy, call: MeasuredCall, cell: Cell) -> None:
    problem = mismatch(strategy, call.identity, cell.cached_tokens)
    if problem is not None:
        raise WrongCacheError(problem)


def check_compiled(strategy: CacheStrategy, session: GenerateSession) -> int:
    """After the cold call of a compiled cell: the graphs torch.compile produced in this process.

    Zero graphs (dynamo disabled, compile skipped by generate) or, on CPU, a compiled forward that
    was never called means the cell ran eager: an error, not a number labelled compiled.
    """
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"]["unique_graphs"])
    bypassed = not session.cuda and session.compiled_calls == 0
    if graphs == 0 or bypassed:
        raise WrongCacheError(f"asked for {strategy.name} compiled, but generate ran it eagerly (no graph compiled)")
    return graphs


class CompiledDuringMeasurement(Exception):
    """A compiled cell recompiled or re-captured a CUDA graph while being measured: its TPOT holds compiler work."""


def check_no_recapture(recaptures: int) -> None:
    if recaptures:
        raise CompiledDuringMeasurement(
            f"{recaptures} graph compilation(s) or CUDA graph recording(s) during the measured calls: the timings "
            "include compiler work (its numbers are logged; compile_recaptures says how many)"
        )


class CudaGraphsSkipped(Exception):
    """A compiled CUDA cell ran a graph without CUDA graphs: it measured kernel launches that compile removes."""


def check_cudagraphs_used(skips: int, cuda: bool) -> None:
    """`skips` from before the cold call to the end of the measured calls; CPU graphs have no CUDA graphs."""
    if skips and cuda:
        raise CudaGraphsSkipped(
            f"Inductor ran {skips} graph(s) without CUDA graphs (TORCH_LOGS=cudagraphs says why): the calls "
            "launched every kernel one by one, so they do not measure the compiled strategy (their numbers are "
            "logged; compile_cudagraph_skips says how many)"
        )


def cell_tags(runs: list[MeasuredCall], metrics: dict[str, float], bandwidth: Bandwidth) -> dict[str, Any]:
    methods = sorted({run.peak.host_method for run in runs})
    return {
        ResultTag.CACHE_CLASS: runs[-1].identity.tag,
        ResultTag.IMPLAUSIBLE: str(implausible(metrics, bandwidth)).lower(),
        ResultTag.HOST_PEAK: HWM if methods == [HWM] else "; ".join(m for m in methods if m != HWM),
    }
