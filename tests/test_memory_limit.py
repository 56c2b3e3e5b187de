"""`measure.device_memory_limit_gb` on CPU: the kernel's own refusal, read as OOM, and lifted afterwards.

Each check runs in a fresh spawned process (the limit is process-wide; pytest's own must never carry
it). Sizes are chosen by arithmetic far from the edges: a tensor of 0.1 GB fits under 0.2 GB, one of
0.4 GB does not. The CUDA branch (`set_per_process_memory_fraction`) needs a GPU: here it is driven through
its allocator seam, which records what each device was told; `scripts/gpu_smoke.sh` checks it on a GPU.
"""

import dataclasses
import multiprocessing
import re
import resource

import pytest

from kvsweep.units import GB

LIMIT_GB = 0.2


def spawned(target, *args):
    """`target(*args)`'s return value, computed in a fresh spawned process."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(target, args)


def float32_tensor(gb):
    import torch

    return torch.ones(int(gb * GB) // 4, dtype=torch.float32)


def allocations_under_a_limit():
    """What a fresh process sees: inside the limit, then after it."""
    import torch

    from kvsweep.cell.memory_limit import memory_limit, vm_data_bytes
    from kvsweep.errors import out_of_memory

    torch.set_num_threads(1)
    seen = {"rlimit_before": resource.getrlimit(resource.RLIMIT_DATA), "vm_data_gb": vm_data_bytes() / GB}
    with memory_limit("cpu", LIMIT_GB) as how:
        seen["tag"] = how
        seen["soft_inside"] = resource.getrlimit(resource.RLIMIT_DATA)[0]
        small = float32_tensor(0.1)
        seen["small"] = small.numel() * 4
        del small
        try:
            float32_tensor(0.4)
            seen["large"] = "allocated"
        except RuntimeError as exc:
            seen["large"] = out_of_memory(exc, "cpu")
        try:
            bytearray(int(0.4 * GB))
            seen["python"] = "allocated"
        except MemoryError as exc:
            seen["python"] = out_of_memory(exc, "cpu")
    seen["rlimit_after"] = resource.getrlimit(resource.RLIMIT_DATA)
    seen["large_after"] = float32_tensor(0.4).numel() * 4
    return seen


def test_a_limit_lets_small_allocations_through_and_refuses_large_ones_as_oom_then_is_lifted():
    seen = spawned(allocations_under_a_limit)
    at_start = float(re.fullmatch(r"cpu data segment 0\.20 GB past (\d+\.\d\d) GB at start", seen["tag"]).group(1))
    assert abs(at_start - seen["vm_data_gb"]) < 0.02  # a second reading of the data segment, just before
    assert seen["soft_inside"] != resource.RLIM_INFINITY
    assert abs(seen["soft_inside"] - (at_start + LIMIT_GB) * GB) < 0.01 * GB
    assert seen["small"] == 100_000_000
    assert seen["large"] == "host"  # torch's RuntimeError "can't allocate memory"
    assert seen["python"] == "host"  # Python's MemoryError
    assert seen["rlimit_after"] == seen["rlimit_before"]
    assert seen["large_after"] == 400_000_000


def tightened_first():
    """A process already limited more tightly than asked keeps its own limit."""
    from kvsweep.cell.memory_limit import memory_limit, vm_data_bytes

    tighter = vm_data_bytes() + int(0.1 * GB)
    resource.setrlimit(resource.RLIMIT_DATA, (tighter, resource.RLIM_INFINITY))
    with memory_limit("cpu", 1.0) as how:
        inside = resource.getrlimit(resource.RLIMIT_DATA)[0]
    return tighter, how, inside, resource.getrlimit(resource.RLIMIT_DATA)[0]


def test_a_tighter_limit_the_process_already_had_is_kept_and_said_so():
    tighter, how, inside, after = spawned(tightened_first)
    assert inside == after == tighter
    assert how.startswith("cpu data segment 1.00 GB past ") and "not applied" in how


# tiny-llama: 4 layers x 2 KV heads x 32 head dim; float32 K and V take 2 x 4 x 2 x 32 x 4 = 2048 bytes per
# token per sequence. Context 2048, 4 new tokens, batch 16: 2048 x (2048 + 4 - 1) x 16 = 67.2 MB of cache
# alone, over a 0.05 GB limit; context 64, batch 1: 2048 x 67 = 0.14 MB, far under it.
CELL_LIMIT_GB = 0.05


def cell(context, batch):
    return {
        "model": "tiny-llama",
        "dtype": "float32",
        "context_length": context,
        "batch_size": batch,
        "max_new_tokens": 4,
        "cache": "dynamic",
        "compile": False,
    }


def cells_with_and_without_the_limit():
    """Three real cells in one process, in order: small and large under the limit, then large without."""
    from kvsweep.grid import MeasureProtocol
    from kvsweep_testkit.cells import measure_cell

    exact = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1)
    limited = exact.with_measure(device_memory_limit_gb=CELL_LIMIT_GB).to_dict()
    return {
        "small": measure_cell(cell(64, 1), limited),
        "large": measure_cell(cell(2048, 16), limited),
        "large_unlimited": measure_cell(cell(2048, 16), exact.to_dict()),
        "rlimit_after": resource.getrlimit(resource.RLIMIT_DATA),
    }


@pytest.mark.slow  # a spawned process that imports torch and measures three cells: 10 s
def test_a_cell_too_large_for_the_limit_ends_oom_and_runs_without_it():
    assert 2 * 4 * 2 * 32 * 4 * (2048 + 4 - 1) * 16 > CELL_LIMIT_GB * GB > 2 * 4 * 2 * 32 * 4 * (64 + 4 - 1) * 1
    results = spawned(cells_with_and_without_the_limit)
    small, large, unlimited = results["small"], results["large"], results["large_unlimited"]
    assert small["status"] == "ok", small["error"]
    assert small["tags"]["kvsweep.memory_limit"].startswith("cpu data segment 0.05 GB past ")
    assert large["status"] == "oom", large["error"]
    assert large["tags"]["kvsweep.oom_kind"] == "host"
    assert large["tags"]["kvsweep.memory_limit"].startswith("cpu data segment 0.05 GB past ")
    # The same process measured the large cell without a limit: the one before it left none behind.
    assert unlimited["status"] == "ok", unlimited["error"]
    assert "kvsweep.memory_limit" not in unlimited["tags"]
    assert results["rlimit_after"] == resource.getrlimit(resource.RLIMIT_DATA)  # a spawned child starts as we do
    # A CPU cell has no NVML energy counter: the figure is missing and the tag says why.
    for result in (small, unlimited):
        assert "joules_per_token" not in result["metrics"]
        assert result["tags"]["kvsweep.energy"] == (
            "unknown: NVML's energy counter needs a CUDA device; this cell ran on cpu"
        )


@dataclasses.dataclass
class RecordingAllocator:
    """Two GPUs of 80 and 40 GB (1e9 bytes) whose caching allocators remember every fraction they were given."""

    totals: tuple[int, ...] = (80 * GB, 40 * GB)
    fractions: dict[int, list[float]] = dataclasses.field(default_factory=dict)

    def total_memory(self, index: int) -> int:
        return self.totals[index]

    def set_fraction(self, fraction: float, index: int) -> None:
        self.fractions.setdefault(index, []).append(fraction)


def test_every_gpu_of_a_split_cell_is_capped_to_the_limit_and_released_even_after_a_failure():
    """torch caps one device per call: a 2-GPU cell must cap both, each at 20 GB of its own size."""
    import pytest

    from kvsweep.cell.memory_limit import memory_limit

    allocator = RecordingAllocator()
    failing = pytest.raises(RuntimeError, match="CUDA out of memory")
    with failing, memory_limit("cuda", 20.0, gpus=2, allocator=allocator) as how:
        assert allocator.fractions == {0: [0.25], 1: [0.5]}  # 20/80 and 20/40
        raise RuntimeError("CUDA out of memory")  # what the cell's measuring raised
    assert allocator.fractions == {0: [0.25, 1.0], 1: [0.5, 1.0]}
    assert "GPU 0 fraction 0.250 of 80.0 GB" in how and "GPU 1 fraction 0.500 of 40.0 GB" in how


def test_a_gpu_no_larger_than_the_limit_is_left_alone_and_the_tag_says_which():
    from kvsweep.cell.memory_limit import memory_limit

    allocator = RecordingAllocator()
    with memory_limit("cuda", 60.0, gpus=2, allocator=allocator) as how:
        assert allocator.fractions == {0: [0.75]}
    assert allocator.fractions == {0: [0.75, 1.0]}
    assert "GPU 1 not capped" in how and "GPU 0 fraction 0.750" in how
