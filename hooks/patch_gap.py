"""Trace the intergroup empathy gap inside the model: activation patching and a gap direction.

For a few crowd-enVent events, score every named perceiver x experiencer prompt of one category
exactly (expected intensity from the logits), keeping the experiencer-span states of every layer.
Then:

1. Patching: per event, the --pairs (in-group (g, g), out-group (g, h)) with the largest
   intensity gap; the clean activation is patched into the out-group run at each
   (layer, site, span) and scored again (see probekit.patching, which also defines how spans of
   different lengths are aligned). Writes patching.parquet, patching.png (layer x site, a panel
   per span) and prints the five (layer, site, span) with the largest mean recovery.
2. Direction: per layer, the difference of means in-group - out-group at the experiencer span and
   how well a prompt's projection on it predicts its intensity gap (directions.parquet); at the
   best layer the direction is projected out and the empathy gap Δ recomputed (causal_check.json).

    python hooks/patch_gap.py --out runs/patch_gap
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from probekit import directions, patching
from probekit.answers import AnswerSet
from probekit.cli import add_study_arguments, int_list, run_script
from probekit.datasets.crowd_envent import first_events
from probekit.errors import ProbekitError
from probekit.models import load_model
from probekit.plots import patching_heatmap
from probekit.scoring.engine import Scorer
from probekit.studies.intergroup import get_category, get_setting

DEFAULT_LAYERS = 6  # with 2 events, 1 pair each: the default run fits in 10 min on 2 CPU cores


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_study_arguments(p, "runs/patch_gap", 2, "number of events (one per emotion)")
    p.add_argument("--pairs", type=int, default=1, help="pairs per event, largest gap first")
    p.add_argument(
        "--layers",
        type=int_list,
        help=f"comma-separated layers (default: {DEFAULT_LAYERS} evenly spaced, first and last)",
    )
    p.add_argument("--sites", default=",".join(patching.SITES), help="comma-separated sites")
    p.add_argument("--spans", default=",".join(patching.SPANS), help="comma-separated spans")
    p.add_argument("--backend", default="transformer_lens", choices=patching.BACKENDS)
    p.add_argument("--batch-size", type=int, help="prompts per forward pass (engine default)")
    p.add_argument(
        "--min-gap", type=float, default=0.0, help="mean recovery over pairs with |gap| >= this"
    )
    p.add_argument(
        "--control", action="store_true", help="also project out a random direction (slower)"
    )
    return p.parse_args(argv)


def pick_pairs(
    pairs: list[patching.Pair], frame: pd.DataFrame, per_event: int
) -> list[patching.Pair]:
    """The `per_event` pairs of each event with the largest |ev(clean) - ev(corrupt)|."""
    if per_event < 1:
        raise ProbekitError(f"--pairs must be at least 1, got {per_event}")
    ev = frame.set_index(["event_id", "perceiver", "experiencer"])["expected"]

    def gap(pair: patching.Pair) -> float:
        clean, corrupt = pair.clean, pair.corrupt
        return abs(
            ev[(clean.event_id, clean.perceiver, clean.experiencer)]
            - ev[(corrupt.event_id, corrupt.perceiver, corrupt.experiencer)]
        )

    ranked = sorted(pairs, key=gap, reverse=True)
    chosen: dict[str, list[patching.Pair]] = {}
    for pair in ranked:
        chosen.setdefault(pair.clean.event_id, [])
        if len(chosen[pair.clean.event_id]) < per_event:
            chosen[pair.clean.event_id].append(pair)
    return [pair for group in chosen.values() for pair in group]


def run(args: argparse.Namespace) -> None:
    start = time.monotonic()
    setting, category = get_setting(args.setting), get_category(args.category)
    events = first_events(args.data, args.events, args.seed)
    model = load_model(args.model)
    n = model.n_layers
    layers = args.layers or sorted({int(x) for x in np.linspace(0, n - 1, DEFAULT_LAYERS).round()})
    sites, spans = args.sites.split(","), args.spans.split(",")
    patches = patching.grid(layers, sites, spans)
    prompts = patching.study_prompts(model, setting, category, events)
    pairs = patching.in_out_pairs(prompts, category)
    patching.check(model, pairs, patches)  # fail on bad input before any scoring
    scorer = Scorer(
        model, AnswerSet.range(0, setting.scale_max), epsilon=0.0, batch_size=args.batch_size
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    states = directions.experiencer_states(scorer, prompts, category)
    chosen = pick_pairs(pairs, states.frame, args.pairs)
    df = patching.sweep(scorer, chosen, patches, backend=args.backend)
    df.to_parquet(out / "patching.parquet", index=False)
    summary = patching.mean_recovery(df, args.min_gap)
    title = f"{model.name}, {category.name}, {setting.name}: {len(chosen)} pairs"
    patching_heatmap(summary, out / "patching.png", sites, spans, title)

    fit = directions.projection_fit(states)
    fit.to_parquet(out / "directions.parquet", index=False)
    check = directions.causal_check(
        scorer, prompts, category, states, fit, control=args.control, seed=args.seed
    )
    best = fit.loc[fit["layer"] == check.layer].iloc[0]
    result = {
        "layer": check.layer,
        "site": f"blocks.{check.layer}.{directions.SITE}",
        "r": float(best["r"]),
        "cross_validated": bool(best["cross_validated"]),
        "delta": check.delta,
        "delta_ablated": check.delta_ablated,
        "delta_random": check.delta_random,
        "shrink": check.shrink,
        "events": len(events),
    }
    (out / "causal_check.json").write_text(json.dumps(result, indent=1))

    print(f"top 5 (layer, site, span) by mean recovery over {len(chosen)} pairs:")
    for row in summary.head(5).itertuples():
        print(f"  {row.layer:>3}  {row.site:<26} {row.span:<17} {row.recovery:+.3f}")
    how = "leave one event out" if result["cross_validated"] else "in-sample"
    print(
        f"gap direction: best layer {check.layer} (r = {result['r']:.3f}, {how}); projecting it "
        f"out at the experiencer span: Δ {check.delta:+.3f} -> {check.delta_ablated:+.3f} "
        f"(shrinks by {100 * check.shrink:.1f}%)"
    )
    if check.delta_random is not None:
        print(f"  control, a random direction there: Δ -> {check.delta_random:+.3f}")
    print(f"wrote {out}/patching.parquet, patching.png, directions.parquet, causal_check.json")
    print(f"wall time {time.monotonic() - start:.0f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_script("patch_gap", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
