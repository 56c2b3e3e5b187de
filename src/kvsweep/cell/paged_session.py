"""A `paged` cell's calls: the batch's requests through Transformers' continuous batching, timed by its own stamps.

One manager serves the whole cell, started once (its thread, pool and warmup are the server's start-up, not a
request's time) and stopped when the cell ends: a call adds the batch's rows as requests and waits for them. The
manager stamps every generated token (`record_timestamps`); a call's token k is when the last row had its k-th
token, so TTFT, TPOT and end-to-end time mean what they mean for a `generate` call of the same batch. The pool is
sized by `caches.paged_pool` (never from free memory), block sharing is off (a finished request's pages would
otherwise stay counted), and the pages in use are read after each scheduling step, where pages are taken.

Every other strategy of the cell (the dynamic baseline of the quality check) runs through `generate` as usual.
"""

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from kvsweep.caches import CacheStrategy
from kvsweep.caches.paged_pool import PagedPool, PagedReading, pool_for
from kvsweep.cell.generate_session import GenerateSession, MeasuredCall
from kvsweep.measure.cache_identity import CacheIdentity, KvBytes
from kvsweep.measure.sampling import TokenTimes
from kvsweep.testing.faults import InjectFault

RESULT_TIMEOUT_S = 600.0  # one call's requests; a hung generation thread fails the call instead of the cell's actor


