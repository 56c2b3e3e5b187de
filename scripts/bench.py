"""Run kvsweep's benchmark suite and write BENCHMARKS.md.

    python scripts/bench.py                      # every benchmark
    python scripts/bench.py fidelity overhead    # some of them; the others keep their last figures
    python scripts/bench.py --quick              # fewer pairs and repeats (a smoke run, not figures)

Each benchmark measures side by side in one run and reports ratios (the machines are shared and
noisy; absolute times mean little). Results land in scripts/benchmarks/results/<name>.json with the
machine they came from, and BENCHMARKS.md is rebuilt from all of them.
"""

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks.common import ROOT, machine

ORDER = [
    "fidelity",
    "paged_fidelity",
    "repeatability",
    "contention",
    "overhead",
    "peer",
    "scaling",
    "search_cost",
    "compare_noise",
    "task_prompts",
]
RESULTS = Path(__file__).resolve().parent / "benchmarks" / "results"


def run_one(name: str, quick: bool) -> dict:
    module = importlib.import_module(f"benchmarks.{name}")
    print(f"== {name}: {module.TITLE}", flush=True)
    started = time.time()
    section = module.run(quick)
    record = {
        "name": name,
        "title": module.TITLE,
        "command": f"python scripts/bench.py {name}" + (" --quick" if quick else ""),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": round(time.time() - started, 1),
        "quick": quick,
        "figures": section.figures,
        "markdown": section.markdown,
    }
    print(section.markdown, flush=True)
    return record


def write_markdown(records: dict[str, dict]) -> Path:
    lines = [
        "# kvsweep benchmarks",
        "",
        "Every figure is a ratio measured side by side in one run (shared machines are noisy; absolute",
        "times mean little). Rebuild all: `python scripts/bench.py`; one: `python scripts/bench.py NAME`.",
        "Each section names the machine and versions it was measured on.",
        "",
    ]
    for name in ORDER:
        record = records.get(name)
        if record is None:
            continue
        facts = ", ".join(f"{k} {v}" for k, v in record["machine"].items())
        lines += [
            f"## {record['title']}",
            "",
            f"_Measured {record['date']} in {record['seconds']:.0f} s on: {facts}._  ",
            f"_Reproduce: `{record['command']}`_" + (" _(quick run: smoke numbers)_" if record["quick"] else ""),
            "",
            record["markdown"].strip(),
            "",
        ]
    path = ROOT / "BENCHMARKS.md"
    titles = {record["title"] for record in records.values()}
    kept = [text for title, text in _sections(path) if title not in titles]  # written by hand: kept as they are
    path.write_text("\n".join(lines + kept))
    return path


def _sections(path: Path) -> list[tuple[str, str]]:
    """BENCHMARKS.md's `## ` sections as (title, text), to keep those no benchmark writes (measured by hand)."""
    if not path.exists():
        return []
    sections: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            sections.append((line[3:].strip(), [line]))
        elif sections:
            sections[-1][1].append(line)
    return [(title, "\n".join(text).rstrip() + "\n") for title, text in sections]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run, of {', '.join(ORDER)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer pairs and repeats: a smoke run")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(ORDER))
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(ORDER)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in args.names or ORDER:
        record = run_one(name, args.quick)
        (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    records = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    print(f"wrote {write_markdown(records)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
