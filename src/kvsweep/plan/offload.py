"""What an offloaded cache costs the host: pinned memory, and every layer over the host link per token.

Transformers' offloaded caches (`offloading=True`) keep each layer in host memory between uses: before layer i's
update the next layer is prefetched to the device (`.to(device, non_blocking=True)` on a side stream), and after
it layer i goes back (`.to("cpu", non_blocking=True)`). So the prefill writes the whole cache to the host, and each
decode step moves every offloaded layer there and back, whole (docs/cluster.md: 137 GB per token at 131k tokens).
A step's bytes are `kv_prediction.decode_kv_traffic`'s host-link figure, the one the cell reports, so prediction
and measurement compare. Which layers move: `caches/layer_tokens.py`. The predicted time is these transfers alone
over the most calls the measurement rules allow: each call takes at least that, so a cell predicted within its
timeout may still pass it; one predicted beyond it would pass it if it made every call its rules allow.

Pinned memory: a non-blocking copy from the GPU allocates its host tensor from CUDA's caching host allocator, which
rounds each block up to a power of two, reuses a freed block only for a request of the same rounded size, and keeps
freed blocks until the process ends. Every offload allocates anew (a dynamic layer grows by `torch.cat`; a static
one comes back at its reserved size), so the peak holds, per layer's keys and values, one block of every rounded
size the tensor takes in a call. From 4k to 64k tokens a long_context layer's keys after the prefill are exactly a
power of two, so the first decoded token moves them to the next one beside the cached prefill-size blocks: at
65,536 x 4, 64 x (2**29 + 2**30) bytes = 103 GB, not 64. Each cell has its own process, so that is its peak. (A
freed block is reused only once the copy that read it is done: a host thread far ahead of its copies can briefly
hold more.)
"""

import math
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from kvsweep.caches import CacheStrategy
from kvsweep.caches.layer_tokens import kept_tokens, offloads, token_bytes, windows
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.inputs.spec import RANDOM, kind_of, suite_of
from kvsweep.models.shape import KvShape
from kvsweep.plan.kv_prediction import decode_kv_traffic
from kvsweep.units import GB

COLD_CALLS = 1
QUALITY_CALLS = 1
GUARD_OFF = 1.0  # `max_host_contention` at which no call is ever discarded


@dataclass(frozen=True)
class CallCount:
    """The worst case of one cell's calls, by kind."""

    cold: int
    warmup: int
    kept: int
    discarded: int
    quality: int
    task: int = 0  # task prompts' calls (a text-fed cell)

    @property
    def measured(self) -> int:
        return self.kept + self.discarded

    @property
    def total(self) -> int:
        return self.cold + self.warmup + self.measured + self.quality + self.task


def task_calls(cell: Cell, protocol: MeasureProtocol) -> int:
    """Calls a cell makes to answer its task prompts: whole batches of at least `quality_trials` prompts of each
    task it runs (none in a workload cell: a prompts file's answers are scored on the replay's own output)."""
    trials = protocol.inputs.quality_trials
    if cell.inputs == RANDOM or trials <= 0 or cell.is_workload:
        return 0
    tasks = len(suite_of(kind_of(cell.inputs), protocol.inputs)) or 1  # a prompts file is one task
    return tasks * math.ceil(trials / cell.batch_size)


def most_kept(protocol: MeasureProtocol, call_s: float) -> int:
    """Kept calls before the measured phase stops by itself (no time cap)."""
    cap = protocol.measure.repeat_cap
    if protocol.measure.target_rel_ci > 0 or call_s <= 0:
        return cap
    return min(cap, max(protocol.measure.repeats, math.ceil(protocol.measure.min_duration_s / call_s)))


def most_discarded(protocol: MeasureProtocol) -> int:
    """Calls the phase may discard and re-run: `max_discarded`, or none with the contention guard off."""
    return protocol.measure.max_discarded if protocol.measure.max_host_contention < GUARD_OFF else 0


def most_measured(protocol: MeasureProtocol, call_s: float) -> int:
    """Measured calls, kept and discarded, under every rule of the phase, the time cap included."""
    discarded = most_discarded(protocol)
    unbounded = most_kept(protocol, call_s) + discarded
    if protocol.measure.max_duration_s <= 0 or call_s <= 0:
        return unbounded
    until_cap = math.ceil(protocol.measure.max_duration_s / call_s)
    return min(unbounded, max(protocol.measure.repeats + discarded, until_cap))


def worst_case_calls(protocol: MeasureProtocol, call_s: float, tasks: int = 0) -> CallCount:
    """Every call a cell makes when every discard it may re-run is re-run; `call_s`: a lower bound on one
    call's time (fewer seconds per call, more calls to reach the time floor: the count stays an upper bound);
    `tasks`: the cell's `task_calls`."""
    measured = most_measured(protocol, call_s)  # never fewer than repeats + the discards
    discarded = most_discarded(protocol)
    return CallCount(COLD_CALLS, protocol.measure.warmup, measured - discarded, discarded, QUALITY_CALLS, tasks)


