"""One cell's `generate` calls, made the same way every time, each the size of one request.

A call keeps only what the summary needs (timestamps, peaks, token ids, the cache's bytes and identity) and lets
cache, outputs and logits go before it returns, so the next call's peak starts from the model alone. The exception
is a compiled static cell's one preallocated cache, kept and reset (`cache_for`) after the clock starts, so both
static kinds time the same zero-fill an eager call's `generate` does when it builds its cache.
"""

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import GenerationConfig, LogitsProcessorList

from kvsweep.caches import CacheStrategy
from kvsweep.grid import Cell
from kvsweep.measure.cache_identity import CacheIdentity, KvBytes, cache_bytes, describe_cache
from kvsweep.measure.peak_memory import CudaMemory, DeviceMemory, PeakMemory, PeakMemoryMeter
from kvsweep.measure.sampling import TokenClock, TokenTimes
from kvsweep.testing.faults import InjectFault
from kvsweep.testing.testing_config import Fault

if TYPE_CHECKING:
    from kvsweep.caches.paged_pool import PagedReading


@dataclass
class MeasuredCall:
    times: TokenTimes
    peak: PeakMemory
    new_tokens: torch.Tensor  # on the host
    kv_bytes: KvBytes  # what the returned cache held, on the device and in host memory (the cache is gone)
    identity: CacheIdentity
    paged: "PagedReading | None" = None  # a `paged` call: its pool and the pages in use at the peak


