"""The live sweep's connection to MLflow: never loses a result, never stops the sweep.

Every result is already in the journal when it reaches the sink. If MLflow fails, the sink says so
once, keeps the results queued and retries with backoff as the sweep goes on; at the end it makes a
last bounded attempt and tells the user how to `sync` whatever is left.

While the sweep runs, it holds a lease on its parent run (`lease.py`): another identical sweep
refuses to resume that parent instead of measuring its cells a second time. Before each send the lease is
checked; one taken by another sweep (this one was stopped or cut off past the lease) raises `LeaseLost`, and
nothing more is sent: the journal keeps every result, and `sync` sends those the parent lacks.

A resume that fails half-way (the parent taken, its cells not yet read) lets the parent go and tries once more;
failing again, the sweep measures under a parent of its own later: never every cell again under the old one.
"""

import time
from collections.abc import Callable
from pathlib import Path

from kvsweep.errors import first_line
from kvsweep.grid import Cell
from kvsweep.names import REPORT_DIR, RunTag
from kvsweep.redact import redact_text
from kvsweep.results import RESULT_STATUSES, CellResult
from kvsweep.tracking.client import SweepTracker
from kvsweep.tracking.journal import JOURNAL_NAME, SWEEP_FILES, Journal, SweepHeader, send_result, sync_journal
from kvsweep.tracking.lease import Lease, LeaseHeld, LeaseLost, LeaseTimes
from kvsweep.tracking.store import finished, result_from_run, with_trials
from kvsweep.tracking.take_parent import Taken, take_parent

MAX_BACKOFF_S = 60.0
FINAL_ATTEMPTS = 3
OPEN_ATTEMPTS = 2  # a resume that failed after taking its parent: let it go, and try once more


