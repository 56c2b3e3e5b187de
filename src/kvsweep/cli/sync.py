"""`python -m kvsweep sync [PATH]`: push results that sweeps journaled but could not send to MLflow.

Exit 0 when every journal is in MLflow, 1 when MLflow refused some, 2 for a bad path or missing credentials.
"""

import argparse
import os
from pathlib import Path

from kvsweep.redact import redact_text


def sync_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvsweep sync")
    parser.add_argument(
        "path",
        nargs="?",
        default="outputs",
        type=Path,
        help="a run's output folder, or a folder holding several (default: outputs)",
    )
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI", ""),
        help="default: MLFLOW_TRACKING_URI, else the URI each run used (its credentials from "
        "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN)",
    )
    args = parser.parse_args(argv)

    from kvsweep.tracking.journal import find_journals, sync_journal
    from kvsweep.tracking.store import CredentialsMissing

    if not args.path.exists():
        print(f"kvsweep sync: {args.path} does not exist")
        return 2
    journals = find_journals(args.path)
    if not journals:
        print(f"kvsweep sync: no journal.jsonl under {args.path}")
        return 2
    failed, no_credentials = 0, 0
    for journal in journals:
        try:
            sent, present = sync_journal(journal, args.tracking_uri or None)
        except CredentialsMissing as exc:
            no_credentials += 1
            print(f"kvsweep sync: {journal.parent}: {exc}")
            continue
        except Exception as exc:
            failed += 1
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"{journal.parent}: not synced: {redact_text(reason)}")
            continue
        print(f"{journal.parent}: sent {sent}, already in MLflow {present}")
    return 2 if no_credentials else 1 if failed else 0
