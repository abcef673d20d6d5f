"""Benchmark: what the logit lens on the exact readout costs against one scoring run.

On the first `--prompts` prompts of intergroup (religion, `--setting`: P0S1T0 reads 0-10,
P0S0T0 0-100), the default model and one thread, one run times, interleaved `--repeats` times
(best of each kept, so that the machine's load falls on all of them alike):

  score         `scorer.score`: one exact scoring run (epsilon 0) as `probekit run` scores,
                on the model's own kernels with its shared-prefix cache;
  score_bridged the same prompts through `probekit.mechanism.interventions.score_with` on the
                TransformerBridge, no hook: the scoring run the lens rides on (the bridge's
                kernels, every prompt a left-padded row, no prefix cache);
  lens          `probekit.mechanism.lens.logit_lens` at every layer: that run while hooks read
                the residual stream after every layer at the positions the scorer reads, then
                the final norm, the LM head and the vocabulary sums per layer at those rows.

It prints each method's seconds, the lens's time over the scoring run's (target: at most
`TARGET`, a small multiple) and over the bridged run's, the trie positions read per prompt, and
the largest |difference| of an answer probability between the lens after the last layer and the
scorer; `--json` writes them for docs/performance.md (`benchmarks/report.py`).

This is a benchmark, not a test: it exits 0 whatever the numbers are. Timings on a shared
machine are distorted by other processes; the load average is printed (and recorded) at start
and end.

    python benchmarks/lens.py --json benchmarks/results/lens.json
    python benchmarks/lens.py --prompts 4 --repeats 1          # a quick run
"""

from __future__ import annotations

import sys

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
from probekit.engines.hf.model import load_model
from probekit.mechanism.interventions import score_with
from probekit.mechanism.lens import logit_lens
from probekit.mechanism.sites import hook_library
from probekit.studies.intergroup import IntergroupProbe, get_category, get_setting

TARGET = 5.0
"""The lens's time over one scoring run of the same prompts, at most."""


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("benchmarks/lens.py", __doc__.splitlines()[0])
    parser.add_argument("--setting", default="P0S1T0", help="intergroup setting (default P0S1T0)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts (default 16)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts a batch (default 8)")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds (default 2)")
    parser.set_defaults(threads=1)
    args = parser.parse_args(argv)
    load_start = set_up(args.threads)
    model = load_model(args.model, device=args.device)
    root = data_root(args.data) or str(SAMPLE_ROOT)
    events = first_events(root, max(1, args.prompts // 36 + 1), seed=0)
    probe = IntergroupProbe(get_category("religion"), get_setting(args.setting), events)
    prompts = first_prompts(model, probe, args.prompts)
    scorer = model.scorer(probe.answers, epsilon=0.0, batch_size=args.batch_size)
    layers = list(range(model.n_layers))
    warm_up(model, prompts[0])

    def bridged() -> list:
        out = []
        for start in range(0, len(prompts), args.batch_size):
            out += score_with(scorer, prompts[start : start + args.batch_size])[0]
        return out

    methods = {
        "score": lambda: list(scorer.score(prompts)),
        "score_bridged": bridged,
        "lens": lambda: logit_lens(scorer, prompts, layers, args.batch_size),
    }
    best: dict[str, float] = {}
    outputs: dict[str, list] = {}
    for round_ in range(args.repeats):
        for name, run in methods.items():
            outputs[name], seconds, _ = timed(model.device, run)
            best[name] = min(best.get(name, np.inf), seconds)
            print(f"round {round_ + 1}: {name:<14} {seconds:8.2f} s")
    with hook_library(model, "transformer_lens"):
        exact = list(scorer.score(prompts))
    difference = max(
        float(np.abs(lens.results[-1].probs - own.probs).max())
        for lens, own in zip(outputs["lens"], exact, strict=True)
    )
    over_score = best["lens"] / best["score"]
    over_bridged = best["lens"] / best["score_bridged"]
    verdict = "PASS" if over_score <= TARGET else "FAIL"
    nodes = len(scorer.trie.nodes)
    print(f"lens / score {over_score:.2f} ({verdict}, target <= {TARGET:g})")
    print(f"lens / score_bridged {over_bridged:.2f}; {nodes} positions read per prompt and layer")
    print(f"largest |lens after the last layer - scorer| {difference:.2g}")
    load_end = tear_down(model.device)
    label = f"{len(prompts)} intergroup prompts ({args.setting}, {probe.answers.answers[0]}-"
    label += f"{probe.answers.answers[-1]}), {len(layers)} layers"
    figures = [
        {"figure": f"score: {label}", "value": round(best["score"], 2), "unit": "s"},
        {
            "figure": "score on the bridge (the lens's run)",
            "value": round(best["score_bridged"], 2),
            "unit": "s",
        },
        {"figure": "lens, every layer", "value": round(best["lens"], 2), "unit": "s"},
        {
            "figure": "lens time / score time",
            "value": round(over_score, 2),
            "unit": "ratio",
            "verdict": f"{verdict} (<= {TARGET:g})",
        },
        {
            "figure": "lens time / bridged score time",
            "value": round(over_bridged, 2),
            "unit": "ratio",
        },
        {"figure": "positions read per prompt and layer", "value": nodes, "unit": "positions"},
        {
            "figure": "largest |lens after the last layer - scorer|",
            "value": float(f"{difference:.2g}"),
            "unit": "probability",
        },
    ]
    if args.json:
        write_results(
            "lens",
            figures,
            device=model.device,
            threads=args.threads,
            load_start=load_start,
            load_end=load_end,
            path=args.json,
            details={"seconds": best, "repeats": args.repeats, "batch_size": args.batch_size},
        )
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
