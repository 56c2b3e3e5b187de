"""A static cache sized for a mix's longest request makes its short requests pay for that length.

On the KV-heavy test model a decode step's attention is a large share of its time, so a step's cost grows with the
positions attention reads. Dynamic reads what a request has cached; static reads its whole reservation, masked.
So a short request served by static sized for the long one should decode about as slowly as dynamic decodes the
long request itself (both read about 2,000 positions a step), and clearly slower than dynamic decodes it: the
expectation comes from dynamic's own two lengths, measured in the same run, interleaved.
"""

import functools
import statistics

import pytest
import torch

from kvsweep.caches import get_strategy
from kvsweep.cell.checks import check_cache
from kvsweep.cell.generate_session import GenerateSession
from kvsweep.cell.workload_cell import served_strategy
from kvsweep.cell.workload_replay import prompt_ids, replay_generate
from kvsweep.grid import Cell
from kvsweep.models.build import build_model
from kvsweep.models.resolve import classify
from kvsweep.workload.request_mix import Request
from kvsweep_testkit.kv_heavy import save_kv_heavy

SHORT, LONG, NEW = 32, 2000, 16
MIX = [Request(SHORT, NEW), Request(SHORT, NEW), Request(LONG, NEW), Request(SHORT, NEW)]


@pytest.mark.slow
def test_static_sized_for_the_longest_request_slows_the_short_ones_as_its_length_predicts(tmp_path):
    torch.set_num_threads(1)
    folder = save_kv_heavy(tmp_path / "kv-heavy")
    model = build_model(classify(str(folder)), "float32", "cpu", seed=0)
    cell = Cell(str(folder), "float32", LONG, 1, NEW, "static", False, workload="mix", serving="sequential")
    prompts = prompt_ids(MIX, model.config.vocab_size, seed=0)
    session = GenerateSession(model, torch.zeros(1, LONG, dtype=torch.long), cell, "cpu", None)
    static, dynamic = served_strategy(get_strategy("static"), cell), get_strategy("dynamic")
    assert static.reserve_tokens == LONG + NEW - 1  # sized for the longest request, for every request
    tpot: dict[tuple[str, int], list[float]] = {}
    for _ in range(3):  # interleaved: a burst of noise falls on both strategies alike
        for strategy in (dynamic, static):
            # every call's cache is the strategy's: static's reserving LONG + NEW - 1 for the short requests too
            check = functools.partial(check_cache, strategy, cell=cell)
            replay = replay_generate(session, strategy, MIX, prompts, "sequential", 1, check)
            assert len(replay.calls) == len(MIX)  # one call a request, each checked
            for request in replay.requests:
                tpot.setdefault((strategy.base_name, request.input_tokens), []).append(request.tpot_ms)
    median = {key: statistics.median(values) for key, values in tpot.items()}
    dynamic_short, dynamic_long = median[("dynamic", SHORT)], median[("dynamic", LONG)]
    static_short = median[("static", SHORT)]
    assert dynamic_long > 1.3 * dynamic_short, median  # the model is KV-heavy: length shows in a step's time
    # static's short requests read about as many positions as dynamic's long one: within 40% of its step time
    assert 0.6 * dynamic_long < static_short < 1.4 * dynamic_long, median
