"""The peer benchmark's worker: what the two virtualenvs run, kvsweep's and optimum-benchmark's.

    <venv>/bin/python scripts/benchmarks/peer_worker.py bare RESULT CACHES WARMUP REPEATS DEVICE
    <venv>/bin/python scripts/benchmarks/peer_worker.py peer-cell BUILT [optimum-benchmark args]

`bare` is the hand-timed `generate` loop (common.timed_generate, the one fidelity.py uses) over the
cells, in one process; `peer-cell` is optimum-benchmark's CLI in-process with its model hooked to
record the cache each `generate` built. Both import torch and Transformers of the virtualenv that runs
them (never kvsweep: optimum-benchmark's has none), so this module imports them only inside those
entry points, and the orchestrator (peer.py) can import the cell settings below.
"""

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import WORK, timed_generate

# How each cache is asked for in both Transformers majors (optimum-benchmark's backend.cache_implementation
# and generate's cache_config; None = the default, dynamic). kvsweep asks through its own registry.
REQUESTS: dict[str, tuple[str | None, dict[str, Any] | None]] = {
    "dynamic": (None, None),
    "static": ("static", None),
    "quantized-quanto-int4": ("quantized", {"backend": "quanto", "nbits": 4}),
}
CONTEXT, NEW_TOKENS, BATCH, SEED = 256, 32, 1, 0
THREADS = len(os.sched_getaffinity(0))
MODEL = WORK / "tiny-llama-model"


def describe_cache(cache: Any) -> dict[str, Any]:
    """kvsweep's tag grammar, in either Transformers major: `Class/Layer[+Layer] [max_cache_len=N] [nbits=N]`."""
    if cache is None:
        return {"tag": "none", "classes": []}
    layers = list(getattr(cache, "layers", None) or [])
    tag = f"{type(cache).__name__}/{'+'.join(sorted({type(layer).__name__ for layer in layers})) or '-'}"
    lengths = {getattr(layer, "max_cache_len", None) for layer in layers} - {None}
    bits = {getattr(layer, "nbits", None) for layer in layers} - {None}
    if lengths:
        tag += f" max_cache_len={max(lengths)}"
    if bits:
        tag += f" nbits={','.join(str(b) for b in sorted(bits))}"
    return {"tag": tag, "classes": [k.__name__ for k in type(cache).__mro__]}


def bare_main(result_file: str, caches: str, warmup: str, repeats: str, dev: str) -> None:
    """The hand-timed `generate` loop over the cells; one cold call and the warmups per cell."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    cuda = dev == "cuda"
    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).to(dev).eval()
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randint(0, model.config.vocab_size, (BATCH, CONTEXT), generator=generator).to(dev)

    def call(cache: str) -> tuple[float, float, dict[str, Any]]:
        implementation, cache_config = REQUESTS[cache]
        options: dict[str, Any] = {"cache_implementation": implementation} if implementation else {}
        if cache_config:
            options["cache_config"] = dict(cache_config)  # generate mutates it in place
        ttft, tpot, out = timed_generate(
            model, inputs, cuda, NEW_TOKENS, f"bare loop {cache}", return_dict_in_generate=True, **options
        )
        built = out.cache if hasattr(out, "cache") else out.past_key_values  # 5.x renamed the field
        return ttft, tpot, describe_cache(built)

    cells = {}
    for cache in caches.split(","):
        for _ in range(1 + int(warmup)):
            call(cache)
        runs = [call(cache) for _ in range(int(repeats))]
        kinds = {json.dumps(r[2], sort_keys=True) for r in runs}
        if len(kinds) != 1:
            raise RuntimeError(f"bare loop {cache}: generate built {len(kinds)} kinds of cache: {kinds}")
        cells[cache] = {"ttft_ms": [r[0] for r in runs], "tpot_ms": [r[1] for r in runs], "built": runs[0][2]}
    Path(result_file).write_text(json.dumps({"transformers": transformers.__version__, "cells": cells}))


def peer_cell_main(built_file: str, *cli_args: str) -> None:
    """optimum-benchmark's CLI in this process, its model hooked to record the cache of every `generate`.

    The hook is public API (a forward pre-hook reading `past_key_values`; about 1.5 us per forward,
    under 0.1% of a token here); the description is taken after each `generate` returns, outside
    its timed prefill and token gaps.
    """
    import transformers

    built: list[dict[str, Any]] = []
    load = transformers.PreTrainedModel.from_pretrained.__func__

    def from_pretrained(cls: type, *args: Any, **kwargs: Any) -> Any:
        model = load(cls, *args, **kwargs)
        seen: dict[str, Any] = {}
        model.register_forward_pre_hook(
            lambda module, args, kwargs: seen.__setitem__("cache", kwargs.get("past_key_values")), with_kwargs=True
        )
        generate = model.generate

        def generate_and_describe(*args: Any, **kwargs: Any) -> Any:
            out = generate(*args, **kwargs)
            built.append(describe_cache(seen.pop("cache", None)))
            return out

        model.generate = generate_and_describe
        return model

    transformers.PreTrainedModel.from_pretrained = classmethod(from_pretrained)
    from optimum_benchmark.cli import main as optimum_benchmark_cli

    sys.argv = ["optimum-benchmark", *cli_args]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # raise the CLI's exception instead of printing it and exiting 1
    try:
        optimum_benchmark_cli()
    except TypeError as exc:
        # Inline, the run mutates the config the CLI then writes last, as benchmark.json (its scenario
        # adds its logits processor, generate adds the model config to cache_config), and that write
        # fails; benchmark_report.json was written just before. Any other failure is raised.
        if not any('"benchmark.json"' in (frame.line or "") for frame in traceback.extract_tb(exc.__traceback__)):
            raise
    finally:
        Path(built_file).write_text(json.dumps(built))


def main() -> int:
    entry = {"bare": bare_main, "peer-cell": peer_cell_main}.get(sys.argv[1] if len(sys.argv) > 1 else "")
    if entry is None:
        raise SystemExit(__doc__)
    entry(*sys.argv[2:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
