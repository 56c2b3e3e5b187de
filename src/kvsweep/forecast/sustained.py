"""The share of a datasheet peak a run sustains, one constant per term, all in this module.

Every figure here is an UNCALIBRATED guess from datasheets and common experience, not a measurement of kvsweep's
cells: calibration (measured ÷ forecast over cells of the same model and device) replaces them, and until a GPU
run has done so a forecast that uses them must say it is uncalibrated. Keeping them together is what lets
calibration replace them in one place.
"""

from kvsweep.units import GB

# Prefill is large bf16 GEMMs plus attention: well-tuned GEMMs reach 70-80% of the dense tensor peak, eager
# Transformers' prefill (SDPA, norms, rotary and the launches between them) less. 0.6 is a guess in between.
GPU_FLOP_FRACTION = 0.6

# Decode streams the weights and the cache once a step: a large device-memory read reaches ~80-90% of the datasheet
# bandwidth (STREAM-like copies); the many small reads of a step less. 0.8 is a guess at the high end, the host time
# between kernels being a term of its own (`STEP_OVERHEAD_S`), not folded into this share.
GPU_BANDWIDTH_FRACTION = 0.8

# Pinned host-device copies reach ~25 of PCIe 4.0 x16's 32 GB/s one way (the planner's default
# `planner.host_link_gbps` is that 25): 0.8 of the link's datasheet rate. A configured `host_link_gbps` is a
# sustained rate already and takes no fraction; the forecast holds it to this share of the part's own link.
HOST_LINK_FRACTION = 0.8

# Eager `generate` spends host time each decode step beside the device's (Python, module calls, kernel launches):
# roughly 0.3 ms per decoder layer on a recent server CPU, so ~10 ms for a 32-layer 7-8B decoder. A compiled
# cell with CUDA graphs spends far less; calibration gives each its own.
LAYER_OVERHEAD_S = 3e-4
# A compiled cell replays its decode step as CUDA graphs: one launch a step, a few microseconds a layer.
COMPILED_LAYER_OVERHEAD_S = 1e-5
STEP_OVERHEAD_S = 32 * LAYER_OVERHEAD_S  # a 32-layer decoder's: the default where the layer count is not passed

# Loading safetensors weights: a local NVMe read into host memory and a copy over the host link, ~2 GB/s overall
# (a cold network filesystem is slower, a warm page cache faster).
LOAD_BYTES_PER_S = 2 * GB


def step_overhead_s(layers: int, per_layer_s: float = LAYER_OVERHEAD_S) -> float:
    """A decode step's host time for a model of `layers` decoder layers: the launch-bound part of eager decode
    grows with the modules a step calls, which grow with the layers."""
    return layers * per_layer_s
