"""`grid.weights`: weight quantization as its own axis, crossed with the cache, planned, measured and reported
apart from it; a checkpoint that is quantized already is recognised and not quantized again."""

import json
from dataclasses import replace

import pytest

from kvsweep.caches import get_strategy
from kvsweep.cli import main
from kvsweep.grid import Cell, MeasureProtocol, cell_id, cell_label, expand_grid
from kvsweep.models.facts import read_facts
from kvsweep.models.resolve import classify
from kvsweep.plan.cell_plan import plan_cell
from kvsweep.report.weights_tables import weights_kv_tables
from kvsweep.results import CellResult
from kvsweep.units import MIB

PROTO = MeasureProtocol.exact(warmup=1, repeats=3, seed=0, device="cpu", threads=1)


def test_the_axis_crosses_every_cell_and_quantized_weights_are_another_cell():
    grid = {
        "models": ["tiny-llama"],
        "weights": ["none", "quanto-int8"],
        "dtypes": ["float32"],
        "batch_sizes": [1],
        "context_lengths": [64],
        "max_new_tokens": [8],
        "caches": ["dynamic", "quantized-quanto-int4"],
        "compile": [False],
    }
    cells = expand_grid(grid)
    assert sorted((c.weights, c.cache) for c in cells) == [
        ("none", "dynamic"),
        ("none", "quantized-quanto-int4"),
        ("quanto-int8", "dynamic"),
        ("quanto-int8", "quantized-quanto-int4"),
    ]
    plain = next(c for c in cells if c.weights == "none" and c.cache == "dynamic")
    assert cell_id(replace(plain, weights="quanto-int8"), PROTO) != cell_id(plain, PROTO)
    assert cell_label(replace(plain, weights="quanto-int8")).endswith("tiny-llama quanto-int8")
    assert cell_label(plain).endswith("tiny-llama")


def test_quantized_weights_are_planned_smaller_and_cuda_only_schemes_skip_on_cpu():
    facts = read_facts(classify("qwen3-8b"))
    cell = Cell("qwen3-8b", "bfloat16", 4096, 1, 64, "dynamic", False)
    plans = {
        w: plan_cell(replace(cell, weights=w), "cpu", facts.shape, parameters=facts.parameters, layout=facts.layout)
        for w in ("none", "quanto-int8", "quanto-int4", "bnb-nf4")
    }
    sixteen = plans["none"].memory.weights_bytes
    assert sixteen == facts.parameters * 2
    # int8 keeps a byte per quantized weight and int4 half of one, plus scales: between those bounds and 16-bit
    assert sixteen / 2 < plans["quanto-int8"].memory.weights_bytes < sixteen * 0.6
    assert sixteen / 4 < plans["quanto-int4"].memory.weights_bytes < plans["quanto-int8"].memory.weights_bytes
    assert plans["bnb-nf4"].skip_reason is not None and "CUDA" in plans["bnb-nf4"].skip_reason
    assert all(plans[w].runs for w in ("none", "quanto-int8", "quanto-int4"))


def _result(weights: str, cache: str, tpot: float, rss: float, agreement: float = 1.0) -> CellResult:
    cell = Cell("tiny-llama", "float32", 64, 1, 8, cache, False, "passkey", weights)
    metrics = {"tpot_ms": tpot, "peak_host_rss_bytes": rss, "passkey_accuracy": 1.0, "token_agreement": agreement}
    return CellResult(f"{weights}-{cache}", cell, "ok", "", metrics)


