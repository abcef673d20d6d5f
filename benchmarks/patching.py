"""Benchmark: full exact patching sweeps vs attribution patching + exact verification of the top k.

On the default model and N intergroup pairs (religion, crowd-enVent events, the largest-gap pair
of each (event, perceiver) first), one run times

  (a) the full exact sweep over layers x heads (`attn.hook_z`) x spans,
  (b) the full exact sweep over layers x {resid_pre, attn_out, mlp_out} x spans,
  (c) attribution patching of every component of (a) and of (b) (one clean forward, one corrupt
      forward and one backward per prompt batch) plus exact patching of the top k of each,

and prints, per grid, the speed-up (exact sweep time / attribution + verification time) and how
well the estimate ranked the components against the full exact sweep: Spearman rho of |mean
effect| and the recall of the exact top 10 among the estimated top 10.

This is a benchmark, not a test: it exits 0 whatever the numbers are and says PASS/FAIL against
the targets (head sweep >= 10x faster, top-10 recall >= 0.8). Timings on a shared machine are
distorted by other processes; the load average is printed at start and end.

    python benchmarks/patching.py                      # 8 pairs, every layer, the study's spans
    python benchmarks/patching.py --layers 0,10,20,29 --spans from_experiencer   # a quick run
    python benchmarks/patching.py --data ../shared/data                          # real events
    python benchmarks/patching.py --grids head --spans from_experiencer          # the target
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import torch
from common import timed

from probekit.cli.main import study_command
from probekit.core.kinds import comma_list, int_list
from probekit.engines.hf.model import load_model
from probekit.engines.hf.scorer import HFScorer
from probekit.mechanism import attribution
from probekit.mechanism.components import grid
from probekit.mechanism.pairs import pick_pairs
from probekit.mechanism.pipeline import measure, readout_gaps
from probekit.mechanism.readouts import parse_readout
from probekit.mechanism.sites import HEAD_SITE, n_heads
from probekit.studies.base import Context, get_study

SITES = ["hook_resid_pre", "hook_attn_out", "hook_mlp_out"]
GRIDS = {"head": "layer x head x span", "site": "layer x site x span"}  # the head grid has a target
MIN_HEAD_SPEEDUP = 10.0
MIN_RECALL = 0.8


def select_pairs(
    scorer: Any,
    study: Any,
    probe: Any,
    encoded: Sequence[Any],
    readout: Any,
    per_unit: int,
) -> list:
    """The study's pairs of `encoded`, the `per_unit` of each unit with the largest |gap|."""
    pairs = study.pairs(probe, encoded)
    results = dict(
        zip([e.id for e in encoded], scorer.score([e.input_ids for e in encoded]), strict=True)
    )
    return pick_pairs(pairs, readout_gaps(readout, pairs, results), per_unit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8, help="pairs (2 per event)")
    parser.add_argument("--layers", type=int_list, help="layers (default: every layer)")
    parser.add_argument("--spans", type=comma_list, help="spans (default: the study's)")
    parser.add_argument("--top-k", type=int, default=20, help="components verified exactly")
    parser.add_argument("--batch-size", type=int, help="prompts per forward")
    parser.add_argument("--data", help="crowd-enVent root (default $PROBEKIT_DATA, else the cache)")
    parser.add_argument(
        "--grids", type=comma_list, default=list(GRIDS), help="head, site or both (default both)"
    )
    options = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    study = get_study("intergroup")
    probe, items = _study_items(study, options.pairs, options.data)
    readout = parse_readout("expected", probe.answers)
    model = load_model("default")
    model.enable_bridge()
    spans = options.spans or list(study.mechanism_defaults().spans)
    layers = options.layers or list(range(model.n_layers))
    encoded = [model.encode(item) for item in items]
    scorer = HFScorer(model, probe.answers, epsilon=0.0, batch_size=options.batch_size)
    pairs = select_pairs(scorer, study, probe, encoded, readout, 2)[: options.pairs]
    print(f"{len(pairs)} pairs, layers {layers[0]}..{layers[-1]} ({len(layers)}), spans {spans}")
    heads = range(n_heads(model))
    unknown = sorted(set(options.grids) - set(GRIDS))
    if unknown:
        parser.error(f"unknown grid {unknown[0]}; choose from {', '.join(GRIDS)}")
    sites = {"head": ([HEAD_SITE], heads), "site": (SITES, ())}
    grids = {
        GRIDS[g]: grid(layers, sites[g][0], spans, sites[g][1]) for g in GRIDS if g in options.grids
    }
    size = options.batch_size
    for name, patches in grids.items():
        exact, t_exact, _ = timed(
            model.device,
            # prompt positions only: what attribution estimates and verify re-measures
            lambda p=patches: measure(
                scorer, pairs, p, readout, batch_size=size, through_answer=False
            ),
        )
        estimated, t_attr, _ = timed(
            model.device,
            lambda p=patches: measure(scorer, pairs, p, readout, "attribution", batch_size=size),
        )
        top = min(options.top_k, len(patches))
        verified, t_verify, _ = timed(
            model.device,
            lambda e=estimated, k=top: attribution.verify(
                scorer, pairs, e, k, readout, batch_size=size
            ),
        )
        per = attribution.effects(
            estimated.assign(
                expected_patched=exact["expected_patched"], ran=exact["ran"], method="exact"
            )
        )
        fit = attribution.agreement(per, k=10)
        speedup = t_exact / (t_attr + t_verify)
        print(f"\n{name}: {len(patches)} components x {len(pairs)} pairs")
        print(f"  full exact sweep             {t_exact:9.1f} s")
        print(f"  attribution (all components) {t_attr:9.1f} s")
        print(f"  exact verification of top {top:<3}{t_verify:9.1f} s")
        print(f"  speed-up                     {speedup:9.1f}x")
        print(f"  Spearman rho of |effect|     {fit['spearman']:+9.3f}")
        print(f"  top-10 recall                {fit['recall@10']:9.2f}")
        if name == GRIDS["head"]:
            verdict = speedup >= MIN_HEAD_SPEEDUP and fit["recall@10"] >= MIN_RECALL
            print(
                f"  target >= {MIN_HEAD_SPEEDUP:.0f}x and recall >= {MIN_RECALL}: "
                f"{'PASS' if verdict else 'FAIL'}"
            )
        del verified
    print(f"\nload average at end: {os.getloadavg()}")


def _study_items(study: Any, pairs: int, data: str | None) -> tuple[Any, list[Any]]:
    """The intergroup study's patch probe and items, enough events to give `pairs` pairs."""
    keywords = {"events": max(1, (pairs + 1) // 2), "data": data}
    _, options, own = study_command("patch", study).build(keywords, "benchmarks/patching.py")
    return study.mechanism_items(own, Context("patch", options.seed, say=lambda *a, **k: None))


if __name__ == "__main__":
    main()
