"""Each decode timing against the physical limit: bytes a step must read over the device's bandwidth."""

from typing import Any

from kvsweep.measure.bandwidth import Bandwidth
from kvsweep.models.quantize_weights import stored_bytes
from kvsweep.names import Metric

# A utilization above this is impossible for bytes that must come from memory (5% for timer and
# benchmark noise), as long as they are far larger than the last-level cache that could hold them.
MAX_UTILIZATION = 1.05
FROM_MEMORY_FACTOR = 4


def decode_weight_bytes(model: Any) -> int:
    """Weight bytes a decode step reads: every matrix once, as stored, but only a few rows of an untied
    input embedding (a lookup, not a read of the whole table).

    As stored, not `numel() * element_size()`: a quantized weight (quanto's int8/int4, torchao's int4) is a
    tensor subclass that keeps its original shape and the dtype of its scales, so its nominal size is 2-8x
    what memory holds and a decode step reads. `stored_bytes` counts the storages beneath (payload, scales,
    shifts; bitsandbytes' quant state), and the persistent buffers a pre-quantized checkpoint keeps its
    packed weights in; tied weights count once."""
    embedding_module = model.get_input_embeddings()
    output = model.get_output_embeddings()
    tied = output is not None and _same_storage(output.weight, embedding_module.weight)
    total = stored_bytes(model)
    return total if tied else total - stored_bytes(embedding_module)


def _same_storage(a: Any, b: Any) -> bool:
    """Tied: one tensor, or two views of one storage (a quantized subclass may have no storage of its own)."""
    if a is b:
        return True
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def bandwidth_metrics(
    bytes_per_token: float, tpot_ms: float, bandwidth: Bandwidth, host_link_bytes_per_token: float = 0.0
) -> dict[str, float]:
    """`decode_bytes_per_token`, `decode_host_link_bytes_per_token`, `mem_bandwidth_gbps` and
    `decode_bandwidth_utilization`.

    Utilization divides device-memory bytes by device-memory bandwidth only: what crosses the host link
    (an offloaded cache's layers) is reported beside it, never mixed into it.
    """
    metrics = {
        Metric.DECODE_BYTES_PER_TOKEN: float(bytes_per_token),
        Metric.DECODE_HOST_LINK_BYTES_PER_TOKEN: float(host_link_bytes_per_token),
        Metric.MEM_BANDWIDTH_GBPS: bandwidth.gbps,
    }
    if tpot_ms > 0 and bandwidth.gbps > 0:
        metrics[Metric.DECODE_BANDWIDTH_UTILIZATION] = bytes_per_token / (tpot_ms / 1e3) / (bandwidth.gbps * 1e9)
    return metrics


def implausible(metrics: dict[str, float], bandwidth: Bandwidth) -> bool:
    """True when decode moved more bytes per second than the device can, for bytes no cache could hold."""
    utilization = metrics.get(Metric.DECODE_BANDWIDTH_UTILIZATION)
    llc = bandwidth.last_level_cache_bytes
    if utilization is None or llc is None:
        return False
    return utilization > MAX_UTILIZATION and metrics[Metric.DECODE_BYTES_PER_TOKEN] > FROM_MEMORY_FACTOR * llc