@dataclass(frozen=True)
class OffloadEstimate:
    host_bytes: int  # pinned host blocks alive at the peak (`pinned_host_bytes`)
    prefill_bytes: float  # the prefill's cache to the host, and its first layer back to the device
    moved_bytes_per_token: float  # to the device and back, every layer, averaged over the decode
    seconds_per_token: float  # at the configured host link speed
    call_seconds: float  # one call's transfers alone: its prefill and its decode steps
    calls: CallCount  # the most calls the cell can make
    cell_seconds: float  # call_seconds x every one of those calls: the transfers alone


@dataclass(frozen=True)
class HostLimits:
    """What bounds an offloaded cell on a GPU node: its host memory, link speed, the cell's time and calls."""

    memory_bytes: int | None
    link_gbps: float
    timeout_s: float
    protocol: MeasureProtocol  # how the cell is measured: how many calls it can make


def host_limits(planner_memory_gb: float, link_gbps: float, timeout_s: float, protocol: MeasureProtocol) -> HostLimits:
    """The configured host memory, else this machine's (the driver usually runs on a node like the others)."""
    memory = int(planner_memory_gb * GB) if planner_memory_gb > 0 else physical_memory_bytes()
    return HostLimits(memory, link_gbps, timeout_s, protocol)


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def pinned_host_bytes(cell: Cell, strategy: CacheStrategy, shape: KvShape) -> int:
    """Every offloaded layer's keys and values, one block for each power of two they are rounded to during a
    call: after the prefill (decoded 0) and after each decode step (see the module docstring). Layers the
    cache keeps on the device (a static cache's sliding layers, state layers) take no pinned memory."""
    half_token = token_bytes(shape, cell.batch_size, cell.dtype) // 2  # one token of one layer's K (or V)
    blocks = 0
    for window, count in Counter(w for w in windows(shape) if offloads(strategy, w)).items():
        sizes = {next_power_of_two(half_token * tokens) for tokens in _tokens_after_each_step(cell, strategy, window)}
        blocks += 2 * count * sum(sizes)
    return blocks


def prefill_bytes(cell: Cell, strategy: CacheStrategy, shape: KvShape) -> float:
    """The prefill offloads every offloaded layer once, then prefetches the first of them for the next step."""
    one = token_bytes(shape, cell.batch_size, cell.dtype)
    moved = [w for w in windows(shape) if offloads(strategy, w)]
    after_prefill = [one * next(_tokens_after_each_step(cell, strategy, w)) for w in moved]
    return float(sum(after_prefill) + (after_prefill[0] if after_prefill else 0))


def _tokens_after_each_step(cell: Cell, strategy: CacheStrategy, window: int | None) -> Iterator[int]:
    """Tokens a layer with this window sends to the host after the prefill (decoded 0), then after each decode
    step (a static layout: its full allocation every time, `CacheStrategy.allocated_steps`)."""
    for decoded in range(cell.max_new_tokens):
        yield kept_tokens(strategy, window, cell.context_length, strategy.allocated_steps(cell.max_new_tokens, decoded))


def estimate_offload(
    cell: Cell, strategy: CacheStrategy, shape: KvShape, link_gbps: float, protocol: MeasureProtocol
) -> OffloadEstimate | None:
    """None for a cache that does not offload."""
    if not strategy.offloading:
        return None
    link = link_gbps * GB
    prefill = prefill_bytes(cell, strategy, shape)
    traffic = decode_kv_traffic(strategy, shape, cell.batch_size, cell.dtype, cell.context_length, cell.max_new_tokens)
    moved = traffic.host_link_bytes  # there and back
    decode_steps = cell.max_new_tokens - 1  # the first token comes from the prefill
    call_s = (prefill + decode_steps * moved) / link
    calls = worst_case_calls(protocol, call_s, task_calls(cell, protocol))
    host = pinned_host_bytes(cell, strategy, shape)
    return OffloadEstimate(host, prefill, moved, moved / link, call_s, calls, calls.total * call_s)


def offload_problem(estimate: OffloadEstimate, timeout_s: float, host_memory_bytes: int | None) -> str | None:
    """Why an offloaded cell cannot finish here, or None."""
    if host_memory_bytes and estimate.host_bytes > host_memory_bytes:
        return (
            f"predicted host oom: offloaded layers need {estimate.host_bytes / GB:.1f} GB of pinned host memory "
            f"(blocks round up to powers of two; the prefill's stay cached) of {host_memory_bytes / GB:.1f} GB"
        )
    if timeout_s > 0 and estimate.cell_seconds > timeout_s:
        calls = estimate.calls
        return (
            f"predicted timeout: {estimate.moved_bytes_per_token / GB:.1f} GB to the device and back per token "
            f"({estimate.seconds_per_token:.2f} s at planner.host_link_gbps) and {estimate.prefill_bytes / GB:.1f} GB "
            f"per prefill make {estimate.call_seconds:.0f} s of host-link transfers per call; over the cell's "
            f"{calls.total} calls at most (cold {calls.cold}, warmup {calls.warmup}, measured {calls.kept} + "
            f"{calls.discarded} re-run, quality {calls.quality}) the transfers alone take "
            f"{estimate.cell_seconds:.0f} s, beyond ray.cell_timeout_s={timeout_s:g}; "
            "shorten the context or raise the timeout"
        )
    return None
