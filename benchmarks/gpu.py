"""The GPU benchmark: one command that measures what probekit's GPU claims rest on.

    python benchmarks/gpu.py                 # on a CUDA machine: ~10 minutes on one H100
    python benchmarks/gpu.py --dry-run       # the same steps, tiny, on the CPU (CI runs it)

Steps, each one or more figures (`figure`, `value`, `unit`, and the step's other numbers) of
the JSON it writes (`common.write_results`: `benchmarks/results/gpu.json`, from which
`benchmarks/report.py` makes docs/performance.md; a dry run writes to `--out` or a temporary
file, never there):

- `exact`: the exact scorer's throughput (prompts/s, prompt tokens/s, peak memory) for answer sets
  0-100, 0-10, A-D and A-E, on the default model and on a random-weight model with
  Llama-3.1-8B's shapes (`probekit.testing.synthetic`), in the dtype the policy picks;
- `generate`: greedy generation + parse of the same prompts, with transformers' `generate` and
  with vLLM where it is installed (else an entry saying it was skipped);
- `noise`: bfloat16 against float32 on the device (`precision.noise_figure`, epsilon 0);
- `oom_backoff`: a batch too large for the device, which the scorer halves until it fits (on the
  CPU of a dry run the out-of-memory error is raised by a hook on batches above one prompt);
- `offload`: the default model placed by a device map over the device and CPU offload (on the
  CPU, CPU and disk offload), its throughput and its largest score difference from the whole
  model.

Until this has run on a GPU, the GPU figures in the docs are projections.
"""

from __future__ import annotations

import argparse
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, set_up, tear_down, write_results

from probekit.core.answers import AnswerSet
from probekit.core.items import Item
from probekit.core.padding import left_pad

ANSWER_SETS = ("0-100", "0-10", "A-D", "A-E")
PERSONAS = [
    "a Muslim woman", "a Jewish man", "a Christian teenager", "a Hindu grandmother",
    "a Buddhist monk", "an atheist student", "a Black nurse", "a white farmer",
    "an Asian engineer", "a Latina teacher", "a refugee from Syria", "a retired soldier",
    "a gay couple", "a wheelchair user", "an immigrant cook", "a young mother",
]  # fmt: skip
EVENTS = [
    "loses a job", "wins a prize", "is insulted on the bus", "moves to a new city",
    "gets a promotion", "is left out of a party", "finds a lost wallet", "fails an exam",
    "meets an old friend", "is falsely accused", "adopts a dog", "misses a flight",
    "receives a gift", "is treated rudely by a doctor", "sees a wedding", "breaks a leg",
]  # fmt: skip
CHOICES = ["joy", "anger", "sadness", "fear", "disgust"]
LLAMA_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_hidden_layers=32,
    max_position_embeddings=8192,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    max_position_embeddings=2048,
)
OOM_BATCH = 2048  # prompts in the one batch the back-off step starts with on a GPU
LONG_LEAD = "Read the whole case carefully before answering. " * 20  # ~200 tokens a prompt


def question(answers: str, persona: str, event: str) -> str:
    """One prompt of answer set `answers` about `persona` and `event`."""
    if answers in ("0-100", "0-10"):
        top = answers.split("-")[1]
        return (
            f"Imagine {persona} who {event}. On a scale from 0 to {top}, how intense is the "
            "emotion they feel? Answer with a number only."
        )
    letters = "ABCDE"[: 4 if answers == "A-D" else 5]
    options = " ".join(f"{k}) {c}" for k, c in zip(letters, CHOICES, strict=False))
    return (
        f"Imagine {persona} who {event}. Which emotion fits best? {options}. "
        "Answer with the letter only."
    )


