"""GPU sharing checks, with process lists given directly or through a stand-in for NVML's bindings
(no GPU here).

The probe is asked while the cell holds a CUDA context, so its own process is on each of its GPUs: a
list that cannot contain it (empty) is no evidence of being alone. A cell over two GPUs is probed on both.
"""

import time

from fake_nvml import FakeGpu, FakeNvml
from kvsweep.measure.contention import gpu_verdict
from kvsweep.measure.gpu_sharing import SharingProbe, nvml_processes, others


def probe_seeing(*lists: list[int] | None, own_pid: int = 42) -> SharingProbe:
    """A probe whose NVML answers are `lists`, one per call."""
    answers = iter(lists)
    return SharingProbe(["GPU-abc"], lister=lambda uuid: next(answers), own_pid=own_pid)


def verdict_after(*lists: list[int] | None, own_pid: int = 42) -> str:
    probe = probe_seeing(*lists, own_pid=own_pid)
    for _ in lists:
        probe.check()
    return probe.found().verdict


def test_other_processes_exclude_ours_and_handle_pid_namespaces():
    assert others([10, 42, 99], own_pid=42) == [10, 99]
    assert others([500, 501], own_pid=7) == [501]  # our host PID is hidden from us: one is ours
    assert others([], own_pid=7) is None  # we are not shown, so nobody else need be either


def test_contended_when_any_check_saw_someone_else():
    lists = iter([[42], [42, 77]])
    probe = SharingProbe(["GPU-abc"], lister=lambda uuid: next(lists), own_pid=42)
    probe.start()  # a phase meter: one check before the measured phase (no wait asked for)...
    assert probe.found().verdict == "false"
    found = probe.stop()  # ...and one after it
    assert found.verdict == "true" and found.seen == {77}


def test_an_empty_process_list_on_our_own_gpu_is_unknown_not_alone():
    # NVML in a PID namespace it cannot map lists nobody, though our process holds a context there.
    assert verdict_after([], []) == "unknown"
    assert verdict_after([42], []) == "unknown"  # one blind check is enough to not know
    assert verdict_after([], [42, 77]) == "true"  # but what was seen still counts


def test_in_a_container_one_unknown_pid_is_taken_to_be_ours():
    # NVML reports host PIDs; ours (7 inside the container) is never among them.
    assert verdict_after([3120], [3120], own_pid=7) == "false"  # only us
    assert verdict_after([3120], [3120, 4455], own_pid=7) == "true"  # us and one more


def test_without_nvml_the_answer_is_unknown():
    assert SharingProbe(()).found().verdict == "unknown"  # not on CUDA: no GPU to ask about
    probe = SharingProbe(["GPU-abc"], lister=lambda uuid: None)
    assert probe.check() is None and probe.found().verdict == "unknown"
    assert nvml_processes("GPU-does-not-exist") is None  # no driver on this machine: quietly None


def test_waits_for_a_busy_gpu_to_free_up():
    calls = []

    def lister(uuid):
        calls.append(uuid)
        return [42, 77] if len(calls) < 3 else [42]

    probe = SharingProbe(["GPU-abc"], lister=lister, own_pid=42)
    probe.wait_until_alone(timeout_s=10, poll_s=0.01)
    assert len(calls) == 3 and probe.check() == []


def test_does_not_wait_when_nvml_cannot_see_the_gpus_processes():
    probe = SharingProbe(["GPU-abc"], lister=lambda uuid: [], own_pid=42)
    began = time.monotonic()
    probe.wait_until_alone(timeout_s=10, poll_s=0.01)
    assert time.monotonic() - began < 1  # nothing to wait for that it could ever see leave


def split_cell(second_pids: list[int]) -> FakeNvml:
    """NVML on a node where our cell (pid 42) holds both GPUs; `second_pids` also on the second."""
    return FakeNvml([FakeGpu("GPU-a", pids=[42]), FakeGpu("GPU-b", pids=[42, *second_pids])])


def test_a_split_cell_sees_another_process_on_its_second_gpu():
    nvml = split_cell(second_pids=[77])
    probe = SharingProbe(["GPU-a", "GPU-b"], lister=lambda uuid: nvml_processes(uuid, nvml), own_pid=42)
    assert probe.check() == [77]
    found = probe.found()
    assert found.verdict == "true" and found.seen == {77}
    assert gpu_verdict(found.verdict, found.seen_on) == ("true", "gpu pids 77 on GPU-b")  # which GPU, named
    assert found.record() == {"gpu_sharing": "GPU-a alone, GPU-b pids 77", "gpu_other_pids": "77"}


def test_a_split_cell_alone_on_both_gpus_is_alone_and_says_so_for_each():
    nvml = split_cell(second_pids=[])
    probe = SharingProbe(["GPU-a", "GPU-b"], lister=lambda uuid: nvml_processes(uuid, nvml), own_pid=42)
    probe.start()
    found = probe.stop()
    assert found.verdict == "false"
    assert found.record() == {"gpu_sharing": "GPU-a alone, GPU-b alone"}


def test_a_second_gpu_nvml_cannot_read_makes_the_split_cell_unknown():
    answers = {"GPU-a": [42], "GPU-b": None}
    probe = SharingProbe(["GPU-a", "GPU-b"], lister=answers.get, own_pid=42)
    assert probe.check() is None
    assert probe.found().verdict == "unknown"
    assert probe.found().record() == {"gpu_sharing": "GPU-a alone, GPU-b unknown"}


def test_one_gpus_evidence_reads_as_before_and_two_name_theirs():
    assert gpu_verdict("true", {"GPU-a": {5678, 1234}}) == ("true", "gpu pids 1234,5678")
    two = {"GPU-a": {9}, "GPU-b": {77, 8}}
    assert gpu_verdict("true", two) == ("true", "gpu pids 9 on GPU-a, 8,77 on GPU-b")
    assert gpu_verdict("false", {"GPU-a": set(), "GPU-b": set()}) == ("false", "gpu alone")


def test_a_split_cell_waits_for_its_second_gpu_to_free_up():
    nvml = split_cell(second_pids=[77])
    polls = []

    def lister(uuid):
        polls.append(uuid)
        if len(polls) == 4:  # the other job leaves the second GPU after the second poll
            nvml.gpus[1].pids.remove(77)
        return nvml_processes(uuid, nvml)

    probe = SharingProbe(["GPU-a", "GPU-b"], lister=lister, own_pid=42)
    probe.wait_until_alone(timeout_s=10, poll_s=0.01)
    assert polls == ["GPU-a", "GPU-b"] * 2  # polled both twice: busy, then free
    assert probe.check() == []
