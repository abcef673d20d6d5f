"""The GPU benchmark: one command that measures what probekit's GPU claims rest on.

    python benchmarks/gpu.py                 # on a CUDA machine (a few minutes on one H100)
    python benchmarks/gpu.py --dry-run       # the same code, at tiny sizes, on the CPU (CI)
    python benchmarks/gpu.py --only mechanism,peers   # those steps again

The dry run is not a separate path: it runs every line a GPU run runs, imports included, with
the sizes of `SIZES["dry"]` on the CPU: 2 prompts an answer set, and two-layer random models
with the default model's tokenizer in place of the default model and of the 8B-shaped one;
`tests/test_devices.py` checks with a line tracer that no line of this file runs only on a
GPU. Steps, each one or more figures (`figure`, `value`, `unit`, and the step's other numbers)
of the JSON it writes (`common.write_results`: `benchmarks/results/gpu.json`, from which
`benchmarks/report.py` makes docs/performance.md; a dry run writes to `--out` or a temporary
file, never there):

- on the default model, first and alone on the device: `exact` (prompts/s, prompt tokens/s,
  token-forwards a prompt, TFLOP/s and share of the device's peak, peak memory) for answer sets
  0-100, 0-10, A-D and A-E in float32 at the plan's batch; `generate` (transformers greedy
  generation + parse, and vLLM where it is installed); `precision`: each tier's error against
  float32 on its 0-100 prompts (bfloat16 with the float32 head, TF32 matmuls; TF32 is emulated
  on a CPU) and the tier the default `--tolerance` picks from them; `offload`: the model placed
  by a device map with CPU (and disk) offload, its largest score difference from the whole
  model; `mechanism`: through each hook library installed, `probekit.patch` (a resid_pre/
  attn_out/mlp_out sweep, then every head at `attn.hook_z`), `probekit.capture` and
  `probekit.steer` on the device and the same calls on a float32 copy on the CPU, the largest
  difference of their results and both times;
- then, the default model freed, on random weights of Llama-3.1-8B's shapes (so each model's
  peak memory is its own): `shape`, its LM head's rows (Llama-3's 128,256: the default
  tokenizer's 49,152 padded with rows that extend no answer); `exact` for the four answer sets
  in each precision tier (`TIERS`: float32, TF32 matmuls, bfloat16 with the float32 head) at
  epsilon 0, so every prompt reads the whole answer trie (random weights would prune it to ~14
  positions on 0-100; the real default model reads ~140 at the default epsilon, the whole trie
  has 203); `generate` beside it in the fastest tier; `batch_sweep`: the fastest tier's 0-100
  throughput at fixed batches and at the batch the plan picks, and the plan's share of the best
  (target: at least 90 %); `oom_backoff`: a batch too large for the device, halved until it fits
  (on the CPU a hook raises the out-of-memory error for batches above one prompt); `peers`:
  probekit's patching sweep beside TransformerLens's `generic_activation_patch`, a plain nnsight
  loop and nnsight with the KV cache (benchmarks/patching.py's comparison), in TF32; without
  transformer_lens, one line says so and the nnsight half runs;
- last, `target`: the speed targets of the trie pass's rewrite, from the run's own figures (on
  a CPU: "not yet measured (no GPU lent)").

The results file is written after every step, so a run cut short keeps what it measured: a step
that raises is recorded as failed, with its error, and the run goes on; Ctrl-C (or
`timeout -s INT`) ends the steps and the targets are read from those done.

TFLOP/s counts the multiply-adds of the weights (2 x body weights a token-forward, 2 x LM-head
weights a head row), not attention's (a few per cent at these prompt lengths); the device's peak
is NVIDIA's dense figure for the tier (`PEAK_TFLOPS`), unknown on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from common import (
    RESULTS,
    device_name,
    measured,
    peak_memory,
    release,
    reset_peak,
    set_up,
    step_names,
    synchronize,
    tear_down,
    timed,
    until_interrupted,
    write_results,
)
from patching import ANSWERS as PATCH_ANSWERS
from patching import (
    CLEAN,
    CORRUPT,
    METHODS,
    PEER_SITES,
    TARGET,
    TARGET_PEERS,
    Peer,
    compare_peers,
    report_peers,
)

import probekit
from probekit.core.answers import AnswerSet
from probekit.core.items import Item
from probekit.core.padding import left_pad
from probekit.engines.base import TIER_LABELS
from probekit.engines.hf.head import parameter_split
from probekit.engines.hf.model import load_model
from probekit.engines.hf.precision import (
    TIERS,
    apply_tier,
    arithmetic,
    body_of,
    choose_precision,
)
from probekit.engines.hook_libraries import HOOK_PACKAGES, installed, missing_line
from probekit.engines.options import DEFAULT_TOLERANCE, dtype_name
from probekit.engines.trie import extension_masks
from probekit.mechanism.sites import d_model
from probekit.testing.synthetic import LLAMA_8B, llama_config, random_weights

ANSWER_SETS = ("0-100", "0-10", "A-D", "A-E")
PLAIN = next(tier for tier in TIERS if not tier.endswith("+head"))
"""The fastest tier whose LM head is a plain module: a `+head` tier's 16-bit head takes a float32
hidden state through `narrow_linear`, which transformers' `generate` does not call."""
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
SHAPED = {**LLAMA_8B, "context": 8192}
"""The large model: Llama-3.1-8B's shape (`probekit.testing.synthetic.LLAMA_8B`, its 128,256-row
vocabulary padded beyond the default tokenizer's), prompts up to 8,192 tokens."""
TINY = {"layers": 2, "width": 64, "mlp_width": 128, "heads": 4, "kv_heads": 2, "context": 2048}
"""The dry run's two-layer stand-in for both models."""
LONG_LEAD = "Read the whole case carefully before answering. " * 20  # ~200 tokens a prompt
PEAK_TFLOPS = {
    "H100 PCIe": {"bfloat16": 756.0, "tf32": 378.0, "float32": 51.2},
    "H100": {"bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},  # SXM (HBM3)
    "H200": {"bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},
    "A100": {"bfloat16": 312.0, "tf32": 156.0, "float32": 19.5},
}
"""NVIDIA's dense tensor-core peak (float32: without tensor cores) per tier, TFLOP/s, by a part of
the device's name (the first that matches; H100 PCIe before H100)."""


@dataclass(frozen=True)
class Sizes:
    """How big each step is: the GPU run's, or the dry run's tiny ones."""

    prompts: int  # per answer set (a GPU run: --prompts)
    default: dict[str, int] | None  # the config of a random stand-in for the default model
    default_label: str
    shaped: dict[str, int]  # the large model's config
    shaped_label: str
    generate_budget: int
    generate_batch: int
    sweep: tuple[int, ...]  # the fixed batches of the sweep
    sweep_prompts: int
    oom_batch: int  # prompts in the one batch the back-off starts with
    offload_memory: str
    offload_prompts: int
    precision_sample: int
    simulate_oom: bool
    head_rows: int  # the large model's LM-head rows: the default tokenizer's, padded
    mechanism_layers: int  # layers (first to last, evenly spread) of the mechanism's calls
    peer_layers: int  # layers of the large model's patching beside its peers


SIZES = {
    "gpu": Sizes(
        256, None, "default", SHAPED, "llama-3.1-8b-shaped", 16, 512,
        (64, 128, 256, 512, 1024), 1024, 2048, "cuda:0=200MiB,cpu=16GiB", 32, 64, False,
        LLAMA_8B["vocab_rows"], 3, 4,
    ),
    "dry": Sizes(
        2, TINY, "tiny-random-default", TINY, "tiny-random", 4, 2, (1, 2), 4,
        2, "cpu=24MiB", 2, 2, True, 49_280, 2, 1,
    ),
}  # fmt: skip


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
        found = [n for n in re.findall(r"\d+", text) if n in answers.answers]
        return found[0] if found else None
    letter = re.search(r"\b([A-Z])\b", text)
    return letter.group(1) if letter and letter.group(1) in answers.answers else None


def clock(device: torch.device) -> float:
    synchronize(device)
    return time.perf_counter()


def tier_of(model: Any) -> str:
    """The precision tier `model` is in now: its body's arithmetic, `+head` where the LM head
    computes in the same one."""
    body = "tf32" if model.meta.get("matmul") == "tf32" else dtype_name(model.dtype)
    return f"{body}+head" if body != "float32" and model.meta.get("head") == body else body


def peak_tflops(device: torch.device, tier: str) -> float | None:
    """The device's dense peak for `tier`'s body (`PEAK_TFLOPS`; float16 runs at bfloat16's
    rate), None where unknown (a CPU)."""
    name = device_name(device)
    rate = {"float16": "bfloat16"}.get(body_of(tier), body_of(tier))
    return next((peaks[rate] for part, peaks in PEAK_TFLOPS.items() if part in name), None)


HEADLINES = {
    "exact": (("prompts_per_s", "prompts/s"), ("tokens_per_s", "prompt tokens/s"),
              ("tflops", "TFLOP/s"), ("peak_memory_mib", "MiB peak")),
    "generate": (("prompts_per_s", "prompts/s"), ("tokens_per_s", "tokens/s"),
                 ("parsed_share", "share parsed")),
    "precision": (("max_prob_diff", "largest |Δp| against float32"),
                  ("max_abs_diff", "largest |Δ| of the expected value")),
    "batch_sweep": (("prompts_per_s", "prompts/s"),),
    "plan_share": (("share_of_best", "of the best fixed batch's prompts/s"),),
    "oom_backoff": (("batch_size_after", "prompts a batch"),),
    "offload": (("prompts_per_s", "prompts/s"), ("max_abs_diff_expected", "largest |difference|")),
    "shape": (("head_rows", "LM-head rows"), ("padded_rows", "rows padded past the tokenizer's"),
              ("padded_rows_extending", "padded rows that extend an answer")),
    "mechanism": (("max_abs_diff", "largest |difference| from the same call on the CPU"),
                  ("seconds", "s on the device"), ("cpu_seconds", "s on the CPU")),
    "peers": (("seconds", "s (CPU time on a CPU, wall on a GPU)"),
              ("ratio", "probekit's time over this peer's")),
    "target": (("value", None),),
}  # fmt: skip
"""Per step, the numbers that become a figure of the results file (key, unit; None: the record's
own `unit`)."""


def as_figures(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One measurement as the results file's figures: one per headline number, each with the
    whole record beside it (a skipped step: one figure saying why)."""
    keys = ("step", "engine", "model", "call", "site", "hooks", "answers", "tier", "batch")
    what = ", ".join(str(record[k]) for k in keys if record.get(k) is not None)
    if "skipped" in record:
        return [{"figure": what, "value": "skipped", "unit": record["skipped"], **record}]
    if record["step"] == "target":
        what = f"target: {record['target']}"
    return [
        {
            "figure": f"{what}: {key.replace('_', ' ')}",
            "value": record[key],
            "unit": unit or record["unit"],
            **record,
        }
        for key, unit in HEADLINES[record["step"]]
        if key in record
    ]


def exact_step(
    model: Any,
    label: str,
    prompts: dict[str, list],
    batch: int | None = None,
    epsilon: float = 1e-4,
    step: str = "exact",
) -> list[dict[str, Any]]:
    """The exact scorer's throughput per answer set, at `batch` (None: the plan's), with the
    token-forwards a prompt, the TFLOP/s they make and their share of the device's peak."""
    body, head = parameter_split(model)
    rows = model.hf.get_output_embeddings().weight.shape[0]
    tier = tier_of(model)
    peak = peak_tflops(model.device, tier)
    figures = []
    for spec, ids in prompts.items():
        answers = AnswerSet.parse(spec)
        next(model.scorer(answers, batch_size=batch, epsilon=epsilon).score(ids[:2]))  # warm-up
        scorer = model.scorer(answers, batch_size=batch, epsilon=epsilon)
        reset_peak(model.device)
        start = clock(model.device)
        results = list(scorer.score(ids))
        seconds = clock(model.device) - start
        stats = scorer.stats
        forwards = stats.prompt_tokens + stats.trie_positions
        flops = 2 * body * forwards + 2 * head * (stats.prompts + stats.trie_positions)
        tflops = flops / seconds / 1e12
        figures.append(
            {
                "step": step,
                "model": label,
                "answers": spec,
                "tier": tier,
                "dtype": TIER_LABELS[tier],
                "epsilon": epsilon,
                "prompts": len(ids),
                "batch_size": scorer.batch_size,
                "batch": None if step == "exact" else batch or f"plan's ({scorer.batch_size})",
                "seconds": round(seconds, 3),
                "prompts_per_s": len(ids) / seconds,
                "tokens_per_s": sum(len(p) for p in ids) / seconds,
                "trie_positions": stats.trie_positions,
                "token_forwards_per_prompt": forwards / len(ids),
                "head_rows": rows,
                "tflops": tflops,
                "peak_tflops": peak,
                "share_of_peak": tflops / peak if peak else None,
                "valid_mass_mean": sum(r.valid_mass for r in results) / len(results),
                **peak_memory(model.device),
            }
        )
        rate = figures[-1]["prompts_per_s"]
        print(f"{step} {label} {spec} {tier} batch {scorer.batch_size}: {rate:.1f} prompts/s")
    return figures


def generate_step(
    model: Any, label: str, prompts: dict[str, list], budget: int, batch: int
) -> list[dict[str, Any]]:
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
                "tier": tier_of(model),
                "prompts": len(ids),
                "gen_batch": batch,
                "max_new_tokens": budget,
                "seconds": round(seconds, 3),
                "prompts_per_s": len(ids) / seconds,
                "tokens_per_s": (sum(len(p) for p in ids) + generated) / seconds,
                "parsed_share": sum(p is not None for p in parsed) / len(parsed),
                **peak_memory(model.device),
            }
        )
        print(f"generate {label} {spec}: {figures[-1]['prompts_per_s']:.1f} prompts/s")
    return figures


