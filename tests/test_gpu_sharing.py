"""GPU sharing checks, with process lists given directly (no GPU here)."""

from kvsweep.measure.gpu_sharing import SharingProbe, nvml_processes, others


def test_other_processes_exclude_ours_and_handle_pid_namespaces():
    assert others([10, 42, 99], own_pid=42) == [10, 99]
    assert others([500, 501], own_pid=7) == [501]  # our host PID is hidden from us: one is ours
    assert others([], own_pid=7) == []


def test_contended_when_any_check_saw_someone_else():
    lists = iter([[42], [42, 77]])
    probe = SharingProbe("GPU-abc", lister=lambda uuid: next(lists), own_pid=42)
    probe.check()
    assert probe.verdict == "false"
    probe.check()
    assert probe.verdict == "true" and probe.seen == {77}


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
