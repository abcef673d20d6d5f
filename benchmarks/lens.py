"""Benchmark: what the logit lens on the exact readout costs against one scoring run.

On the first `--prompts` prompts of intergroup (religion) in each of `--settings` (P0S1T0
reads 0-10, a trie of 24 nodes with the default model's tokenizer; P0S0T0 reads 0-100, 204
nodes), the default model and one thread, one run times, interleaved `--repeats` times (best of
each kept, so that the machine's load falls on all of them alike):

  score         `scorer.score`: one exact scoring run (epsilon 0) as `probekit run` scores,
                on the model's own kernels with its shared-prefix cache;
  score_bridged the same prompts through `probekit.mechanism.interventions.score_with` on the
                TransformerBridge, no hook: the scoring run the lens rides on (the bridge's
                kernels, every prompt a left-padded row, no prefix cache);
  lens          `probekit.mechanism.lens.logit_lens` at every layer: that run while hooks read
                the residual stream after every layer at the positions the scorer reads, then
                the final norm, the LM head and the vocabulary sums per layer at those rows.

It prints each method's seconds; the lens's time over the scoring run's beside the ratio of
their multiply-adds (the lens adds the LM head at every read position of every layer; target:
the time's ratio at most `TARGET` x that); the lens's time over the bridged run's; the positions
read per prompt and layer (the root and every trie node); and the largest |difference| of an
answer probability between the lens after the last layer and the scorer, of the same forward
passes and of the plain run (other kernels and batch shapes). `--json` writes them for
docs/performance.md (`benchmarks/report.py`).

This is a benchmark, not a test: it exits 0 whatever the numbers are. Timings on a shared
machine are distorted by other processes; the load average is printed (and recorded) at start
and end.

    python benchmarks/lens.py --json benchmarks/results/lens.json
    python benchmarks/lens.py --settings P0S1T0 --prompts 4 --repeats 1   # a quick run
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from common import (
    argument_parser,
    data_root,
    first_prompts,
    set_up,
    tear_down,
    timed,
    warm_up,
    write_results,
)

from probekit.datasets.crowd_envent import SAMPLE_ROOT, first_events
from probekit.engines.hf.head import parameter_split
from probekit.engines.hf.model import load_model
from probekit.mechanism.interventions import score_with
from probekit.mechanism.lens import logit_lens
from probekit.studies.intergroup import IntergroupProbe, get_category, get_setting

TARGET = 1.5
"""The lens's time over one scoring run of the same prompts, at most this many times what its
arithmetic makes it (`arithmetic_ratio`): the lens adds the LM head at every read position of
every layer, and nothing else of note."""


def arithmetic_ratio(model: Any, prompts: list[list[int]], nodes: int) -> float:
    """The lens's multiply-adds over the scoring run's: scoring runs the body over the prompt
    tokens and the body and head over the trie's nodes (the root's head too); the lens adds the
    head at the root and every node of every layer (`head.parameter_split`)."""
    body, head = parameter_split(model)
    tokens = float(np.mean([len(p) for p in prompts]))
    score = tokens * body + (nodes - 1) * (body + head) + head
    return (score + model.n_layers * nodes * head) / score


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("benchmarks/lens.py", __doc__.splitlines()[0])
    parser.add_argument(
        "--settings",
        default="P0S1T0,P0S0T0",
        help="intergroup settings, comma-separated (default P0S1T0 (0-10),P0S0T0 (0-100))",
    )
    parser.add_argument("--prompts", type=int, default=8, help="prompts (default 8)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts a batch (default 8)")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds (default 2)")
    parser.set_defaults(threads=1)
    args = parser.parse_args(argv)
    load_start = set_up(args.threads)
    model = load_model(args.model, device=args.device)
    root = data_root(args.data) or str(SAMPLE_ROOT)
    events = first_events(root, max(1, args.prompts // 36 + 1), seed=0)
    figures: list[dict] = []
    seconds: dict[str, dict[str, float]] = {}
    for setting in args.settings.split(","):
        probe = IntergroupProbe(get_category("religion"), get_setting(setting), events)
        prompts = first_prompts(model, probe, args.prompts)
        found, best = compare(model, probe, prompts, args.batch_size, args.repeats)
        figures += setting_figures(setting, probe, prompts, model, found, best)
        seconds[setting] = best
    load_end = tear_down(model.device)
    if args.json:
        write_results(
            "lens",
            figures,
            device=model.device,
            threads=args.threads,
            load_start=load_start,
            load_end=load_end,
            path=args.json,
            details={"seconds": seconds, "repeats": args.repeats, "batch_size": args.batch_size},
        )
    return 0


def compare(
    model: Any, probe: Any, prompts: list[list[int]], batch_size: int, repeats: int
) -> tuple[dict[str, list], dict[str, float]]:
    """Each method's outputs and its best time over `repeats` interleaved rounds."""
    scorer = model.scorer(probe.answers, epsilon=0.0, batch_size=batch_size)
    layers = list(range(model.n_layers))
    warm_up(model, prompts[0])

    def bridged() -> list:
        out = []
        for start in range(0, len(prompts), batch_size):
            out += score_with(scorer, prompts[start : start + batch_size])[0]
        return out

    methods = {
        "score": lambda: list(scorer.score(prompts)),
        "score_bridged": bridged,
        "lens": lambda: logit_lens(scorer, prompts, layers, batch_size),
    }
    best: dict[str, float] = {}
    found: dict[str, list] = {}
    for round_ in range(repeats):
        for name, run in methods.items():
            found[name], took, _ = timed(model.device, run)
            best[name] = min(best.get(name, np.inf), took)
            print(f"{probe.name} round {round_ + 1}: {name:<14} {took:8.2f} s")
    return found, best