def vllm_step(prompts: dict[str, list], budget: int) -> list[dict[str, Any]]:
    """The same greedy generation of the default model through vLLM, where it is installed."""
    from probekit.engines.vllm import vllm_available

    if not vllm_available():
        return [{"step": "generate", "engine": "vllm", "skipped": "vLLM is not installed here"}]
    return vllm_generate(prompts, budget)  # not-in-dry-run: needs vLLM (not a GPU)


def vllm_generate(prompts: dict[str, list], budget: int) -> list:  # not-in-dry-run: needs vLLM
    """`vllm_step` where vLLM is installed."""
    from probekit.engines import load_engine

    engine = load_engine("default", engine="vllm")
    figures = []
    for spec, ids in prompts.items():
        scorer = engine.scorer(AnswerSet.parse(spec), max_new_tokens=budget)
        start = time.perf_counter()
        out = scorer.generate(ids)
        seconds = time.perf_counter() - start
        tokens = sum(len(p) + len(o) for p, o in zip(ids, out, strict=True))
        figures.append(
            {
                "step": "generate",
                "engine": "vllm",
                "model": "default",
                "answers": spec,
                "prompts": len(ids),
                "seconds": round(seconds, 3),
                "prompts_per_s": len(ids) / seconds,
                "tokens_per_s": tokens / seconds,
            }
        )
    return figures