def test_the_report_lays_weights_against_caches_relative_to_16_bit_weights_and_the_dense_cache():
    results = [
        _result("none", "dynamic", 10.0, 400 * MIB),
        _result("none", "quantized-quanto-int4", 12.0, 380 * MIB, 0.9),
        _result("quanto-int8", "dynamic", 15.0, 300 * MIB),
        _result("quanto-int8", "quantized-quanto-int4", 18.0, 280 * MIB, 0.8),
        _result("none", "static", 9.0, 400 * MIB),  # not a column: neither dense baseline nor quantized
    ]
    [table] = weights_kv_tables(results)
    assert table.header == ["weights \\ KV cache", "dynamic", "quantized-quanto-int4"]
    assert [row[0] for row in table.rows] == ["none", "quanto-int8"]
    assert table.rows[0][1].startswith("10.00 ms/token (1.00x); 400 MiB (1.00x); passkey 1.00")
    assert "18.00 ms/token (1.80x); 280 MiB (0.70x)" in table.rows[1][2] and "agreement 0.80" in table.rows[1][2]
    assert weights_kv_tables([r for r in results if r.cell.weights == "none"]) == []  # one weights value: no table


@pytest.fixture
def awq_folder(tmp_path):
    """A local checkpoint whose config says it is AWQ-quantized (only the config is read when planning)."""
    from transformers import AutoConfig

    from kvsweep.models.presets import PRESETS

    config = AutoConfig.for_model("llama", **PRESETS["tiny-llama"].config).to_dict()
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
    folder = tmp_path / "awq-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_checkpoint_quantized_already_is_labelled_and_not_quantized_again(awq_folder, tmp_path, capsys):
    facts = read_facts(classify(str(awq_folder)))
    assert facts.prequantized == "awq-int4"
    # its 16-bit count says nothing of its packed bytes: nothing is predicted, so nothing is skipped on a guess
    assert facts.parameters is not None and facts.planned_parameters is None
    args = [f"grid.models=[{awq_folder}]", "dry_run=true", f"hydra.run.dir={tmp_path}/r"]
    assert main([*args, "grid.weights=[none,quanto-int8]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already quantized (awq-int4)" in err[0] and "quanto-int8" in err[0], err


def test_an_unknown_scheme_is_one_line_naming_it(tmp_path, capsys):
    assert main(["grid.weights=[quanto-int3]", "dry_run=true", f"hydra.run.dir={tmp_path}/r"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grid.weights[0]" in err[0] and "quanto-int3" in err[0], err


def test_a_cpu_sweep_measures_each_weights_and_cache_pair_and_predicts_its_weight_bytes(run_sweep):
    """Through `python -m kvsweep`: 16-bit and int8 weights, each with the dense and a quantized cache. The
    measured weight bytes (from the loaded tensors' storage) equal the planner's, and the int8 cells' lie
    between a quarter of float32's (every weight one byte) and 0.6 of it: tiny-llama's embeddings and head
    (262k of its 852k parameters) stay float32, its 590k linear weights take a byte each plus their scales."""
    from conftest import cell_runs

    run = run_sweep("grid.weights=[none,quanto-int8]", "grid.caches=[dynamic,quantized-quanto-int4]")
    assert run.code == 0, run.out + run.err
    _, children = cell_runs(run.tracking_uri)
    assert len(children) == 4 and {c.data.tags["kvsweep.status"] for c in children} == {"ok"}
    by = {(c.data.params["weights"], c.data.params["cache"]): c.data for c in children}
    for data in by.values():
        assert data.metrics["weights_bytes"] == data.metrics["predicted_weights_bytes"]
    full = by[("none", "dynamic")].metrics["weights_bytes"]
    assert full == read_facts(classify("tiny-llama")).parameters * 4
    int8 = by[("quanto-int8", "dynamic")].metrics["weights_bytes"]
    assert full / 4 < int8 < full * 0.6
    assert by[("quanto-int8", "dynamic")].metrics["kv_cache_bytes"] == by[("none", "dynamic")].metrics["kv_cache_bytes"]
    # a decode step reads the weights as stored: int8 cells read less by exactly the bytes their weights shed
    decode = {w: by[(w, "dynamic")].metrics["decode_bytes_per_token"] for w in ("none", "quanto-int8")}
    assert decode["none"] - decode["quanto-int8"] == full - int8
    report = (run.run_dir / "report" / "selection.md").read_text()
    assert "## Weights x KV cache" in report and "| quanto-int8 |" in report
    strategy = get_strategy("quantized-quanto-int4")
    assert strategy.backend is not None