def setting_figures(
    setting: str, probe: Any, prompts: list, model: Any, found: dict, best: dict
) -> list[dict]:
    """One setting's figures (a `series`), printed as they are made."""
    lens = found["lens"]
    own = max(float(np.abs(x.results[-1].probs - x.final.probs).max()) for x in lens)
    plain = max(
        float(np.abs(x.results[-1].probs - y.probs).max())
        for x, y in zip(lens, found["score"], strict=True)
    )
    over_score = best["lens"] / best["score"]
    over_bridged = best["lens"] / best["score_bridged"]
    nodes = len(model.scorer(probe.answers).trie.nodes)
    bound = arithmetic_ratio(model, prompts, nodes)
    verdict = "PASS" if over_score <= TARGET * bound else "FAIL"
    answers = f"{probe.answers.answers[0]}-{probe.answers.answers[-1]}"
    series = f"{len(prompts)} intergroup prompts, {setting} ({answers}), {model.n_layers} layers"
    print(
        f"{series}: lens / score {over_score:.2f} ({verdict}: at most {TARGET:g} x {bound:.2f}, "
        "the ratio of their multiply-adds), "
        f"lens / bridged score {over_bridged:.2f}; {nodes} positions read per prompt and layer; "
        f"|lens after the last layer - scorer| {own:.2g} (same forward), {plain:.2g} (plain run)"
    )
    rows = [
        ("score", best["score"], "s", ""),
        (
            "score on the bridge, no hook (the run the lens rides on)",
            best["score_bridged"],
            "s",
            "",
        ),
        ("lens, every layer", best["lens"], "s", ""),
        ("lens multiply-adds / score multiply-adds", bound, "ratio", ""),
        (
            "lens time / score time",
            over_score,
            "ratio",
            f"{verdict} (<= {TARGET:g} x the multiply-adds' ratio)",
        ),
        ("lens time / bridged score time", over_bridged, "ratio", ""),
        ("positions read per prompt and layer", nodes, "positions", ""),
        ("largest |lens after the last layer - scorer|, same forward", own, "probability", ""),
        ("largest |lens after the last layer - plain score|", plain, "probability", ""),
    ]
    return [
        {
            "series": series,
            "figure": name,
            "value": shown(value, unit),
            "unit": unit,
            **({"verdict": verdict_} if verdict_ else {}),
        }
        for name, value, unit, verdict_ in rows
    ]


def shown(value: float, unit: str) -> float | int:
    """A figure as the page shows it: seconds and ratios to 2 decimals, probabilities to 2
    significant digits, counts as they are."""
    if unit in ("s", "ratio"):
        return round(float(value), 2)
    if unit == "probability":
        return float(f"{value:.2g}")
    return int(value)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