def precision_step(model: Any, label: str, prompts: list, answers: str) -> list[dict[str, Any]]:
    """Each tier's largest change of an answer probability (and of the expected value) against
    float32 on `prompts`, over every tier a current GPU offers (TF32 emulated where the device has
    none; `choose_precision` at tolerance 0 measures them all and puts the model back in float32),
    and the tier the default tolerance picks from them."""
    record = choose_precision(model, prompts, AnswerSet.parse(answers), 0.0, TIERS)
    accepted = [t["tier"] for t in record["tried"] if t["max_prob_diff"] <= DEFAULT_TOLERANCE]
    return [
        {
            "step": "precision",
            "model": label,
            "answers": answers,
            "tolerance": DEFAULT_TOLERANCE,
            "picked": (accepted or ["float32"])[0],
            "sample": record["sample"],
            **tried,
        }
        for tried in record["tried"]
    ]


def offload_step(folder: str, whole: Any, label: str, prompts: list, memory: str) -> dict[str, Any]:
    """The model in `folder` placed by a device map with `memory` (the rest on CPU/disk)."""
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


def sweep_step(model: Any, label: str, prompts: list, batches: tuple[int, ...]) -> list:
    """0-100 throughput at each fixed batch and at the plan's, and the plan's share of the best
    fixed batch's (target: at least 0.9)."""
    figures = []
    for batch in (*batches, None):
        figures += exact_step(model, label, {"0-100": prompts}, batch, 0.0, "batch_sweep")
    best = max(figures[:-1], key=lambda f: f["prompts_per_s"])
    share = figures[-1]["prompts_per_s"] / best["prompts_per_s"]
    figures.append(
        {
            "step": "plan_share",
            "model": label,
            "tier": figures[-1]["tier"],
            "batch": f"plan's ({figures[-1]['batch_size']}) against {best['batch_size']}",
            "share_of_best": share,
            "target": 0.9,
            "verdict": "PASS" if share >= 0.9 else "FAIL",
        }
    )
    print(f"the plan's batch reaches {share:.0%} of the best fixed batch's throughput")
    return figures


