"""What a node reports of its software at connect, and how reports are compared (no cluster here).

Each expectation is read independently of the code under test: the packages' metadata, torch's own
`__version__`, a changed copy of kvsweep's sources.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvsweep
from kvsweep.driver.software_survey import NodeReport, gpu_models, mismatch_line, software_differences
from kvsweep.node_software import describe_software, fingerprint
from kvsweep.testing.testing_config import REPORTED_VERSIONS_ENV

BACKENDS = ("optimum-quanto", "hqq", "bitsandbytes", "torchao")


def installed(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def test_report_gives_the_installed_versions_and_torchs_build_tag():
    import torch

    report = describe_software()
    assert report["transformers"] == importlib.metadata.version("transformers")
    for backend in BACKENDS:
        assert report[backend] == installed(backend), backend
    assert report["torch"] == str(torch.__version__)  # with its build tag (`+cpu`, `+cu128`)
    assert report["cuda"] == str(torch.version.cuda or "none")
    assert report["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["kvsweep"].startswith(f"{kvsweep.__version__}+src.")


def sources_hash(package_parent: Path) -> str:
    """`kvsweep_sources()` as a fresh process importing kvsweep from `package_parent` reports it."""
    code = "from kvsweep.node_software import kvsweep_sources; print(kvsweep_sources())"
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_kvsweep_is_reported_by_its_sources_so_an_edit_shows_though_the_version_does_not_change(tmp_path):
    installed_here = Path(kvsweep.__file__).parent
    same, edited = tmp_path / "same", tmp_path / "edited"
    for copy in (same, edited):
        shutil.copytree(installed_here, copy / "kvsweep", ignore=shutil.ignore_patterns("__pycache__"))
    with (edited / "kvsweep" / "grid.py").open("a") as grid:
        grid.write("\n# a hand edit on one node\n")
    assert sources_hash(same).strip() == describe_software()["kvsweep"]
    assert sources_hash(edited) != sources_hash(same)
    assert sources_hash(edited).startswith(f"{kvsweep.__version__}+src.")  # the version alone would not tell


def test_the_testing_seam_replaces_reported_fields_and_refuses_unknown_ones(monkeypatch):
    monkeypatch.setenv(REPORTED_VERSIONS_ENV, json.dumps({"transformers": "9.9.9", "gpu": "NVIDIA A100"}))
    report = describe_software()
    assert report["transformers"] == "9.9.9" and report["gpu"] == "NVIDIA A100"
    assert report["hqq"] == installed("hqq")  # the rest as it is
    monkeypatch.setenv(REPORTED_VERSIONS_ENV, json.dumps({"transformer": "9.9.9"}))
    with pytest.raises(ValueError, match="unknown field 'transformer'"):
        describe_software()
    monkeypatch.setenv(REPORTED_VERSIONS_ENV, "{transformers: 9.9.9}")
    with pytest.raises(ValueError, match="not JSON"):
        describe_software()


SAME = {
    "kvsweep": "0.1.0+src.aaaaaaaaaaaa",
    "python": "3.11.7",
    "torch": "2.13.0+cu128",
    "cuda": "12.8",
    "transformers": "5.25.0",
    "optimum-quanto": "0.2.7",
    "hqq": "0.2.8",
    "bitsandbytes": "absent",
    "torchao": "absent",
    "nvidia_driver": "570.86.15",
    "gpu": "NVIDIA H100 80GB HBM3",
}
DRIVER = {**SAME, "torch": "2.13.0+cpu", "cuda": "none", "gpu": "none", "nvidia_driver": "none"}


def node(i: int, **changed: str) -> NodeReport:
    return NodeReport(f"{i:02d}" * 28, f"10.0.0.{i}", {**SAME, **changed})


def test_same_software_everywhere_is_no_difference_though_the_driver_has_a_cpu_torch_and_no_gpu():
    assert software_differences(DRIVER, [node(1), node(2)]) == []
    assert gpu_models([node(1), node(2)]) == ""


def test_one_odd_node_is_named_with_both_versions_the_common_one_first():
    found = software_differences(DRIVER, [node(1), node(2, transformers="9.9.9"), node(3)])
    assert found == [
        "transformers 5.25.0 on the driver, 10.0.0.1 (node 01010101), 10.0.0.3 (node 03030303); "
        "9.9.9 on 10.0.0.2 (node 02020202)"
    ]
    line = mismatch_line(found, allowed=False)
    assert len(line.splitlines()) == 1 and "ray.allow_mixed_versions=true" in line and "9.9.9" in line
    assert "measuring anyway" in mismatch_line(found, allowed=True)


def test_every_software_field_but_the_gpu_counts():
    for field in SAME:
        if field == "gpu":
            continue
        found = software_differences(SAME, [node(1), node(2, **{field: "other"})])
        assert len(found) == 1 and found[0].startswith(f"{field} ") and "other on 10.0.0.2" in found[0], field


def test_the_driver_counts_for_the_code_it_plans_and_sends_only():
    assert software_differences({**DRIVER, "kvsweep": "0.1.0+src.bbbbbbbbbbbb"}, [node(1)]) == [
        "kvsweep 0.1.0+src.aaaaaaaaaaaa on 10.0.0.1 (node 01010101); 0.1.0+src.bbbbbbbbbbbb on the driver"
    ]
    assert software_differences({**DRIVER, "hqq": "absent", "python": "3.12.1"}, [node(1)]) == []


def test_a_gpu_model_difference_is_not_a_software_difference_but_is_said():
    nodes = [node(1), node(2, gpu="NVIDIA A100-SXM4-80GB")]
    assert software_differences(DRIVER, nodes) == []
    assert (
        gpu_models(nodes)
        == "NVIDIA A100-SXM4-80GB on 10.0.0.2 (node 02020202); NVIDIA H100 80GB HBM3 on 10.0.0.1 (node 01010101)"
    )


def test_a_node_without_a_report_is_named_with_why():
    silent = NodeReport("ff" * 28, "10.0.0.9", None, "no answer in 60 s")
    assert software_differences(DRIVER, [node(1), silent]) == [
        "10.0.0.9 (node ffffffff) gave no report (no answer in 60 s)"
    ]


def test_many_nodes_with_one_value_are_counted_not_listed():
    found = software_differences(DRIVER, [*(node(i) for i in range(1, 9)), node(9, hqq="0.3.0")])
    assert found == [
        "hqq 0.2.8 on 10.0.0.1 (node 01010101), 10.0.0.2 (node 02020202), 10.0.0.3 (node 03030303) "
        "and 5 more nodes; 0.3.0 on 10.0.0.9 (node 09090909)"
    ]


def test_the_fingerprint_follows_software_not_the_gpu():
    assert fingerprint(SAME) == fingerprint({**SAME, "gpu": "NVIDIA A100-SXM4-80GB"})
    assert fingerprint(SAME) != fingerprint({**SAME, "transformers": "5.26.0"})


def test_allow_mixed_versions_is_a_boolean_key_defaulting_to_false(capsys):
    from kvsweep.cli import main
    from kvsweep.config.compose import compose_config

    assert compose_config([]).config.ray.allow_mixed_versions is False
    assert compose_config(["ray.allow_mixed_versions=true"]).config.ray.allow_mixed_versions is True
    assert main(["ray.allow_mixed_versions=perhaps"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ray.allow_mixed_versions" in err


def test_a_local_instance_is_asked_in_process_and_answers_as_a_task_on_its_node_would(ray_cluster):
    """The shortcut's premise: on a local instance this process started, a task pinned to the node (what a
    joined cluster gets) reports exactly what this process reports, only later."""
    from kvsweep.driver.ray_session import CellNeeds
    from kvsweep.driver.software_survey import take_survey

    assert ray_cluster.local
    needs = CellNeeds(gpus=0, cpus=0)
    in_process, by_task = take_survey(needs, local=True), take_survey(needs, local=False)
    assert len(in_process.nodes) == len(by_task.nodes) == 1
    assert in_process.nodes[0].node_id == by_task.nodes[0].node_id
    assert in_process.nodes[0].report == by_task.nodes[0].report


def test_cells_on_the_cpu_compare_no_nvidia_driver():
    from kvsweep.node_software import CPU_CELLS_SOFTWARE

    nodes = [node(1), node(2, nvidia_driver="none", gpu="none")]  # a GPU node and a CPU node run CPU cells
    assert software_differences(DRIVER, nodes, CPU_CELLS_SOFTWARE) == []
    assert software_differences(DRIVER, nodes) == [
        "nvidia_driver 570.86.15 on 10.0.0.1 (node 01010101); none on 10.0.0.2 (node 02020202)"
    ]


def test_each_cell_gets_its_own_nodes_record_and_an_unsurveyed_node_says_so():
    from kvsweep.driver.software_survey import Survey

    a, b = node(1), node(2, transformers="9.9.9", gpu="NVIDIA A100-SXM4-80GB")
    silent = NodeReport("ee" * 28, "10.0.0.5", None, "no answer in 60 s")
    survey = Survey(DRIVER, [a, b, silent])
    on_a, on_b = survey.cell_environment(a.node_id), survey.cell_environment(b.node_id)
    assert on_a["gpu_model"] == "NVIDIA H100 80GB HBM3" and on_b["gpu_model"] == "NVIDIA A100-SXM4-80GB"
    assert on_a["node_software"] != on_b["node_software"]
    assert survey.cell_environment(node(3).node_id)["node_software"].startswith("unchecked")
    assert survey.cell_environment(silent.node_id)["node_software"].startswith("unknown")
