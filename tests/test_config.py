"""Config mistakes fail before Ray starts: exit 2, one line naming the key and what is allowed."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kvsweep.cli import main
from kvsweep.config.compose import compose_config
from kvsweep.config.schema import KvSweepConfig

ROOT = Path(__file__).resolve().parents[1]

BAD_CONFIGS = [
    (["grid.foo=1"], "unknown config key 'grid.foo'", "context_lengths"),
    (["measure.repeatz=3"], "unknown config key 'measure.repeatz'", "repeats"),
    (["bogus=1"], "unknown config key 'bogus'", "grid"),
    (["grid.batch_sizes=[a]"], "grid.batch_sizes[0]", "Integer"),
    (["grid.batch_sizes=3"], "grid.batch_sizes", "list"),
    (["grid.caches=[dynamo]"], "grid.caches[0]: unknown cache 'dynamo'", "quantized-hqq-int4"),
    (["grid.caches=[dynamic@64]"], "unknown cache 'dynamic@64'", "static@N"),
    (["grid.caches=[]"], "grid.caches is empty", ""),
    (["grid.dtypes=[float8]"], "grid.dtypes[0]: unknown dtype 'float8'", "bfloat16"),
    (["grid.context_lengths=[0]"], "grid.context_lengths[0] must be >= 1", "got 0"),
    (["grid.batch_sizes=[-2]"], "grid.batch_sizes[0] must be >= 1", "got -2"),
    (["grid.max_new_tokens=[0]"], "grid.max_new_tokens[0]", ">= 1"),
    (["grid.compile=[maybe]"], "grid.compile[0]", "bool"),
    (["device=tpu"], "device: unknown device 'tpu'", "cuda"),
    (["measure.repeats=0"], "measure.repeats must be >= 1", ""),
    (["ray.max_retries=-1"], "ray.max_retries must be >= 0", ""),
    (["ray.cell_timeout_s=0"], "ray.cell_timeout_s must be > 0", ""),
    (["+sweep=nope"], "unknown sweep", "long_context"),
    (["+sweep=long_contxt"], "+sweep=long_contxt: unknown sweep; did you mean long_context?", "quickstart"),
    (["sweep=long_context"], "sweep=long_context: a sweep is added with a plus", "+sweep=long_context"),
    (
        ["workload.source=trace", "workload.path=t.jsonl", "workload.input_lengths=fixed:128"],
        "workload.input_lengths is set but workload.source=trace takes each request's prompt length from the trace",
        "drop workload.input_lengths",
    ),
    (
        [
            "workload.source=lengths",
            "workload.input_lengths=fixed:8",
            "workload.output_lengths=fixed:2",
            "workload.path=p",
        ],
        "workload.path is set but workload.source=lengths",
        "reading no file",
    ),
    (["mlflow.tracking_uri=file:/tmp/mlruns"], "mlflow.tracking_uri=file:/tmp/mlruns: MLflow 3.13+", "sqlite:///"),
    (["grid.models=[' ']"], "grid.models[0] is empty", ""),
    (["measure.warmup=-1"], "measure.warmup must be >= 0", ""),
    (["measure.seed=abc"], "measure.seed", "Integer"),
    (["ray.gpus_per_cell=0"], "ray.gpus_per_cell must be >= 1", ""),
    (["ray.cpus_per_cell=-1"], "ray.cpus_per_cell must be >= 0", ""),
    (["ray.max_concurrent=-1"], "ray.max_concurrent must be >= 0", ""),
    (["ray.cell_timeout_s=soon"], "ray.cell_timeout_s", "Float"),
    (["mlflow.experiment=''"], "mlflow.experiment is empty", ""),
    (["dry_run=maybe"], "dry_run", "bool"),
    (["rerun=maybe"], "rerun", "bool"),
    (["infer_oom=perhaps"], "infer_oom", "bool"),
    (["ray.resources={nvme: 1}"], "ray.resources is a map", "+ray.resources.nvme=VALUE"),
    (["measure.min_duration_s=-1"], "measure.min_duration_s must be >= 0", ""),
    (["measure.repeats=5", "measure.max_repeats=2"], "measure.max_repeats (2) is below measure.repeats (5)", ""),
    (["measure.max_host_contention=0"], "measure.max_host_contention must be in (0, 1]", "1 = off"),
    (["measure.max_host_contention=1.5"], "measure.max_host_contention must be in (0, 1]", ""),
    (["measure.max_discarded=-1"], "measure.max_discarded must be >= 0", ""),
    (["measure.target_rel_ci=-0.05"], "measure.target_rel_ci must be >= 0", ""),
    (["measure.min_duration_s=5", "measure.max_duration_s=2"], "measure.max_duration_s (2.0) is below", "0 (no cap)"),
    (["planner.host_link_gbps=0", "device=cuda", "dry_run=true"], "planner.host_link_gbps must be > 0", ""),
    (["planner.host_memory_gb=-8"], "planner.host_memory_gb must be >= 0", ""),
    (["ray.prestart=-1"], "ray.prestart must be >= 0", ""),
    (["grid.caches=[static@512]"], "grid.caches[0]: static@512 reserves 512 tokens", "static@1055"),
    (["measure=nope"], "measure=nope: unknown measure preset", "thorough"),
    (["report.rank_by=speed"], "report.rank_by: unknown metric 'speed'", "tpot_ms"),
    (["report.max_slowdown=-0.1"], "report.max_slowdown must be >= 0", ""),
    (["report.min_token_agreement=1.5"], "report.min_token_agreement must be in [0, 1]", ""),
    (["+testing.faults=[{fault: oom, during: later}]"], "testing.faults[0].during: unknown phase 'later'", "quality"),
    (["+testing.faults=[{fault: meltdown}]"], "testing.faults[0].fault: unknown fault 'meltdown'", "hang"),
    # Hydra users' habits: multirun is refused (the grid is the sweep), unknown flags named
    (["-m", "grid.caches=[dynamic]"], "--multirun is not needed: the grid is the sweep", "grid.batch_sizes=[1,4]"),
    (["--multirun"], "--multirun is not needed", "list"),
    (["grid.batch_sizes=1,4"], "grid.batch_sizes=1,4 is Hydra's multirun sweep syntax", "'grid.batch_sizes=[1,4]'"),
    (["--cfg", "yaml"], "--cfg takes one of job, hydra, all, not 'yaml'", ""),
    (["--cfg"], "--cfg takes one of", "nothing"),
    (["--config-dir=x"], "unknown option '--config-dir=x'", "--cfg job|hydra|all"),
    (["--cfg", "job", "grid.caches=[dynamo]"], "unknown cache 'dynamo'", ""),  # what --cfg prints is validated
]


@pytest.mark.parametrize(("overrides", "names", "allowed"), BAD_CONFIGS)
def test_bad_config_is_one_line_exit_2(overrides, names, allowed, capsys):
    assert main(overrides) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert names in err and allowed in err


@pytest.mark.slow
def test_bad_config_fails_before_ray_starts(tmp_path):
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kvsweep", "grid.caches=[dynamo]", f"hydra.run.dir={tmp_path}/run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "unknown cache 'dynamo'" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing was started or written
    assert "ray" not in proc.stderr.lower()
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (["grid.caches=[dynamic]"], "quickstart-custom"),  # the quickstart's file no longer says what is measured
        (["+sweep=long_context", "grid.context_lengths=[4096]"], "long_context-custom"),
        (
            ["workload.source=lengths", "workload.input_lengths=fixed:64", "workload.output_lengths=fixed:8"],
            "quickstart-custom",
        ),
        (["grid.caches=[dynamic]", "name=mine"], "mine"),  # a name given wins
        (["measure=quick", "report.rank_by=ttft_ms"], "quickstart"),  # how it measures: still the same sweep
    ],
)
def test_a_sweep_whose_grid_the_command_line_changed_is_named_for_it(overrides, name):
    assert compose_config(overrides).config.name == name


def test_default_is_quickstart_and_sweeps_select_files():
    quick = compose_config([]).config
    assert quick.name == "quickstart"
    caches = quick.grid.caches
    assert len(caches) >= 4 and any(c.startswith("quantized") for c in caches)
    assert len(quick.grid.context_lengths) >= 2 and len(quick.grid.dtypes) >= 2
    assert quick.grid.compile == [False]
    long = compose_config(["+sweep=long_context"]).config
    assert long.name == "long_context"
    assert min(long.grid.context_lengths) == 4096 and max(long.grid.context_lengths) > 128_000
    assert long.grid.batch_sizes == [1, 4] and long.grid.dtypes == ["bfloat16"]


def test_overrides_change_axes_and_reserved_static():
    cfg = compose_config(
        [
            "+sweep=long_context",
            "grid.context_lengths=[8192,32768]",
            "grid.caches=[dynamic,static@65536]",
            "ray.address=auto",
        ]
    ).config
    assert cfg.grid.context_lengths == [8192, 32768]
    assert cfg.grid.caches == ["dynamic", "static@65536"]
    assert cfg.ray.address == "auto"


def test_user_sweep_folder(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text("name: mine\ngrid:\n  caches: [dynamic, no_cache]\n")
    monkeypatch.setenv("KVSWEEP_SWEEPS_PATH", str(tmp_path))
    cfg = compose_config(["+sweep=mine"]).config
    assert cfg.name == "mine" and cfg.grid.caches == ["dynamic", "no_cache"]


def test_help_lists_every_key_with_the_value_a_run_uses(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for key in ("grid.context_lengths", "measure.repeats", "ray.cell_timeout_s", "mlflow.tracking_uri"):
        assert key in out
    # What `python -m kvsweep` runs with: the preset the quickstart sweep file selects, over the schema.
    quickstart = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    (preset,) = [entry["override /measure"] for entry in quickstart["defaults"]]
    chosen = yaml.safe_load((ROOT / "conf" / "measure" / f"{preset}.yaml").read_text())
    repeats = next(line for line in out.splitlines() if line.split()[:1] == ["measure.repeats"])
    schema = KvSweepConfig().measure.repeats  # the schema's own default, which a +sweep=NAME builds on
    assert repeats.endswith(f"(default {schema}; here {chosen['repeats']})"), repeats
    assert "testing" not in out  # test seams are not part of what users configure
    # ...and what the names may be: every shipped sweep, measure preset, model preset and cache
    listed = {
        line.split(" (", 1)[0]: line
        for line in out.splitlines()
        if line.startswith(("Sweeps", "Measure", "Model", "Caches"))
    }
    assert all(p.stem in listed["Sweeps"] for p in (ROOT / "sweeps").glob("*.yaml"))
    assert all(p.stem in listed["Measure presets"] for p in (ROOT / "conf" / "measure").glob("*.yaml"))
    assert "llama-3.1-8b" in listed["Model presets"] and "paged" in listed["Caches"]


def test_cfg_job_prints_the_composed_config_and_starts_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = "http://alice:pw-9f8e7d@tracking.example:5000"
    assert main(["--cfg", "job", "+sweep=long_context", "grid.batch_sizes=[2]", f"mlflow.tracking_uri={uri}"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["name"] == "long_context-custom" and printed["grid"]["batch_sizes"] == [2]  # its grid changed
    assert printed["grid"]["dtypes"] == ["bfloat16"]  # from sweeps/long_context.yaml
    assert printed["measure"]["repeats"] >= 1 and "hydra" not in printed
    assert printed["mlflow"]["tracking_uri"] == "http://***@tracking.example:5000"  # printed redacted
    assert list(tmp_path.iterdir()) == []  # no outputs/, no mlflow.db: nothing started


def test_cfg_all_adds_hydras_own_node(capsys):
    assert main(["--cfg=all", "hydra.run.dir=/tmp/kv-run"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["hydra"]["run"]["dir"] == "/tmp/kv-run"
    assert printed["name"] == "quickstart" and "grid" in printed
    assert main(["-c", "hydra"]) == 0
    assert set(yaml.safe_load(capsys.readouterr().out)) == {"hydra"}


def test_info_prints_the_search_path_and_the_sweep_files(tmp_path, monkeypatch, capsys):
    (tmp_path / "mine.yaml").write_text("name: mine\n")
    (tmp_path / "quickstart.yaml").write_text("name: my-quickstart\n")
    monkeypatch.setenv("KVSWEEP_SWEEPS_PATH", str(tmp_path))
    assert main(["--info"]) == 0
    out = capsys.readouterr().out
    conf = Path(__file__).resolve().parent.parent / "conf"
    assert f"file://{conf}" in out and "pkg://hydra.conf" in out
    bundled = sorted(p.stem for p in (conf.parent / "sweeps").glob("*.yaml"))
    assert all(re.search(rf"^\s+{name}\s", out, re.M) for name in [*bundled, "mine"]), out
    assert f"{tmp_path}  (KVSWEEP_SWEEPS_PATH)" in out
    assert f"(overridden by {tmp_path / 'quickstart.yaml'})" in out  # the user's file wins the name
    assert compose_config(["+sweep=quickstart"]).config.name == "my-quickstart"  # as --info said