def oom_step(model: Any, label: str, prompts: list, batch: int, simulate: bool) -> dict:
    """A batch of `batch` prompts too large for the device; the scorer halves it until it fits
    (`simulate`: on the CPU, a hook raises CUDA's out-of-memory error for batches above one)."""

    def refuse(module: Any, args: tuple, kwargs: dict) -> None:
        if simulate and kwargs["input_ids"].shape[0] > 1:
            raise torch.cuda.OutOfMemoryError("dry run: a batch of more than one prompt")

    handle = model.hf.model.register_forward_pre_hook(refuse, with_kwargs=True)
    try:
        scorer = model.scorer(AnswerSet.parse("0-10"), batch_size=batch)
        start = clock(model.device)
        results = list(scorer.score(prompts))
        seconds = clock(model.device) - start
    finally:
        handle.remove()
    print(f"oom back-off: {scorer.batch_size} prompts a batch")
    return {
        "step": "oom_backoff",
        "model": label,
        "simulated": simulate,
        "prompts": len(results),
        "prompt_tokens_mean": sum(len(p) for p in prompts) / len(prompts),
        "batch_size_before": batch,
        "batch_size_after": scorer.batch_size,
        "seconds": round(seconds, 3),
    }


def spread(n_layers: int, count: int) -> list[int]:
    """`count` layers from the first to the last, evenly spread (every layer when fewer)."""
    count = min(count, n_layers)
    return sorted({round(i * (n_layers - 1) / max(count - 1, 1)) for i in range(count)})


