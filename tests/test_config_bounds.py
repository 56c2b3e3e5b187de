"""Every numeric key is checked: out of range is one line naming the key, exit 2, before anything starts.

The table below is written by hand (what each key means allows); a test walks the schema so that a
numeric key added without a row here, or without a bound beside its field, fails.
"""

import dataclasses
import typing

import pytest
import yaml

from kvsweep.cli import main
from kvsweep.config.compose import compose_config
from kvsweep.config.schema import KvSweepConfig
from kvsweep.errors import ConfigError

# key: (values it refuses, a value at the edge it accepts)
RANGES = {
    "grid.context_lengths": (["[0]", "[-4]"], "[1]"),
    "grid.batch_sizes": (["[0]"], "[1]"),
    "grid.max_new_tokens": (["[0]"], "[1]"),
    "measure.warmup": (["-1"], "0"),
    "measure.repeats": (["0"], "1"),
    "measure.min_duration_s": (["-0.5"], "0"),
    "measure.max_repeats": (["-1"], "0"),
    "measure.seed": (["-1"], "0"),
    "measure.threads": (["-1"], "0"),
    "measure.wait_for_idle_gpu_s": (["-1"], "0"),
    "measure.max_host_contention": (["0", "1.5"], "1"),
    "measure.max_discarded": (["-1"], "0"),
    "measure.target_rel_ci": (["-0.01"], "0"),
    "measure.max_duration_s": (["-1"], "0"),
    "measure.quality_trials": (["-1"], "0"),
    "measure.device_memory_limit_gb": (["-0.5"], "0"),
    "search.max_batch": (["0"], "1"),
    "search.max_context": (["-1"], "0"),
    "search.context_step": (["0"], "1"),
    "slo.tpot_ms": (["-1"], "0"),
    "slo.ttft_ms": (["-1"], "0"),
    "workload.requests": (["0"], "1"),
    "workload.rate": (["[-0.5]"], "[0]"),  # an axis: each rate checked
    "workload.warmup_requests": (["-1"], "0"),
    "inputs.depths": (["[-0.1]", "[1.5]"], "[1]"),
    "ray.gpus_per_cell": (["0"], "1"),
    "ray.cpus_per_cell": (["-1"], "0"),
    "ray.max_concurrent": (["-1"], "0"),
    "ray.cell_timeout_s": (["0", "-5"], "0.5"),
    "ray.max_retries": (["-1"], "0"),
    "ray.prestart": (["-1"], "0"),
    "ray.resources": (["-1"], "0"),  # each value of the map: +ray.resources.nvme=...
    "planner.device_memory_gb": (["-1"], "0"),
    "planner.host_memory_gb": (["-0.5"], "0"),
    "planner.host_link_gbps": (["0", "-25"], "0.001"),
    "planner.gpus": (["-1"], "0"),
    "planner.max_gpu_hours": (["-0.5"], "0"),
    "report.max_slowdown": (["-0.1"], "0"),
    "report.min_token_agreement": (["-0.1", "1.1"], "1"),
    "report.max_accuracy_drop": (["-0.1", "1.1"], "1"),
    "report.max_kl": (["0", "-0.5"], "0.001"),
    "report.gpu_hour_cost": (["-2"], "0"),
}


def numeric_keys(node: type = KvSweepConfig, prefix: str = "") -> set[str]:
    """Keys whose values are numbers: int or float, alone or in a list or map (bool is not a number here)."""
    hints = typing.get_type_hints(node)
    keys = set()
    for f in dataclasses.fields(node):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            keys |= numeric_keys(kind, f"{prefix}{f.name}.")
        elif {kind, *typing.get_args(kind)} & {int, float}:
            keys.add(f"{prefix}{f.name}")
    return keys


def override(key: str, value: str) -> str:
    return f"+{key}.nvme={value}" if key == "ray.resources" else f"{key}={value}"  # a map takes the user's keys


def test_every_numeric_key_has_a_range_here_and_a_bound_in_the_schema():
    assert numeric_keys() == set(RANGES)
    for key in RANGES:
        section, name = key.split(".")
        field = {f.name: f for f in dataclasses.fields(KvSweepConfig)}[section]
        bound = {f.name: f for f in dataclasses.fields(field.default_factory)}[name].metadata.get("bound")
        assert bound is not None, f"{key} has no bound beside its field"


@pytest.mark.parametrize(("key", "bad"), [(key, bad) for key, (refused, _) in RANGES.items() for bad in refused])
def test_a_value_out_of_range_is_one_line_naming_the_key_exit_2(key, bad, capsys):
    with pytest.raises(ConfigError, match=rf"^{key}\b") as refused:
        compose_config([override(key, bad)])
    assert len(str(refused.value).splitlines()) == 1
    assert main([override(key, bad), "dry_run=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and "must be" in err, err


@pytest.mark.parametrize("key", sorted(RANGES))
def test_the_edge_of_each_range_is_accepted(key):
    value = RANGES[key][1]
    composed = compose_config([override(key, value)]).config
    section, name = key.split(".")
    given = yaml.safe_load(value)
    assert getattr(getattr(composed, section), name) == ({"nvme": given} if key == "ray.resources" else given)


def test_a_host_link_of_zero_is_refused_before_the_planner_divides_by_it(capsys):
    assert main(["planner.host_link_gbps=0", "device=cuda", "dry_run=true"]) == 2
    assert capsys.readouterr().err.strip().endswith(": planner.host_link_gbps must be > 0, got 0.0")


# static@N below what the longest request holds (context + new tokens - 1: the last token's K/V is never
# computed). Transformers sizes a static cache to max(request, N), so a smaller N would silently measure a
# plain static cell under another name: refused, naming the length needed.
@pytest.mark.parametrize("cache", ["static", "offloaded_static"])
def test_a_reserve_below_the_longest_request_is_refused_with_the_length_it_needs(cache, capsys):
    grid = ["grid.context_lengths=[256,1024]", "grid.max_new_tokens=[8,32]"]  # longest: 1024 + 32 - 1 = 1055
    assert main([*grid, f"grid.caches=[dynamic,{cache}@1054]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f": grid.caches[1]: {cache}@1054 reserves 1054 tokens" in err, err
    assert "needs 1055" in err and f"{cache}@1055" in err, err
    assert compose_config([*grid, f"grid.caches=[{cache}@1055]"]).config.grid.caches == [f"{cache}@1055"]