class PagedSession(GenerateSession):
    """`GenerateSession` whose calls of a `paged` strategy go through one continuous batching manager."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.manager: Any = None
        self.calls = 0
        self.peak_blocks = 0
        self.peak_lock = threading.Lock()
        self.attention = ""

    def _pool(self, strategy: CacheStrategy) -> PagedPool:
        return pool_for(strategy, self.cell.batch_size, self.cell.context_length, self.cell.cached_tokens)

    def started(self, strategy: CacheStrategy) -> Any:
        """The manager, built and started on the first call: pool, warmup and thread before any clock runs."""
        if self.manager is not None:
            return self.manager
        from transformers import ContinuousBatchingConfig, GenerationConfig

        pool = self._pool(strategy)
        generation = GenerationConfig(do_sample=False, max_new_tokens=self.cell.max_new_tokens, eos_token_id=-1)
        config = ContinuousBatchingConfig(
            page_size=pool.page_size,
            num_blocks=pool.blocks,
            max_batch_tokens=pool.max_batch_tokens,
            allow_block_sharing=False,
            max_memory_percent=1.0,  # the pool is sized here; only a pool larger than the machine is refused
            auto_switch_to_flash=False,  # the model's own attention: no kernel fetched from the Hub on some nodes
        )
        manager = self.model.init_continuous_batching(generation_config=generation, continuous_batching_config=config)
        manager.warmup()  # builds the pool and the batch processor the generation thread then reuses
        processor = manager.batch_processor
        scheduled = processor.prepare_next_batch

        def prepare_next_batch(*args: Any, **kwargs: Any) -> Any:
            """Pages are taken when a step is scheduled: read how many are in use right after."""
            out = scheduled(*args, **kwargs)
            with self.peak_lock:  # the main thread zeroes it between calls
                self.peak_blocks = max(self.peak_blocks, _blocks_in_use(processor.cache))
            self.attention = str(getattr(self.model.config, "_attn_implementation", ""))
            return out

        processor.prepare_next_batch = prepare_next_batch
        manager.start()
        self.manager = manager
        return manager

    def close(self) -> None:
        """Stops the manager without waiting on requests still in flight (after an error there may be some); a
        stop that fails is not allowed to replace the cell's own error."""
        if self.manager is not None:
            manager, self.manager = self.manager, None
            with contextlib.suppress(Exception):
                manager.stop(block=True, timeout=60, hard_stop=True)

    @contextlib.contextmanager
    def model_attention(self) -> Iterator[None]:
        """The model's own attention for a `generate` call beside the manager (the dynamic baseline of the quality
        check): continuous batching switches an eager model to `paged|eager` until it stops, and its thread only
        idles between this cell's calls."""
        original = getattr(self.manager, "_original_attn_impl", None) if self.manager is not None else None
        if original is None:
            yield
            return
        switched = self.model.config._attn_implementation
        self.model.set_attn_implementation(original)
        try:
            yield
        finally:
            self.model.set_attn_implementation(switched)

    def _generate(self, strategy: CacheStrategy, *args: Any, **kwargs: Any) -> Any:
        with self.model_attention():
            return super()._generate(strategy, *args, **kwargs)

    def reset_peak(self) -> None:
        with self.peak_lock:
            self.peak_blocks = 0

    def _inject_fault(self) -> None:
        """A test's fault (oom, error, hang, exit) fires as it would at a `generate` call's first token:
        continuous batching runs none of our logits processors, so the seam is called here, once a call."""
        for processor in self.processors:
            if isinstance(processor, InjectFault) and processor.fault != "slow":
                processor(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1))

    def add_requests(self, strategy: CacheStrategy, items: list[tuple[str, list[int], int]]) -> None:
        """Requests of a workload replay: (id, prompt ids, tokens to generate), each timestamped by the manager."""
        manager = self.started(strategy)
        self._inject_fault()
        for request_id, prompt, new_tokens in items:
            manager.add_request(prompt, request_id=request_id, max_new_tokens=new_tokens, record_timestamps=True)

    def next_result(self, timeout: float | None = None) -> Any:
        """The next finished request, or None when `timeout` passes first; a failed request, or none within
        `RESULT_TIMEOUT_S` of waiting, is an error, never a missing sample."""
        if timeout is not None and timeout < RESULT_TIMEOUT_S:
            return self._checked(self.manager.get_result(timeout=timeout))
        out = self.manager.get_result(timeout=RESULT_TIMEOUT_S)
        if out is None:
            raise TimeoutError(f"continuous batching returned no request within {RESULT_TIMEOUT_S:g} s")
        return self._checked(out)

    @staticmethod
    def _checked(out: Any) -> Any:
        if out is None:
            return None
        if out.error:
            raise RuntimeError(f"continuous batching failed request {out.request_id}: {out.error}")
        return out

    def pool_reading(self, strategy: CacheStrategy) -> tuple[KvBytes, "PagedReading", CacheIdentity]:
        """The pool's bytes, the pages in use at the fullest moment since `peak_blocks` was zeroed, its identity."""
        cache = self.manager.batch_processor.cache
        kv = KvBytes(cache.cache_tensor.untyped_storage().nbytes(), 0)
        return kv, self._reading(strategy, cache), _identity(cache)

    def _requests(self, strategy: CacheStrategy, rows: torch.Tensor, new_tokens: int) -> tuple[float, list[Any]]:
        """Adds each row as a request and waits for all; (when the first was added, the finished outputs)."""
        manager = self.started(strategy)
        self._inject_fault()
        self.calls += 1
        ids = [f"call{self.calls}-row{i}" for i in range(rows.shape[0])]
        started = time.perf_counter()
        for request_id, row in zip(ids, rows.tolist(), strict=True):
            manager.add_request(row, request_id=request_id, max_new_tokens=new_tokens, record_timestamps=True)
        done: dict[str, Any] = {}
        deadline = time.monotonic() + RESULT_TIMEOUT_S
        while len(done) < len(ids):
            out = manager.get_result(timeout=max(0.0, deadline - time.monotonic()))
            if out is None:
                raise TimeoutError(f"continuous batching returned {len(done)} of {len(ids)} requests in time")
            if out.error:
                raise RuntimeError(f"continuous batching failed request {out.request_id}: {out.error}")
            done[out.request_id] = out
        outs = [done[i] for i in ids]
        for out in outs:
            if len(out.generated_tokens) != new_tokens:
                raise RuntimeError(f"generated {len(out.generated_tokens)} tokens, asked for {new_tokens}")
        return started, outs

    @torch.inference_mode()
    def call(self, strategy: CacheStrategy) -> MeasuredCall:
        if strategy.family != "paged":
            return super().call(strategy)
        self.started(strategy)
        self.reset_peak()
        self.peak_memory.start()
        try:
            started, outs = self._requests(strategy, self.inputs.cpu(), self.cell.max_new_tokens)
        except BaseException:
            self.peak_memory.abandon()
            raise
        peak = self.peak_memory.stop()
        stamps = [max(out.timestamps[k] for out in outs) for k in range(self.cell.max_new_tokens)]
        ended = max(out.lifespan[1] for out in outs)
        ns = 1e9
        times = TokenTimes.from_clock(int(started * ns), [int(s * ns) for s in stamps], int(ended * ns))
        new_tokens = torch.tensor([out.generated_tokens for out in outs])
        kv, reading, identity = self.pool_reading(strategy)  # the pool lives on the device, whole
        return MeasuredCall(times, peak, new_tokens, kv, identity, paged=reading)

    def _reading(self, strategy: CacheStrategy, cache: Any) -> PagedReading:
        allocator = next(iter(cache.cache_allocators.values()))
        return PagedReading(
            pool=self._pool(strategy),
            usable_blocks=int(allocator.num_blocks),
            peak_blocks=self.peak_blocks,
            block_bytes=int(allocator.bytes_per_block),
            attention=self.attention,
        )

    @torch.inference_mode()
    def answer(self, strategy: CacheStrategy, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Task trials through the same manager, each prompt its own request; an answer longer than the cell's
        request waits for pages another row frees (continuous batching queues it), and one longer than the whole
        pool fails the trial as an error."""
        if strategy.family != "paged":
            with self.model_attention():
                return super().answer(strategy, ids, new_tokens)
        _, outs = self._requests(strategy, ids.cpu(), new_tokens)
        return torch.tensor([out.generated_tokens for out in outs])


def _blocks_in_use(cache: Any) -> int:
    """Pages taken now: each allocator's pages less the free ones (its own and those of wholly free sectors)."""
    used = 0
    pool = cache.pool
    for allocator in cache.cache_allocators.values():
        free = pool.count_free_blocks(allocator.index) + len(pool.free_sectors) * allocator.blocks_per_sector
        used += allocator.num_blocks - free
    return used


def _identity(cache: Any) -> CacheIdentity:
    def names(obj: Any) -> tuple[str, ...]:
        return tuple(klass.__name__ for klass in type(obj).__mro__)

    return CacheIdentity(names(cache), tuple(names(a) for a in cache.cache_allocators.values()))
