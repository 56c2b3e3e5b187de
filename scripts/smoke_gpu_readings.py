"""What a GPU smoke run's cells read through NVML and sysfs, checked: the summary's part that only a GPU can show.

- NVML after fork: a forked CUDA cell started NVML afresh (`environment.nvml`); NVML that could not start
  there is a problem.
- Energy: `joules_per_token` is there, or the GPU offers no energy counter (said, not a problem); any other
  reason for it to be missing is a problem. The spread of each repeat's own figure is said when it is
  over ENERGY_SPREAD (the counter's resolution for short calls), not a problem.
- NUMA: a cell's CPU slot sits on the node its GPUs hang off (`gpu_numa_nodes`, read in the cell by their
  UUIDs), asked for by the actor (`cpus_near_numa_node`); not checked where the kernel does not know the
  GPU's node.
- Two GPUs per cell: both GPUs recorded, both probed for other processes, and the energy figure the sum
  of both GPUs' energy over the tokens.
Imports nothing heavy: the reasons a cell writes are matched by how they begin, named here (a test holds
them to the cell's own).
"""

from statistics import median

from kvsweep.cell.cpu_slots import SLOT
from kvsweep.cell.gpu_numa import nearest_node
from kvsweep.cell.process import RESTARTED
from kvsweep.names import Metric, ResultTag
from kvsweep.results import CellResult

# How kvsweep.measure.energy's reasons begin (it imports torch): the GPU has no counter / NVML did not start.
NO_COUNTER = "NVML's energy counter cannot be read on"
NVML_DID_NOT_START = "NVML could not start"
ENERGY_SPREAD = 0.2  # (max - min) / median of the repeats' joules per token


def nvml_problem(result: CellResult) -> str | None:
    """Why a forked CUDA cell's NVML is not proven to have started afresh, or None."""
    if not result.environment.get("template"):
        return None  # not forked: nothing inherited (the summary counts unforked cells apart)
    found = result.environment.get("nvml")
    if found == RESTARTED:
        return None
    if found is None:
        return "NVML NOT RESTARTED IN THE FORKED CELL (no record)"
    return f"NVML DID NOT START IN THE FORKED CELL: {found}"


def energy_reading(result: CellResult) -> tuple[str, bool]:
    """A cell's energy figure (or why there is none), its repeats' spread, and whether that is a problem."""
    figure = result.metrics.get(Metric.JOULES_PER_TOKEN)
    if figure is None:
        why = result.tags.get(ResultTag.ENERGY, "unknown: (no reason recorded)").removeprefix("unknown: ")
        if why.startswith(NO_COUNTER):
            return " energy: this GPU offers no energy counter", False
        return f"  ENERGY UNKNOWN: {why[:160]}", True
    text = f" J/token {figure:.4g}"
    each = (result.samples.get("energy") or {}).get("joules_per_token_per_repeat") or []
    if len(each) > 1 and median(each) > 0:
        spread = (max(each) - min(each)) / median(each)
        text += f" (repeats spread {spread:.0%})"
        if spread > ENERGY_SPREAD:
            text += f"  ENERGY SPREAD over {ENERGY_SPREAD:.0%}: the counter's resolution for calls this short"
    return text, False


def gpu_line(result: CellResult) -> tuple[str, int]:
    """The cell's NVML and energy readings (CUDA cells that ran ok), and how many problems they show."""
    problems = 0
    text, wrong = energy_reading(result)
    problems += wrong
    nvml = nvml_problem(result)
    if nvml is not None:
        text += f"  {nvml}"
        problems += 1
    return text, problems


def gpu_node(result: CellResult) -> int:
    """The node the cell's GPUs hang off as the cell read it (`nearest_node` of theirs), -1 unknown."""
    nodes = [int(n) for n in str(result.environment.get("gpu_numa_nodes", "")).split(",") if n.strip()]
    return nearest_node(nodes)


def numa_problems(results: list[CellResult]) -> tuple[str, list[str]]:
    """Each CUDA cell's CPU slot on its GPUs' node: the summary line and the problems."""
    slotted = [r for r in results if r.environment.get("cpus_from") == SLOT and "gpu_numa_nodes" in r.environment]
    known = [r for r in slotted if gpu_node(r) >= 0]
    problems = []
    for result in known:
        node, asked = gpu_node(result), int(result.environment.get("cpus_near_numa_node", -1))
        cpus_on = str(result.environment.get("cpus_numa_nodes", ""))
        if asked != node:
            problems.append(f"{_label(result)}: its actor asked for node {asked}, its GPU hangs off node {node}")
        elif cpus_on != str(node):
            problems.append(f"{_label(result)}: CPUs on node(s) {cpus_on}, its GPU on node {node} (was it full?)")
    line = (
        f"NUMA: {len(known) - len(problems)} of {len(slotted)} cells with a CPU slot had it on their GPU's node "
        f"({len(slotted) - len(known)} where the kernel does not know the GPU's node: not checked)"
    )
    return line, problems


def split_gpu_mismatch(result: CellResult) -> str | None:
    """How a two-GPU cell's NVML readings fall short of covering both GPUs, or None."""
    uuids = [u for u in str(result.environment.get("gpu_uuids", "")).split(",") if u]
    if len(set(uuids)) != 2:
        return f"SHOULD RECORD BOTH GPUS' UUIDS (gpu_uuids {','.join(uuids) or '-'})"
    probed = str(result.environment.get("gpu_sharing", ""))
    if not all(uuid in probed for uuid in uuids):
        return f"SHOULD PROBE BOTH GPUS FOR OTHER PROCESSES (gpu_sharing {probed or '-'})"
    figure = result.metrics.get(Metric.JOULES_PER_TOKEN)
    if figure is None:
        return None  # why not: energy_reading says
    energy = result.samples.get("energy") or {}
    each, tokens = energy.get("joules_per_gpu") or [], energy.get("tokens") or 0
    if len(each) != 2 or min(each) <= 0:
        return f"SHOULD MEASURE ENERGY ON BOTH GPUS (joules per GPU {each})"
    if tokens <= 0 or abs(sum(each) / tokens - figure) > 1e-9 * max(figure, 1.0):
        return f"joules_per_token SHOULD BE BOTH GPUS' ENERGY OVER THE TOKENS ({sum(each)} J / {tokens})"
    return None


def split_energy_text(result: CellResult) -> str:
    each = (result.samples.get("energy") or {}).get("joules_per_gpu") or []
    return f"; J per GPU {' + '.join(f'{j:.1f}' for j in each)}" if each else ""


def _label(result: CellResult) -> str:
    return f"{result.cell.cache} ctx{result.cell.context_length}"
