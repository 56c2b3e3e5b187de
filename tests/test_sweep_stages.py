"""The sweep's stages declare what each produces: a stage called before the one it depends on says which
stage has not run, instead of an AttributeError deep inside it. No Ray: nothing here gets that far."""

import io

import pytest

from kvsweep.config.schema import KvSweepConfig
from kvsweep.driver.inputs_choice import choose_inputs
from kvsweep.driver.sweep import StageNotRun, SweepRun
from kvsweep.driver.sweep_finish import finish
from kvsweep.testing.testing_config import Seams


@pytest.fixture
def sweep(tmp_path):
    cfg = KvSweepConfig()
    return SweepRun(cfg, "", tmp_path / "run", io.StringIO(), Seams(), choose_inputs(cfg))


@pytest.mark.parametrize(
    ("early", "missing"),
    [
        (lambda s: s.plan(), "connect"),
        (lambda s: s.open_tracking(), "connect"),
        (lambda s: s.queue(), "plan"),
        (lambda s: s.schedule([]), "queue"),
        (finish, "open_tracking"),
    ],
)
def test_a_stage_called_too_early_names_the_stage_it_needs(sweep, early, missing):
    with pytest.raises(StageNotRun, match=rf"SweepRun\.{missing}\(\) has not run yet"):
        early(sweep)
    assert not (sweep.run_dir / "journal.jsonl").exists()  # it failed before writing anything