def hook_libraries() -> list[str]:
    """The hook libraries whose packages are installed here (TransformerLens first)."""
    return [name for name in HOOK_PACKAGES if installed(name)]


def mechanism_calls(model: Any, layers: list[int], hooks: str) -> dict[str, Callable[[], Any]]:
    """`probekit.patch` (a resid_pre/attn_out/mlp_out sweep, then every head at `attn.hook_z`),
    `probekit.capture` and `probekit.steer` of the README's persona pair on `model` through
    `hooks`, each a call that gives its results as one float64 tensor (patch: the clean, corrupt
    and patched expected values of 0-10; capture: every activation; steer: every answer
    probability of the steered and the random-control rows)."""
    pair = probekit.make_pair(model, CLEAN, CORRUPT, span="Muslim")
    ask = {"answers": PATCH_ANSWERS, "hooks": hooks}
    prompts = [CLEAN, CORRUPT]

    def table(frame: Any, columns: list[str]) -> torch.Tensor:
        return torch.tensor(frame[columns].to_numpy(), dtype=torch.float64)

    def patch(sites: list[str]) -> Callable[[], torch.Tensor]:
        columns = ["expected_clean", "expected_corrupt", "expected_patched"]
        return lambda: table(
            probekit.patch(
                model, pair, spans=["identity"], sites=sites, layers=layers, progress=False, **ask
            ),
            columns,
        )

    def capture() -> torch.Tensor:
        acts = probekit.capture(
            model, prompts, sites=PEER_SITES, layers=layers, hooks=hooks, quiet=True
        )
        return torch.cat([acts[hook].flatten() for hook in sorted(acts.tensors)]).double()

    def steer() -> torch.Tensor:
        vector = torch.randn(d_model(model), generator=torch.Generator().manual_seed(0))
        rows = probekit.steer(
            model,
            prompts,
            vector,
            layers=layers[-1:],
            alphas=[-4.0, 0.0, 4.0],
            positions="from_span" if hooks == "transformer_lens" else "span",  # nnsight: prompt
            quiet=True,
            **ask,
        )
        return table(rows, [c for c in rows if c.startswith("p::")])

    return {
        "patch resid_pre, attn_out, mlp_out": patch(PEER_SITES[:3]),
        "patch every head (attn.hook_z)": patch(PEER_SITES[3:]),
        "capture": capture,
        "steer": steer,
    }


def mechanism_step(
    model: Any, cpu: Any, label: str, layers: int, hooks: str
) -> list[dict[str, Any]]:
    """The mechanism on the device against the CPU: each of `mechanism_calls` through `hooks`,
    on `model` and on `cpu` (a float32 copy of it on the CPU), with the largest difference of
    their results and each call's seconds (after one warm-up call on each model, which pays the
    one-off costs: the bridge's build, the first launches)."""
    chosen = spread(model.n_layers, layers)
    on_device, on_cpu = mechanism_calls(model, chosen, hooks), mechanism_calls(cpu, chosen, hooks)
    next(iter(on_device.values()))(), next(iter(on_cpu.values()))()  # warm-ups
    figures = []
    for call, run in on_device.items():
        got, seconds, _ = timed(model.device, run)
        expected, cpu_seconds, _ = timed(cpu.device, on_cpu[call])
        scale = float(expected.abs().max())
        figures.append(
            {
                "step": "mechanism",
                "model": label,
                "call": call,
                "hooks": hooks,
                "tier": tier_of(model),
                "layers": chosen,
                "values": got.numel(),
                "max_abs_diff": float((got - expected).abs().max()),
                "max_abs_value": scale,
                "seconds": round(seconds, 3),
                "cpu_seconds": round(cpu_seconds, 3),
            }
        )
        print(
            f"mechanism {label} {call} ({hooks}): {got.numel()} values, largest |difference| "
            f"from the CPU {figures[-1]['max_abs_diff']:.2g} (of {scale:.3g}); {seconds:.2f} s "
            f"on {model.device.type}, {cpu_seconds:.2f} s on the CPU"
        )
    return figures


