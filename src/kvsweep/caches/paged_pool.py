"""The page pool a `paged` cell reserves, sized explicitly and known before anything runs.

Transformers' continuous batching sizes its pool from free memory unless told otherwise (60% of it on a CPU, 90% on
a GPU): a pool like that would make every memory comparison say "most of the machine". kvsweep always tells it:
`paged` reserves the pages its batch needs, `paged@N` pages for N tokens a row (a fixed serving profile, as
`static@N`), and at most `MAX_BATCH_TOKENS` tokens go through one forward pass (longer prefills are chunked, as a
server does).

Transformers lays the pool out as one byte tensor of sectors: a block is `page_size` tokens of K and V for every
layer, a sector the least common multiple of a block and 128 bytes, the blocks asked for are rounded up to whole
sectors, and two more sectors are kept as trash space for padded reads and writes. `pool_bytes` is that tensor.
"""

import math
from dataclasses import dataclass

from kvsweep.caches.layer_tokens import PAGED_LAYER_TYPES, refused_layers
from kvsweep.caches.strategy import CacheStrategy, KvDims
from kvsweep.units import DTYPE_BYTES

PAGE_SIZE = 256  # tokens a page: `ContinuousBatchingConfig`'s default, what `transformers serve` uses
MAX_BATCH_TOKENS = 8192  # tokens a forward pass at most: Transformers' own default
SECTOR_ALIGN = 128  # bytes a sector is a multiple of
TRASH_SECTORS = 2


@dataclass(frozen=True)
class PagedPool:
    """What a paged cell asks Transformers for (`ContinuousBatchingConfig`) and what it reserves."""

    page_size: int
    blocks: int  # pages of every layer's K and V asked for
    max_batch_tokens: int

    def block_bytes(self, shape: KvDims, dtype: str) -> int:
        """One page of every layer's K and V."""
        return self.page_size * token_bytes(shape, dtype)

    def sector_bytes(self, shape: KvDims, dtype: str) -> int:
        return math.lcm(self.block_bytes(shape, dtype), SECTOR_ALIGN)

    def sectors(self, shape: KvDims, dtype: str) -> int:
        return max(1, -(-self.blocks * self.block_bytes(shape, dtype) // self.sector_bytes(shape, dtype)))

    def usable_blocks(self, shape: KvDims, dtype: str) -> int:
        """Pages the pool really holds: whole sectors' worth, so at least `blocks`."""
        return self.sectors(shape, dtype) * self.sector_bytes(shape, dtype) // self.block_bytes(shape, dtype)

    def pool_bytes(self, shape: KvDims, dtype: str) -> int:
        """The pool's tensor: its sectors and the two trash sectors."""
        return (self.sectors(shape, dtype) + TRASH_SECTORS) * self.sector_bytes(shape, dtype)

    def readable_tokens(self, shape: KvDims, dtype: str) -> int:
        return self.usable_blocks(shape, dtype) * self.page_size

    def mask_bytes(self, shape: KvDims, dtype: str) -> int:
        """The attention mask sdpa and eager attention preallocate, [1, 1, M, N + M] in the model's dtype (M the
        batch tokens, N the readable tokens); flash attention on a GPU needs none."""
        tokens = self.max_batch_tokens
        return tokens * (self.readable_tokens(shape, dtype) + tokens) * DTYPE_BYTES[dtype]

    def describe(self) -> str:
        return f"page_size={self.page_size} blocks={self.blocks} max_batch_tokens={self.max_batch_tokens}"


def token_bytes(shape: KvDims, dtype: str) -> int:
    """One token of K and V over every layer."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * DTYPE_BYTES[dtype]


def pages_for(tokens: int, page_size: int = PAGE_SIZE) -> int:
    return -(-tokens // page_size)


def pool_for(strategy: CacheStrategy, batch: int, prompt: int, cached: int) -> PagedPool:
    """The pool for a batch of `batch` requests of `prompt` tokens caching `cached` each: every row's pages for
    its cached tokens, or for `paged@N`'s N; a prefill of the whole batch in one pass when it fits."""
    per_row = pages_for(strategy.static_length(cached))
    return PagedPool(PAGE_SIZE, batch * per_row, min(batch * prompt, MAX_BATCH_TOKENS))


def paged_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """A `StoredBytes`: the pool's tensor, reserved whole before the first request (`preallocates`)."""
    return pool_for(strategy, batch, prompt, prompt + decoded).pool_bytes(shape, dtype)


def paged_step_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, new: int, step: int
) -> int:
    """Device bytes decode step `step` (1 ..) of the sdpa path moves: the new token written into its page, then
    every cached token gathered from the pages (read, and written into a contiguous copy) and read by attention.
    Flash attention on a GPU reads the pages in place, a third of this."""
    tokens = prompt + step
    return batch * token_bytes(shape, dtype) * (1 + 3 * tokens)


def paged_problem(strategy: CacheStrategy, shape: KvDims, batch: int, prompt: int, new: int) -> str | None:
    """Why a paged cell cannot run on this model, or None: every layer must be `full_attention`. Transformers'
    continuous batching refuses any type but full and sliding attention (`PAGED_LAYER_TYPES`), and kvsweep
    accounts a pool of full-attention layers only (sliding and state layers get allocators of their own)."""
    refused = refused_layers(shape, PAGED_LAYER_TYPES)
    if refused is not None:
        return (
            f"{strategy.name}: Transformers' continuous batching accepts only full_attention and sliding_attention "
            f"layers, and kvsweep sizes a page pool for full-attention layers only; this model has {refused}"
        )
    unaccounted = refused_layers(shape, frozenset({"full_attention"}))
    if unaccounted is not None or shape.layer_windows or shape.state_elements:
        return (
            f"{strategy.name}: kvsweep sizes a page pool for full-attention layers only; this model has "
            f"{unaccounted or 'sliding-window, chunked or state layers'}"
        )
    return None


@dataclass(frozen=True)
class PagedReading:
    """What the pool held during one call, and how the manager ran."""

    pool: PagedPool
    usable_blocks: int  # pages the pool really holds (whole sectors)
    peak_blocks: int  # pages in use at the fullest moment of the call
    block_bytes: int  # one page of every layer's K and V
    attention: str  # the attention implementation continuous batching ran

    @property
    def in_use_bytes(self) -> int:
        return self.peak_blocks * self.block_bytes