class GenerateSession:
    """Runs `generate` for one cell with the token clock attached.

    `device_memory` is the accelerator's allocator (CUDA's by default on a CUDA cell); tests pass a
    stand-in to check the order of resets and frees without a GPU.
    """

    def __init__(
        self,
        model: Any,
        inputs: torch.Tensor,
        cell: Cell,
        device: str,
        fault: Fault | None,
        quality_fault: Fault | None = None,
        device_memory: DeviceMemory | None = None,
    ) -> None:
        self.model = model
        self.inputs = inputs
        self.mask = torch.ones_like(inputs)
        self.cell = cell
        self.cuda = device == "cuda"
        self.device_memory = device_memory or (CudaMemory() if self.cuda else None)
        self.clock = TokenClock(sync=self.device_memory.synchronize if self.device_memory else None)
        self.peak_memory = PeakMemoryMeter(self.device_memory)  # around `generate` alone, inside the clock's call
        processors: list[Any] = [self.clock]
        if fault is not None:  # a `slow` sleep goes before the clock: every token, the first too, pays it
            processors.insert(0 if fault.kind == "slow" else 1, InjectFault(fault))
        self.processors = LogitsProcessorList(processors)
        self.quality_fault = quality_fault
        self.eager_forward = getattr(model, "forward", None)
        self.compiled_calls = 0  # forward passes through the explicitly compiled forward (CPU)
        self.kept_cache: Any = None  # a compiled static cell's one cache (see `cache_for`)

    def close(self) -> None:
        """Ends what the session keeps running between calls (nothing here; a paged session's manager)."""

    def compile_forward(self) -> None:
        """CPU: compile the forward explicitly (generation's own compile only runs on CUDA)."""
        compiled = torch.compile(self.eager_forward, dynamic=False)

        @functools.wraps(self.eager_forward)  # generate inspects the forward's signature
        def forward(*args: Any, **kwargs: Any) -> Any:
            self.compiled_calls += 1
            return compiled(*args, **kwargs)

        self.model.forward = forward

    @contextmanager
    def eager(self) -> Iterator[None]:
        """The plain forward for a while (the dynamic baseline would only trigger recompiles)."""
        configured = self.model.forward
        self.model.forward = self.eager_forward
        try:
            yield
        finally:
            self.model.forward = configured

    def keeps_cache(self, strategy: CacheStrategy) -> bool:
        return self.cell.compile and strategy.compilable

    def fits_kept(self, ids: torch.Tensor) -> bool:
        """A call the kept cache serves: the cell's rows (its length is the cell's longest; a workload's shorter
        requests run in it too, as in the one cache a compiled server keeps)."""
        return ids.shape[0] == self.inputs.shape[0]

    def cache_for(self, strategy: CacheStrategy) -> dict[str, Any]:
        """`generate`'s `cache` argument: a compiled static cell's one cache, emptied; {} for every other cell.

        A new `StaticCache` per call would give the compiler new static addresses, so CUDA graph trees would
        record a new graph on every call, inside the measured time; one reused cache keeps the first calls'
        graph. Called inside the timed region, where generate builds its own cache.
        """
        if not self.keeps_cache(strategy):
            return {}
        if self.kept_cache is None:
            from transformers import StaticCache

            length = max(self.cell.cached_tokens, strategy.reserve_tokens or 0)
            cache = StaticCache(config=self.model.config.get_text_config(decoder=True), max_cache_len=length)
            shape = self.model._get_static_cache_init_shape()  # (kv heads, head dim), None if not uniform
            if shape is not None:  # allocated now: the first call's graph is the one every later call uses
                heads, head_dim = shape
                device, dtype = self.inputs.device, self.model.dtype
                cache.early_initialization(self.inputs.shape[0], heads, head_dim, dtype, device)
            self.kept_cache = cache
        self.kept_cache.reset()
        return {"cache": self.kept_cache}

    def generation_config(self, strategy: CacheStrategy, own_cache: bool = False) -> GenerationConfig:
        """`own_cache`: the call passes its cache object, so generate is not asked to build one."""
        compile_config = None
        if self.cell.compile and self.cuda:
            from transformers import CompileConfig

            compile_config = CompileConfig(fullgraph=True)
        return GenerationConfig(
            max_new_tokens=self.cell.max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            return_dict_in_generate=True,
            # Generation compiles static caches by itself on CUDA; only do it when the cell asks.
            disable_compile=compile_config is None,
            compile_config=compile_config,
            **({} if own_cache else strategy.generation_options()),
        )

    def _generate(
        self,
        strategy: CacheStrategy,
        config: GenerationConfig,
        processors: LogitsProcessorList,
        inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Any:
        """One `generate` call (of the cell's inputs, or `inputs`: ids and mask); the kept cache is emptied here,
        inside whatever the caller times, when the call has the cell's shape."""
        ids, mask = inputs or (self.inputs, self.mask)
        kept = self.cache_for(strategy) if self.fits_kept(ids) else {}
        return self.model.generate(
            ids, attention_mask=mask, logits_processor=processors, generation_config=config, **kept
        )

    @torch.inference_mode()
    def call(self, strategy: CacheStrategy) -> MeasuredCall:
        return self.call_request(strategy, self.inputs, self.mask, self.cell.max_new_tokens)

    @torch.inference_mode()
    def call_request(
        self, strategy: CacheStrategy, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int
    ) -> MeasuredCall:
        """One measured call of any shape (a workload's request, or a padded batch of them)."""
        own_cache = self.keeps_cache(strategy) and self.fits_kept(ids)
        config = self.generation_config(strategy, own_cache=own_cache)  # host work, untimed
        config.max_new_tokens = new_tokens
        self.peak_memory.start()
        try:
            self.clock.start()
            out = self._generate(strategy, config, self.processors, (ids, mask))
            end_ns = self.clock.stop()
        except BaseException:
            self.peak_memory.abandon()
            raise
        peak = self.peak_memory.stop()
        times = TokenTimes.from_clock(self.clock.start_ns, self.clock.stamps_ns, end_ns)
        generated = out.sequences[:, ids.shape[1] :]
        if generated.shape[1] != new_tokens:
            raise RuntimeError(f"generated {generated.shape[1]} tokens, asked for {new_tokens}")
        cache = getattr(out, "cache", None)
        place = "cuda" if self.cuda else "cpu"
        return MeasuredCall(times, peak, generated.cpu(), cache_bytes(cache, place), describe_cache(cache))

    @torch.inference_mode()
    def generate_with(self, strategy: CacheStrategy, processors: LogitsProcessorList) -> torch.Tensor:
        """An unmeasured call with other logits processors (quality checks); returns the new tokens."""
        if self.quality_fault is not None:
            processors = LogitsProcessorList([*processors, InjectFault(self.quality_fault)])
        config = self.generation_config(strategy, own_cache=self.keeps_cache(strategy))
        return self._generate(strategy, config, processors).sequences[:, self.inputs.shape[1] :].cpu()

    @torch.inference_mode()
    def answer(self, strategy: CacheStrategy, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """An unmeasured greedy call on other prompts of the cell's shape (task trials); the new tokens.

        A compiled static cell answers into its kept cache when the answer fits the cell's request, so
        its compiled graph is the one measured; a longer answer gets a cache sized to it."""
        processors = LogitsProcessorList([InjectFault(self.quality_fault)] if self.quality_fault is not None else [])
        kept = self.keeps_cache(strategy) and new_tokens <= self.cell.max_new_tokens
        config = self.generation_config(strategy, own_cache=kept)
        config.max_new_tokens = new_tokens
        ids = ids.to(self.inputs.device)
        out = self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            logits_processor=processors,
            generation_config=config,
            **(self.cache_for(strategy) if kept else {}),
        )
        return out.sequences[:, ids.shape[1] :].cpu()