def without_lens() -> dict[str, Any]:  # not-in-dry-run: transformer_lens is installed here
    """The line (printed, and the figure) saying that TransformerLens's half is skipped."""
    line = missing_line("transformer_lens")
    print(f"peers: {line}: TransformerLens's half is skipped, the nnsight half runs")
    return {"step": "peers", "engine": "transformer_lens", "skipped": line}


def peers_step(model: Any, label: str, layers: int) -> list[dict[str, Any]]:
    """probekit's patching sweep beside TransformerLens's `generic_activation_patch` and a plain
    nnsight loop (and nnsight with the KV cache), on `layers` spread layers of `model` at each of
    `PEER_SITES` (benchmarks/patching.py's comparison, imported: `compare_peers`,
    `report_peers`): each method's seconds, probekit's over each peer's (the target of
    benchmarks/patching.py, <= 0.5) and the largest difference of their readouts. Without
    transformer_lens one line says so and the nnsight half runs (probekit through nnsight).

    Every method runs in the model's arithmetic (`precision.arithmetic` around the whole
    comparison): float32 weights with TF32 matmuls, the tier the default tolerance picked on the
    default model on both GPUs measured. Not bfloat16: probekit's bfloat16 tier keeps the LM
    head in float32 and widens the body's output itself, which TransformerLens's own forward
    (the bridge's unembedding) does not."""
    hooks = hook_libraries()[0]
    methods = [m for m in METHODS if m != "transformer_lens" or hooks == m]
    figures = [] if hooks == "transformer_lens" else [without_lens()]
    chosen = spread(model.n_layers, layers)
    peer = Peer.of(model)
    with arithmetic(model):
        results = compare_peers(peer, PEER_SITES, chosen, chosen, methods=methods, hooks=hooks)
    _, details = report_peers(results, peer, chosen, chosen)
    for site_name, record in details["sites"].items():
        for method in methods:
            entry = {
                "step": "peers",
                "engine": method,
                "model": label,
                "site": site_name,
                "hooks": hooks if method == "probekit" else None,
                "tier": tier_of(model),
                "layers": chosen,
                "components": record["components"],
                "seconds": record["seconds"][method],
                "wall_seconds": record["wall_seconds"][method],
            }
            versus = record.get(method, {})
            entry |= {key: versus[key] for key in ("ratio", "max_abs_diff") if key in versus}
            if method in TARGET_PEERS:
                entry["verdict"] = (
                    f"{'PASS' if versus['ratio'] <= TARGET else 'FAIL'} (<= {TARGET})"
                )
            figures.append(entry)
    return figures


def shape_step(model: Any, label: str) -> dict[str, Any]:
    """The large model's LM head against its tokenizer: Llama-3's 128,256 rows on the default
    tokenizer's 49,152, the rest padded with rows that extend no answer (`extension_masks` reads
    a padded row as the empty text, so the answer trie never enters one; their logits still
    share the softmax, as a real vocabulary's do)."""
    rows, words = model.hf.get_output_embeddings().weight.shape[0], len(model.tokenizer)
    extending = extension_masks(model.tokenizer, rows)[:, words:].any(dim=0).sum()
    record = {
        "step": "shape",
        "model": label,
        "head_rows": rows,
        "tokenizer_rows": words,
        "padded_rows": rows - words,
        "padded_rows_extending": int(extending),
    }
    print(f"{label}: an LM head of {rows:,} rows, {rows - words:,} of them padded past the "
          f"tokenizer's {words:,} ({int(extending)} of them extend an answer)")  # fmt: skip
    return record


BASELINE = RESULTS / "gpu-h200-16e97c1.json"
"""The H200 run at commit 16e97c1, before the trie pass was rewritten: the baseline of the
targets that compare with it, on an H200."""


