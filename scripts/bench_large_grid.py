"""How light is the driver on a big grid? Plans and schedules N trivial cells on a simulated cluster.

Starts a Ray cluster on this machine with `--gpus` logical GPUs (split over `--nodes` nodes), runs a
grid of `--cells` cells through the real sweep path (plan, actors, journal, MLflow on sqlite) with
the stand-in runner that sleeps `--sleep-s`, and prints:
  - makespan against the ideal (cells x sleep / GPUs) and the per-cell overhead beyond the sleep,
  - the driver's peak RSS and its growth per 1,000 cells.
Usage: python scripts/bench_large_grid.py [--cells 2000] [--gpus 16] [--nodes 2] [--sleep-s 0.5]
"""

import argparse
import math
import os
import tempfile
import threading
import time

import psutil


def grid_for(cells: int) -> list[str]:
    """Axes whose product is at least `cells`: context lengths x batch sizes x new tokens."""
    side = math.ceil(cells ** (1 / 3))
    contexts = [64 + i for i in range(side)]
    batches = list(range(1, side + 1))
    news = list(range(1, math.ceil(cells / (side * side)) + 1))
    return [
        f"grid.context_lengths=[{','.join(map(str, contexts))}]",
        f"grid.batch_sizes=[{','.join(map(str, batches))}]",
        f"grid.max_new_tokens=[{','.join(map(str, news))}]",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--sleep-s", type=float, default=0.5)
    args = parser.parse_args()
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    from ray.cluster_utils import Cluster

    from kvsweep.cli import main as kvsweep

    per_node = args.gpus // args.nodes
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": per_node,
            "num_gpus": per_node,
            "include_dashboard": False,
            "object_store_memory": 100 << 20,
        },
    )
    for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=per_node, num_gpus=per_node, object_store_memory=100 << 20)
    cluster.wait_for_nodes()
    process = psutil.Process()
    samples: list[tuple[float, int]] = []  # (time, driver RSS)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            samples.append((time.monotonic(), process.memory_info().rss))

    threading.Thread(target=sample, daemon=True).start()
    start_rss = process.memory_info().rss
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            "grid.models=[tiny-llama]",
            "grid.dtypes=[bfloat16]",
            "grid.caches=[dynamic]",
            *grid_for(args.cells),
            f"ray.address={cluster.address}",
            "testing.runner=kvsweep.stand_ins:sleep_cell",
            f"testing.sleep_s={args.sleep_s}",
            f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db",
            f"hydra.run.dir={tmp}/run",
            "infer_oom=false",
        ]
        started = time.monotonic()
        code = kvsweep(overrides)
        wall = time.monotonic() - started
        with open(f"{tmp}/run/journal.jsonl") as journal:
            cells = sum(1 for line in journal if '"kind": "cell"' in line)
    done.set()
    cluster.shutdown()
    ideal = cells * args.sleep_s / args.gpus
    print(f"\ncells {cells}  gpus {args.gpus}  nodes {args.nodes}  sleep {args.sleep_s}s  exit {code}")
    print(f"makespan {wall:.1f} s  ideal {ideal:.1f} s  efficiency {ideal / wall:.2f}")
    print(f"overhead per cell beyond the sleep: {(wall * args.gpus / cells - args.sleep_s) * 1e3:.0f} ms of GPU time")
    # Growth from a quarter of the way in (after torch/transformers/mlflow imports and planning) to the end.
    quarter = next(rss for t, rss in samples if t >= started + wall / 4)
    peak, end = max(rss for _, rss in samples), samples[-1][1]
    print(
        f"driver RSS: before {start_rss / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB; steady-state growth "
        f"{(end - quarter) / 2**20 / (0.75 * cells) * 1000:.1f} MiB per 1,000 cells"
    )


if __name__ == "__main__":
    main()