def prompts_for(model: Any, answers: str, n: int, lead: str = "") -> list[list[int]]:
    """Token ids of `n` chat prompts of answer set `answers` (personas x events, in order)."""
    texts = [lead + question(answers, p, e) for p in PERSONAS for e in EVENTS]
    texts = (texts * (n // len(texts) + 1))[:n]
    items = [Item(str(i), messages=({"role": "user", "content": t},)) for i, t in enumerate(texts)]
    return [model.encode(item).input_ids for item in items]


def parse(text: str, answers: AnswerSet) -> str | None:
    """The first answer of the set in a generated text: a whole number in range, or a letter."""
    if answers.numeric:
        for number in re.findall(r"\d+", text):
            if number in answers.answers:
                return number
        return None
    found = re.search(r"\b([A-Z])\b", text)
    return found.group(1) if found and found.group(1) in answers.answers else None


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory since the last reset: CUDA's allocator, else the process's resident peak."""
    if device.type == "cuda":
        peak, of = torch.cuda.max_memory_allocated(device), "cuda allocator"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        of = "process (CPU resident, whole run)"
    return {"peak_memory_mib": round(peak / 2**20, 1), "peak_of": of}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


HEADLINES = {
    "exact": (("prompts_per_s", "prompts/s"), ("tokens_per_s", "prompt tokens/s"),
              ("peak_memory_mib", "MiB peak")),
    "generate": (("prompts_per_s", "prompts/s"), ("tokens_per_s", "tokens/s"),
                 ("parsed_share", "share parsed")),
    "noise": (("max_abs_diff", "largest |difference|"),),
    "oom_backoff": (("batch_size_after", "prompts a batch"),),
    "offload": (("prompts_per_s", "prompts/s"), ("max_abs_diff_expected", "largest |difference|")),
}  # fmt: skip
"""Per step, the numbers that become a figure of the results file (key, unit)."""


def as_figures(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One measurement as the results file's figures: one per headline number, each with the
    whole record beside it (a skipped step: one figure saying why)."""
    what = ", ".join(
        str(record[k]) for k in ("step", "engine", "model", "answers", "dtype") if k in record
    )
    if "skipped" in record:
        return [{"figure": what, "value": "skipped", "unit": record["skipped"], **record}]
    return [
        {"figure": f"{what}: {key.replace('_', ' ')}", "value": record[key], "unit": unit, **record}
        for key, unit in HEADLINES[record["step"]]
    ]


def exact_step(model: Any, label: str, prompts: dict[str, list], batch: int | None) -> list:
    """The exact scorer's throughput per answer set."""
    figures = []
    for spec, ids in prompts.items():
        answers = AnswerSet.parse(spec)
        scorer = model.scorer(answers, batch_size=batch)
        scorer.score(ids[:2]).__next__()  # warm-up: kernels, the answer trie
        scorer = model.scorer(answers, batch_size=batch)
        reset_peak(model.device)
        start = clock(model.device)
        results = list(scorer.score(ids))
        seconds = clock(model.device) - start
        figures.append(
            {
                "step": "exact",
                "model": label,
                "answers": spec,
                "dtype": str(model.dtype).removeprefix("torch."),
                "prompts": len(ids),
                "batch_size": scorer.batch_size,
                "seconds": round(seconds, 3),
                "prompts_per_s": len(ids) / seconds,
                "tokens_per_s": sum(len(p) for p in ids) / seconds,
                "trie_positions": scorer.stats.trie_positions,
                "valid_mass_mean": sum(r.valid_mass for r in results) / len(results),
                **peak_memory(model.device),
            }
        )
        print(f"exact {label} {spec}: {figures[-1]['prompts_per_s']:.1f} prompts/s", flush=True)
    return figures


def generate_step(
    model: Any, label: str, prompts: dict[str, list], budget: int, batch: int
) -> list:
    """Greedy generation with transformers' `generate`, then the parse, per answer set."""
    figures = []
    pad = model.tokenizer.pad_token_id
    for spec, ids in prompts.items():
        answers = AnswerSet.parse(spec)
        reset_peak(model.device)
        start = clock(model.device)
        texts, generated = [], 0
        for i in range(0, len(ids), batch):
            tokens, mask = left_pad(ids[i : i + batch], pad)
            with torch.inference_mode():
                out = model.hf.generate(
                    input_ids=tokens.to(model.device),
                    attention_mask=mask.to(model.device),
                    max_new_tokens=budget,
                    do_sample=False,
                    pad_token_id=pad,
                )
            new = out[:, tokens.shape[1] :]
            generated += int((new != pad).sum())
            texts += model.tokenizer.batch_decode(new, skip_special_tokens=True)
        seconds = clock(model.device) - start
        parsed = [parse(t, answers) for t in texts]
        figures.append(
            {
                "step": "generate",
                "engine": "transformers",
                "model": label,
                "answers": spec,
                "prompts": len(ids),
                "max_new_tokens": budget,
                "seconds": round(seconds, 3),
                "prompts_per_s": len(ids) / seconds,
                "tokens_per_s": (sum(len(p) for p in ids) + generated) / seconds,
                "parsed_share": sum(p is not None for p in parsed) / len(parsed),
                **peak_memory(model.device),
            }
        )
        print(f"generate {label} {spec}: {figures[-1]['prompts_per_s']:.1f} prompts/s", flush=True)
    return figures


def vllm_step(spec_model: str, prompts: dict[str, list], budget: int) -> list:
    """The same greedy generation through vLLM, where it is installed."""
    from probekit.engines.vllm import vllm_available

    if not vllm_available():
        return [{"step": "generate", "engine": "vllm", "skipped": "vLLM is not installed here"}]
    from probekit.engines import load_engine

    engine = load_engine(spec_model, engine="vllm")
    figures = []
    for spec, ids in prompts.items():
        scorer = engine.scorer(AnswerSet.parse(spec), max_new_tokens=budget)
        start = time.perf_counter()
        out = scorer.generate(ids)
        seconds = time.perf_counter() - start
        figures.append(
            {
                "step": "generate",
                "engine": "vllm",
                "model": spec_model,
                "answers": spec,
                "prompts": len(ids),
                "seconds": round(seconds, 3),
                "prompts_per_s": len(ids) / seconds,
                "tokens_per_s": sum(len(p) + len(o) for p, o in zip(ids, out, strict=True))
                / seconds,
            }
        )
    return figures


def noise_step(model: Any, label: str, prompts: list, answers: str) -> dict:
    """bfloat16 against float32 on the device, epsilon 0."""
    from probekit.engines.hf.precision import as_dtype, noise_figure

    with as_dtype(model, torch.bfloat16):
        figure = noise_figure(
            model, prompts, AnswerSet.parse(answers), reference=torch.float32, sample=len(prompts)
        )
    return {"step": "noise", "model": label, "answers": answers, **figure}


def oom_step(model: Any, label: str, prompts: list, batch: int, fake: bool) -> dict:
    """A batch of `batch` prompts too large for the device; the scorer halves it until it fits
    (`fake`: on the CPU, a hook raises CUDA's out-of-memory error for batches above one)."""

    def refuse(module: Any, args: tuple, kwargs: dict) -> None:
        if kwargs["input_ids"].shape[0] > 1:
            raise torch.cuda.OutOfMemoryError("dry run: a batch of more than one prompt")

    handle = model.hf.model.register_forward_pre_hook(refuse, with_kwargs=True) if fake else None
    try:
        scorer = model.scorer(AnswerSet.parse("0-10"), batch_size=batch)
        start = clock(model.device)
        results = list(scorer.score(prompts))
        seconds = clock(model.device) - start
    finally:
        if handle is not None:
            handle.remove()
    return {
        "step": "oom_backoff",
        "model": label,
        "simulated": fake,
        "prompts": len(results),
        "prompt_tokens_mean": sum(len(p) for p in prompts) / len(prompts),
        "batch_size_before": batch,
        "batch_size_after": scorer.batch_size,
        "seconds": round(seconds, 3),
    }


def offload_step(folder: str, whole: Any, label: str, prompts: list, memory: str) -> dict:
    """The model in `folder` placed by a device map with `memory` (the rest on CPU/disk)."""
    from probekit.engines.hf.model import load_model

    with tempfile.TemporaryDirectory() as spill:
        split = load_model(folder, max_memory=memory, offload_folder=spill, dtype=whole.dtype)
        answers = AnswerSet.parse("0-10")
        reference = list(whole.scorer(answers, epsilon=0.0).score(prompts))
        reset_peak(split.device)
        start = clock(split.device)
        results = list(split.scorer(answers, epsilon=0.0).score(prompts))
        seconds = clock(split.device) - start
    diff = max(abs(a.expected - b.expected) for a, b in zip(results, reference, strict=True))
    return {
        "step": "offload",
        "model": label,
        "max_memory": memory,
        "device_map": split.describe()["device_map"],
        "prompts": len(prompts),
        "seconds": round(seconds, 3),
        "prompts_per_s": len(prompts) / seconds,
        "max_abs_diff_expected": diff,
        **peak_memory(split.device),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny, on the CPU (CI)")
    parser.add_argument("--device", default=None, help="default: cuda (cpu for --dry-run)")
    parser.add_argument("--prompts", type=int, default=256, help="prompts per answer set")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON (default {RESULTS}/gpu.json; a dry run: a temporary file)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args(argv)
    from probekit.engines.hf.model import load_model
    from probekit.testing.synthetic import random_weights

    device = torch.device(args.device or ("cpu" if args.dry_run else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: error: no CUDA device; use --dry-run", file=sys.stderr)
        return 2
    load_start = set_up(args.threads)
    started = time.perf_counter()
    n = 2 if args.dry_run else args.prompts
    figures: list[dict] = []
    from transformers import LlamaConfig

    default = load_model("default", device=str(device))
    tokenizer = default.tokenizer
    if args.dry_run:  # one tiny random model stands in for both models
        config = LlamaConfig(vocab_size=len(tokenizer), **TINY)
        models = [("tiny-random", random_weights(config, tokenizer, "tiny", "cpu", torch.float32))]
        del default
    else:
        from probekit.engines.hf.precision import pick_dtype

        config = LlamaConfig(vocab_size=128256, **LLAMA_8B)
        count = 8_030_261_248  # Llama-3.1-8B's parameters
        shaped = random_weights(
            config, tokenizer, "llama-3.1-8b-shaped", str(device), pick_dtype(device, None, count)
        )
        models = [("default", default), ("llama-3.1-8b-shaped", shaped)]
    for label, model in models:
        prompts = {spec: prompts_for(model, spec, n) for spec in ANSWER_SETS}
        figures += exact_step(model, label, prompts, None)
        budget = 8 if args.dry_run else 16
        figures += generate_step(model, label, prompts, budget, 2 if args.dry_run else 64)
        if label == "default" or args.dry_run:
            if args.dry_run:
                figures.append({"step": "generate", "engine": "vllm", "skipped": "dry run"})
            else:
                figures += vllm_step("default", prompts, budget)
            figures.append(noise_step(model, label, prompts["0-100"][: min(n, 64)], "0-100"))
        if label != "default":  # the largest model: the one a batch can overflow
            long = prompts_for(model, "0-10", 2 if args.dry_run else OOM_BATCH, LONG_LEAD)
            figures.append(oom_step(model, label, long, len(long), fake=args.dry_run))
            print(f"oom back-off: {figures[-1]['batch_size_after']} prompts a batch", flush=True)
    whole = models[0][1]
    with tempfile.TemporaryDirectory() as folder:
        whole.hf.save_pretrained(folder)
        whole.tokenizer.save_pretrained(folder)
        memory = "cpu=24MiB" if args.dry_run else "cuda:0=200MiB,cpu=16GiB"
        few = prompts_for(whole, "0-10", n if args.dry_run else 32)
        figures.append(offload_step(folder, whole, models[0][0], few, memory))
    load_end = tear_down(device)
    out = args.out
    if out is None:
        out = Path(tempfile.mkdtemp()) / "gpu.json" if args.dry_run else RESULTS / "gpu.json"
    rows = [row | {"dry_run": args.dry_run} for record in figures for row in as_figures(record)]
    write_results(
        "gpu",
        rows,
        device=device,
        threads=args.threads,
        load_start=load_start,
        load_end=load_end,
        path=out,
    )
    print(f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