class MlflowSink:
    def __init__(
        self,
        tracker: SweepTracker,
        journal: Journal,
        header: SweepHeader,
        say: Callable[[str], None],
        lease_times: LeaseTimes | None = None,
    ) -> None:
        self.tracker = tracker
        self.journal = journal
        self.header = header
        self.say = say
        self.lease_times = lease_times or LeaseTimes()
        self.lease: Lease | None = None  # this sweep's hold on its parent run, from open to close
        self.parent_run_id: str | None = None
        self.cell_runs: dict[str, str] = {}
        self.pending: list[CellResult] = []
        self.down = False
        self.backoff_s = 1.0
        self.retry_at = 0.0

    # -- connection state
    def _failed(self, exc: BaseException) -> None:
        if not self.down:
            self.say(
                f"MLflow is not answering ({redact_text(first_line(exc))}); the sweep goes on, results stay in "
                f"{self.journal.path} and are retried"
            )
        else:
            self.backoff_s = min(self.backoff_s * 2, MAX_BACKOFF_S)
        self.down = True
        self.retry_at = time.monotonic() + self.backoff_s

    def _recovered(self) -> None:
        if self.down:
            self.say("MLflow is answering again; queued results sent")
        self.down, self.backoff_s = False, 1.0

    def _may_try(self) -> bool:
        return not self.down or time.monotonic() >= self.retry_at

    # -- the sweep
    def open(self, resume: bool) -> dict[str, CellResult]:
        """Find (resume) or start the parent run; returns the cells MLflow already has results for.

        Raises `LeaseHeld` when another live sweep writes to the parent it would resume. A failure after the
        parent was taken lets it go (lease released, parent forgotten) before trying again or giving up: a sweep
        that cannot read its parent's cells never measures them all again under it."""
        for attempt in range(1, OPEN_ATTEMPTS + 1):
            try:
                return self._open(resume)
            except LeaseHeld:
                raise
            except Exception as exc:
                half_open = self.parent_run_id
                self._let_parent_go()
                if half_open is None or attempt == OPEN_ATTEMPTS:
                    self._failed(exc)
                    return {}
                self.say(
                    f"resuming parent run {half_open} failed half-way ({redact_text(first_line(exc))}); "
                    "let it go and trying once more"
                )
        return {}

    def _let_parent_go(self) -> None:
        self.release()
        self.parent_run_id, self.cell_runs = None, {}

    def _open(self, resume: bool) -> dict[str, CellResult]:
        taken = self._take_parent(resume)
        if not taken.resumed:
            return {}
        found = taken.run_id
        self.tracker.reopen_sweep(found)
        self._sync_previous_journal(found)
        children = self.tracker.child_runs(found)
        self.cell_runs = {cid: run.info.run_id for cid, run in children.items()}
        done = {cid: result_from_run(run) for cid, run in children.items() if finished(run)}
        kept = {cid: r for cid, r in done.items() if r.status in RESULT_STATUSES}
        return {cid: with_trials(self.tracker.client, r) for cid, r in kept.items()}  # paired verdicts need them

    def _take_parent(self, resume: bool) -> Taken:
        """The parent this sweep writes to, leased to it until `release` (take_parent.py)."""
        taken = take_parent(self.tracker, self.header, resume, self.lease_times, self.say)
        self.lease = taken.lease
        self._set_parent(taken.run_id)
        return taken

    def release(self) -> None:
        """The parent is this sweep's no more: a later run may resume it (best effort; a lease left behind expires)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()

    def _set_parent(self, run_id: str) -> None:
        self.parent_run_id = run_id
        self.journal.write_parent(run_id, self.lease.owner.tag() if self.lease is not None else "")
        self.tracker.log_sweep_files(run_id, {}, {RunTag.RUN_DIR: str(self.journal.path.parent.resolve())})

    def _sync_previous_journal(self, parent_run_id: str) -> None:
        """Results an earlier, interrupted invocation journaled but never sent (MLflow was down)."""
        run = self.tracker.client.get_run(parent_run_id)
        previous = run.data.tags.get(RunTag.RUN_DIR)
        if previous and Path(previous) != self.journal.path.parent.resolve():
            journal = Path(previous) / JOURNAL_NAME
            if journal.exists():
                sent, _ = sync_journal(journal, self.tracker.tracking_uri)
                if sent:
                    self.say(f"sent {sent} results that the previous run journaled in {previous}")

    def started(self, cell_id: str, cell: Cell) -> None:
        """Best effort: a RUNNING child run shows the cell in flight (never while the lease is another's)."""
        if self.parent_run_id is None or cell_id in self.cell_runs or not self._may_try():
            return
        try:
            self._ensure_lease()
            self.cell_runs[cell_id] = self.tracker.open_cell(
                self.parent_run_id,
                cell_id,
                cell,
                self.header.device,
                self.header.name,
                self.header.model_names.get(cell.model, ""),
            )
        except LeaseLost:
            return  # the next send raises it, with the results kept
        except Exception as exc:
            self._failed(exc)

    def _ensure_lease(self) -> None:
        if self.lease is not None:
            self.lease.ensure()

    def finished(self, result: CellResult) -> None:
        """Queue a result and send what is queued. Raises `LeaseLost` when the parent is another sweep's now."""
        self.pending.append(result)
        self.flush()

    def flush(self) -> None:
        if self.lease is not None and self.lease.lost is not None:
            raise self.lease.lost
        if not self.pending or not self._may_try():
            return
        try:
            if self.parent_run_id is None:  # MLflow was down at open: every cell ran here, so a parent of its own
                self._take_parent(resume=False)
            while self.pending:
                self._ensure_lease()
                send_result(self.tracker, self.parent_run_id, self.cell_runs, self.pending[0], self.header)
                self.pending.pop(0)
            self._recovered()
        except LeaseLost:
            raise
        except Exception as exc:
            self._failed(exc)

    def close(
        self,
        status: str,
        counts: dict[str, int],
        cell_tags: dict[str, dict[str, str]] | None = None,
        cell_metrics: dict[str, dict[str, float]] | None = None,
    ) -> int:
        """Last attempts to send everything and end the parent run; returns how many results are unsent.
        The lease ends with it.

        `cell_tags` and `cell_metrics` (cell id -> tags, metrics) are what the report decided across cells (the
        quality verdicts, a workload's token agreement and compile payback): written onto the cells' runs once
        every result is in; `kvsweep report` writes them again."""
        try:
            return self._close(status, counts, cell_tags, cell_metrics)
        finally:
            self.release()

    def _close(
        self,
        status: str,
        counts: dict[str, int],
        cell_tags: dict[str, dict[str, str]] | None,
        cell_metrics: dict[str, dict[str, float]] | None,
    ) -> int:
        for attempt in range(FINAL_ATTEMPTS):
            if attempt:
                time.sleep(min(self.backoff_s, 5.0))
            self.retry_at = 0.0
            self.flush()
            if not self.pending and self.parent_run_id is not None:
                break
        if self.pending or self.parent_run_id is None:
            return len(self.pending)
        try:
            run_dir = self.journal.path.parent
            files = {name: (run_dir / name).read_text() for name in SWEEP_FILES if (run_dir / name).exists()}
            runs = {self.cell_runs[cid]: tags for cid, tags in (cell_tags or {}).items() if cid in self.cell_runs}
            numbers = {self.cell_runs[c]: m for c, m in (cell_metrics or {}).items() if c in self.cell_runs}
            self.tracker.tag_cells(runs, numbers)
            self.tracker.log_sweep_files(self.parent_run_id, files, {})
            self.tracker.log_report(self.parent_run_id, run_dir / REPORT_DIR)
            self.tracker.finish_sweep(self.parent_run_id, counts, status)
        except Exception as exc:
            self._failed(exc)
            return -1
        return 0

    def interrupt(self, running: list[tuple[str, Cell]]) -> None:
        """Ctrl-C/SIGTERM: the running cells' child runs and the parent end as KILLED (best effort; nothing when
        the parent is another sweep's now)."""
        if self.parent_run_id is None:
            return
        try:
            self._ensure_lease()
            for cell_id, _ in running:
                if cell_id in self.cell_runs:
                    self.tracker.kill_cell(self.cell_runs[cell_id])
            self.flush()
            self.tracker.client.set_terminated(self.parent_run_id, "KILLED")
        except LeaseLost:
            pass
        except Exception as exc:
            self._failed(exc)
        self.release()
