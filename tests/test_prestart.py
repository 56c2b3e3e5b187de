"""Prestarted spare actors: without forking, the next cell runs in a fresh process that imported ahead,
never during a measurement; forked cells (the default) import nothing at all."""

import json
from itertools import product


def timelines(run_dir):
    lines = (run_dir / "journal.jsonl").read_text().splitlines()
    results = [json.loads(line)["result"] for line in lines if '"kind": "cell"' in line]
    return [r["environment"]["timeline"] for r in results]


def test_spares_run_the_next_cells_and_never_import_during_a_measured_phase(run_sweep):
    run = run_sweep("grid.caches=[dynamic,static,no_cache]", "ray.prestart=1", "ray.fork_cells=false")
    assert run.code == 0, run.out
    cells = timelines(run.run_dir)
    assert len(cells) == 3
    spares = [t for t in cells if "prepared_at" in t]
    assert len(spares) == 2  # every cell but the first ran in a spare
    for spare in spares:
        assert spare["prepared_at"] <= spare["run_at"]  # imported before its cell arrived
    for spare, cell in product(spares, cells):
        overlap = min(spare["prepared_at"], cell["measured_at"]) - max(spare["prepare_at"], cell["gate_passed_at"])
        assert overlap <= 0.05, (spare, cell)


def test_prestart_off_starts_every_actor_on_demand(run_sweep):
    run = run_sweep("grid.caches=[dynamic,static]", "ray.prestart=0")
    assert run.code == 0, run.out
    assert all("prepare_at" not in t for t in timelines(run.run_dir))
