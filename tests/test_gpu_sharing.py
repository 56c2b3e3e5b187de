"""GPU sharing checks, with process lists given directly (no GPU here).

The probe is asked while the cell holds a CUDA context, so its own process is on the GPU: a list that
cannot contain it (empty) is no evidence of being alone.
"""

import time

from kvsweep.measure.gpu_sharing import SharingProbe, nvml_processes, others


def probe_seeing(*lists: list[int] | None, own_pid: int = 42) -> SharingProbe:
    """A probe whose NVML answers are `lists`, one per call."""
    answers = iter(lists)
    return SharingProbe("GPU-abc", lister=lambda uuid: next(answers), own_pid=own_pid)


def verdict_after(*lists: list[int] | None, own_pid: int = 42) -> str:
    probe = probe_seeing(*lists, own_pid=own_pid)
    for _ in lists:
        probe.check()
    return probe.verdict


def test_other_processes_exclude_ours_and_handle_pid_namespaces():
    assert others([10, 42, 99], own_pid=42) == [10, 99]
    assert others([500, 501], own_pid=7) == [501]  # our host PID is hidden from us: one is ours
    assert others([], own_pid=7) is None  # we are not shown, so nobody else need be either


def test_contended_when_any_check_saw_someone_else():
    lists = iter([[42], [42, 77]])
    probe = SharingProbe("GPU-abc", lister=lambda uuid: next(lists), own_pid=42)
    probe.check()
    assert probe.verdict == "false"
    probe.check()
    assert probe.verdict == "true" and probe.seen == {77}


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
    assert SharingProbe(None).verdict == "unknown"
    probe = SharingProbe("GPU-abc", lister=lambda uuid: None)
    assert probe.check() is None and probe.verdict == "unknown"
    assert nvml_processes("GPU-does-not-exist") is None  # no driver on this machine: quietly None


def test_waits_for_a_busy_gpu_to_free_up():
    calls = []

    def lister(uuid):
        calls.append(uuid)
        return [42, 77] if len(calls) < 3 else [42]

    probe = SharingProbe("GPU-abc", lister=lister, own_pid=42)
    probe.wait_until_alone(timeout_s=10, poll_s=0.01)
    assert len(calls) == 3 and probe.check() == []


def test_does_not_wait_when_nvml_cannot_see_the_gpus_processes():
    probe = SharingProbe("GPU-abc", lister=lambda uuid: [], own_pid=42)
    began = time.monotonic()
    probe.wait_until_alone(timeout_s=10, poll_s=0.01)
    assert time.monotonic() - began < 1  # nothing to wait for that it could ever see leave