def find(records: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    """The first of `records` (a results file's figures or this run's) whose fields are `match`'s
    (an empty record where none is)."""
    return next((r for r in records if all(r.get(k) == v for k, v in match.items())), {})


def targets_step(
    figures: list[dict[str, Any]], device: torch.device, size: Sizes
) -> list[dict[str, Any]]:
    """The speed targets of the trie pass's rewrite, from this run's figures (and, on an H200,
    the baseline run's), each on 0-100: on the large model, bfloat16 over the whole trie at
    >= 50 % of the bfloat16 peak and >= 1.5x generation's prompts/s; the tier the default
    tolerance picks (on the default model) at >= 2x TF32's prompts/s at 16e97c1; the default
    model no slower than at 16e97c1. Benchmarks, never tests: on a CPU (a dry run) each is
    "not yet measured (no GPU lent)"; on a GPU whose peak or baseline run is not known,
    "unknown here"."""
    old = json.loads(BASELINE.read_text())
    old = old["figures"] if old["device"] == device_name(device) else []
    big = {"step": "exact", "model": size.shaped_label, "answers": "0-100"}
    small = {"step": "exact", "model": size.default_label, "answers": "0-100", "tier": "float32"}
    bf16 = find(figures, **big, tier="bfloat16")
    generated = find(figures, **{**big, "step": "generate"}, engine="transformers")
    picked = find(figures, step="precision").get("picked")

    def over(new: dict[str, Any], base: dict[str, Any]) -> float | None:
        return new["prompts_per_s"] / base["prompts_per_s"] if new and base else None

    measured = [
        ("bfloat16 over the whole trie: share of the bfloat16 peak", bf16.get("share_of_peak"), 0.5,
         "of the peak"),
        ("bfloat16 over transformers' generation of the same prompts", over(bf16, generated), 1.5,
         "x generation"),
        (f"the tier the default tolerance picks ({picked}) over TF32 at 16e97c1",
         over(find(figures, **big, tier=picked), find(old, **big, tier="tf32")), 2.0,
         "x 16e97c1's TF32"),
        ("the default model over 16e97c1", over(find(figures, **small), find(old, **small)), 1.0,
         "x 16e97c1's"),
    ]  # fmt: skip
    records = []
    for target, value, limit, unit in measured:
        verdict = "unknown here" if value is None else "PASS" if value >= limit else "FAIL"
        if device.type != "cuda":
            value, verdict = None, "not yet measured (no GPU lent)"
        records.append(
            {"step": "target", "target": f"0-100, {target}", "value": value, "unit": unit,
             "limit": limit, "verdict": f"{verdict} (>= {limit:g})"}
        )  # fmt: skip
        print(f"target: 0-100, {target} >= {limit:g}: {verdict}")
    return records


def default_model(device: torch.device, size: Sizes) -> Any:
    """The default model in float32; in a dry run its tokenizer and chat template (no weights
    read), with random weights of `size.default` in its place."""
    model = load_model("default", device=str(device), dtype="float32", weights=not size.default)
    if size.default:
        config = llama_config(len(model.tokenizer), **size.default)
        model = random_weights(config, model.tokenizer, "default", str(device), torch.float32)
    return model


STEPS = ("exact", "generate", "precision", "offload", "mechanism", "shape", "oom_backoff", "peers",
         "batch_sweep")  # fmt: skip
"""The steps a run measures (besides `target`, read from them), in the order they run."""


class Results:
    """The run's records, written to the results file after every step, so that a run cut short
    keeps what it measured: a step that raises is recorded as failed (its error in the figure)
    and the run goes on; Ctrl-C (or `timeout -s INT`) ends the steps, and the targets are read
    from those measured. A file written before the last step says where it stopped
    (`details.stopped_after`)."""

    def __init__(
        self,
        path: Path,
        device: torch.device,
        threads: int | None,
        dry_run: bool,
        steps: set,
        load_start: tuple[float, float, float],
    ):
        self.path, self.device, self.threads, self.dry_run = path, device, threads, dry_run
        self.steps = steps | {"target"}
        self.records: list[dict[str, Any]] = []
        self.load_start = load_start

    def record(self, name: str, measure: Callable[..., Any], *args: Any) -> None:
        """Run the step `name` (`measure(*args)`, a record or a list of them; `common.measured`),
        keep its records and write the file; a step not asked for (`--only`) is passed over."""
        if name in self.steps:
            self.records += measured(name, measure, *args)
            self.write(os.getloadavg(), {"stopped_after": name})

    def write(self, load_end: tuple[float, float, float], details: dict | None = None) -> None:
        """The records so far as the results file (`details`: None once the run is over)."""
        rows = [row | {"dry_run": self.dry_run} for rec in self.records for row in as_figures(rec)]
        write_results(
            "gpu",
            rows,
            device=self.device,
            threads=self.threads,
            load_start=self.load_start,
            load_end=load_end,
            path=self.path,
            details=details,
        )


def in_tier(model: Any, tier: str, measure: Callable[..., Any], *args: Any) -> Any:
    """`measure(*args)` with `model` in the precision tier `tier`, put back after."""
    undo = apply_tier(model, tier)
    try:
        return measure(*args)
    finally:
        undo()


def default_model_steps(device: torch.device, size: Sizes, n: int, results: Results) -> Any:
    """The default model's steps, into `results`; its tokenizer."""
    model, label = default_model(device, size), size.default_label
    prompts = {spec: prompts_for(model, spec, n) for spec in ANSWER_SETS}
    results.record("exact", exact_step, model, label, prompts)
    results.record("generate", generate_step, model, label, prompts, size.generate_budget, 64)
    results.record("generate", vllm_step, prompts, size.generate_budget)
    sample = prompts["0-100"][: size.precision_sample]
    results.record("precision", precision_step, model, label, sample, "0-100")
    with tempfile.TemporaryDirectory() as folder:
        model.hf.save_pretrained(folder)
        model.tokenizer.save_pretrained(folder)
        few = prompts_for(model, "0-10", size.offload_prompts)
        results.record("offload", offload_step, folder, model, label, few, size.offload_memory)
        cpu = load_model(folder, device="cpu", dtype="float32")
        for hooks in hook_libraries():
            mechanism = (model, cpu, label, size.mechanism_layers, hooks)
            results.record("mechanism", mechanism_step, *mechanism)
    return model.tokenizer


def shaped_model_steps(
    device: torch.device, size: Sizes, n: int, tokenizer: Any, results: Results
) -> None:
    """The large random-weight model's steps, into `results`: its head's rows, then the exact
    scorer in each precision tier (`TIERS`, float32 first), generation in the fastest tier whose
    LM head transformers runs as it is (`PLAIN`), the out-of-memory back-off in the fastest tier
    (`TIERS[0]`), patching beside its peers in TF32, and the batch sweep in
    the fastest tier."""
    config = llama_config(len(tokenizer), **{**size.shaped, "vocab_rows": size.head_rows})
    label = size.shaped_label
    model = random_weights(config, tokenizer, label, str(device), torch.float32)
    prompts = {spec: prompts_for(model, spec, n) for spec in ANSWER_SETS}
    results.record("shape", shape_step, model, label)
    for tier in reversed(TIERS):
        results.record("exact", in_tier, model, tier, exact_step, model, label, prompts, None, 0.0)
    gen = (model, label, prompts, size.generate_budget, size.generate_batch)
    results.record("generate", in_tier, model, PLAIN, generate_step, *gen)
    fastest = (model, TIERS[0])
    long = prompts_for(model, "0-10", size.oom_batch, LONG_LEAD)
    oom = (model, label, long, size.oom_batch, size.simulate_oom)
    results.record("oom_backoff", in_tier, *fastest, oom_step, *oom)
    results.record("peers", in_tier, model, "tf32", peers_step, model, label, size.peer_layers)
    sweep = prompts_for(model, "0-100", size.sweep_prompts)
    results.record("batch_sweep", in_tier, *fastest, sweep_step, model, label, sweep, size.sweep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny, on the CPU (CI)")
    parser.add_argument("--device", default=None, help="default: cuda (cpu for --dry-run)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per answer set (256)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON (default {RESULTS}/gpu.json; a dry run: a temporary file)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--only",
        type=step_names(STEPS),
        default=set(STEPS),
        help="comma-separated steps to run, e.g. mechanism,peers to measure those again "
        f"(default: every step: {', '.join(STEPS)}; the targets are always read)",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cpu" if args.dry_run else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry-run")  # not-in-dry-run: a GPU run has one
    size = SIZES["dry" if args.dry_run else "gpu"]
    n = args.prompts or size.prompts
    temporary = Path(tempfile.mkdtemp()) / "gpu.json"
    out = args.out or (temporary if args.dry_run else RESULTS / "gpu.json")
    results = Results(out, device, args.threads, args.dry_run, args.only, set_up(args.threads))
    started = time.perf_counter()
    with until_interrupted("the targets from the steps measured so far"):
        tokenizer = default_model_steps(device, size, n, results)
        release(device)  # the default model is gone: the large model's peak memory is its own
        shaped_model_steps(device, size, n, tokenizer, results)
    results.record("target", targets_step, results.records, device, size)
    results.write(tear_down(device))
    print(f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
