"""`probekit patch STUDY`: trace a study's behavioural gap inside the model.

1. Patching: the study's counterfactual pairs (intergroup: in-group (g, g) vs out-group (g, h) on
   the same event), the `--pairs` per unit with the largest metric gap; the clean activation is
   patched into the corrupt run at each (layer, site, span), and each head with the site
   `attn.hook_z`, and scored again (`--method exact`, see mechanism.patching); or every component
   is estimated by attribution patching on the exact metric (`attribution`) and the `--top-k`
   re-measured exactly (`attribution+verify`, see mechanism.attribution). Writes patching.parquet,
   patching_summary.csv (each component's mean effect and estimate with bootstrap intervals over
   pairs), patching.png (layer x site, a panel per span), heads.png (layer x head) and prints the
   five components with the largest effect. `--mediation` adds the total, direct and indirect
   effects of the exactly measured components (mediation.parquet, mediation_summary.csv; see
   probekit.mechanism.mediation).
2. Direction (studies that define a contrast; not with `--skip-direction`): per layer, the
   difference of means across the contrast at one span and how well a prompt's projection
   predicts its gap (directions.parquet); at the best layer the direction is projected out and
   the study's statistic recomputed (causal_check.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from probekit.engines.hf.model import load_model
from probekit.engines.hf.scorer import Scorer
from probekit.errors import ProbekitError
from probekit.io import write_parquet, write_text
from probekit.items import Pair, check_span_names
from probekit.mechanism import attribution, directions, mediation, patching
from probekit.options import comma_list, int_list
from probekit.plots import head_heatmap, patching_heatmap, position_heatmap
from probekit.scoring.metrics import Metric, parse_metric
from probekit.studies.base import Study

DEFAULT_LAYERS = 6  # with 2 events, 1 pair each: the default run fits in 10 min on 2 CPU cores


def add_arguments(parser: argparse.ArgumentParser, study: Study) -> None:
    defaults = study.mechanism_defaults()
    parser.add_argument("--out", default="runs/patch", help="output folder")
    parser.add_argument("--model", default="default", help="hub id, model dir, .gguf or default")
    parser.add_argument("--seed", type=int, default=0, help="items and the random control")
    parser.add_argument("--pairs", type=int, default=1, help="pairs per unit, largest gap first")
    parser.add_argument(
        "--layers", type=int_list,
        help=f"comma-separated layers (default: {DEFAULT_LAYERS} evenly spaced, first and last)",
    )  # fmt: skip
    parser.add_argument(
        "--sites", type=comma_list, default=list(patching.SITES),
        help=f"comma-separated sites; {patching.HEAD_SITE} patches each attention head",
    )  # fmt: skip
    parser.add_argument(
        "--heads", type=int_list, help=f"heads at {patching.HEAD_SITE} (default: every head)"
    )
    parser.add_argument(
        "--method", default="exact", choices=attribution.METHODS,
        help="exact patching, attribution estimates, or both for the --top-k estimated",
    )  # fmt: skip
    parser.add_argument(
        "--top-k", type=int, default=20, help="components re-measured by attribution+verify"
    )
    parser.add_argument(
        "--mediation", action="store_true",
        help="also the direct effect of each exactly measured component (one more sweep)",
    )  # fmt: skip
    parser.add_argument(
        "--bootstrap", type=int, default=1000, help="resamples of the pairs for the intervals"
    )
    parser.add_argument(
        "--spans", type=comma_list, default=defaults.get("spans"),
        help="span names, from_<span> (everything from the span to the end), <span>@<i> (the "
        "i-th of its positions; -1 the last)",
    )  # fmt: skip
    parser.add_argument(
        "--positions", action="store_true",
        help="patch each position of each span on its own (span@-k ... span@-1, aligned at the "
        "span's end; a layer x position heatmap per site)",
    )  # fmt: skip
    parser.add_argument(
        "--metric",
        help="ev, p:<answer>, p_correct, a difference 'X - Y', or tv (overlap 1 - TV with the "
        f"pair's clean distribution; --method exact only); default: {_metric_default(defaults)}",
    )  # fmt: skip
    parser.add_argument("--backend", default="transformer_lens", choices=patching.BACKENDS)
    parser.add_argument("--batch-size", type=int, help="prompts per forward pass")
    parser.add_argument(
        "--min-gap", type=float, default=0.0, help="mean recovery over pairs with |gap| >= this"
    )
    parser.add_argument(
        "--control", action="store_true", help="also project out a random direction (slower)"
    )
    parser.add_argument(
        "--skip-direction", action="store_true", help="patching (and mediation) only"
    )
    study.add_mechanism_arguments(parser, default_events=2)


def _metric_default(defaults: dict) -> str:
    chosen = defaults.get("metric", "ev")
    return chosen.__doc__.split(".")[0].strip() if callable(chosen) else chosen


def execute(study: Study, args: argparse.Namespace) -> None:
    start = time.monotonic()
    defaults = study.mechanism_defaults()
    probe, items = study.mechanism_items(args, print, "patch")
    spec = args.metric or defaults.get("metric", "ev")
    # A study may choose its default metric from the exact scores of the prompts (set below).
    metric = None if callable(spec) else parse_metric(spec, probe.answers)
    spans = args.spans or [name for item in items[:1] for name in item.span_names]
    check_span_names(
        items, [patching.split_position(s)[0].removeprefix(patching.FROM) for s in spans]
    )
    if args.pairs < 1:
        raise ProbekitError(f"--pairs must be at least 1, got {args.pairs}")
    if args.mediation and args.method == "attribution":
        raise ProbekitError(
            "--mediation needs exactly measured components: use --method exact or "
            "attribution+verify"
        )
    if metric is not None and metric.paired and (args.method != "exact" or args.mediation):
        raise ProbekitError(
            f"the metric {metric.spec} compares a pair's two distributions: use it with "
            "--method exact and without --mediation (attribution needs a metric linear in one "
            "distribution, mediation a metric defined per prompt)"
        )
    model = load_model(args.model)
    n = model.n_layers
    layers = args.layers or sorted({int(x) for x in np.linspace(0, n - 1, DEFAULT_LAYERS).round()})
    heads = args.heads or list(range(patching.n_heads(model)))
    encoded = [model.encode(item) for item in items]
    pairs = study.pairs(probe, encoded)
    if args.positions:
        spans = patching.single_positions(spans, pairs)
    patches = patching.grid(layers, args.sites, spans, heads)
    patching.check(model, pairs, patches)  # fail on bad input before any scoring
    if args.method == "attribution+verify" and not 1 <= args.top_k <= len(patches):
        raise ProbekitError(
            f"--top-k must lie between 1 and the number of components ({len(patches)}), "
            f"got {args.top_k}"
        )
    scorer = Scorer(model, probe.answers, epsilon=0.0, batch_size=args.batch_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    span = None if args.skip_direction else defaults.get("direction_span")
    if span and metric is not None and metric.paired:
        print(f"no direction analysis: it needs a metric of one prompt, and {metric.spec} is not")
        span = None
    if span:  # one scoring pass gives the metric of every prompt and the span's states
        states = directions.span_states(
            scorer, encoded, span, metric, defaults["direction_contrast"](probe),
            defaults["direction_centre"],
        )  # fmt: skip
        value = dict(zip(states.frame["prompt_id"], states.frame[directions.VALUE], strict=True))
        gaps = [value[clean.id] - value[corrupt.id] for clean, corrupt in pairs]
    else:
        results = list(scorer.score([e.input_ids for e in encoded]))  # batched and windowed
        if metric is None:
            metric = parse_metric(spec(probe, encoded, results), probe.answers)
            print(f"metric {metric.spec}: the study's default, read from the exact scores")
        result = {e.id: r for e, r in zip(encoded, results, strict=True)}
        gaps = [
            metric(result[clean.id], clean.item, result[clean.id])
            - metric(result[corrupt.id], corrupt.item, result[clean.id])
            for clean, corrupt in pairs
        ]
    chosen = pick_pairs(pairs, gaps, args.pairs)
    df = measure(scorer, chosen, patches, metric, args)
    write_parquet(out / "patching.parquet", df)
    written = ["patching.parquet", *report(df, out, args, spans, f"{model.name}, {probe.name}")]
    if args.mediation:
        exact = args.method == "exact"
        measured = patches if exact else attribution.top_components(df, args.top_k)
        written += mediate(scorer, chosen, measured, metric, out, args)
    if span:
        fit = directions.projection_fit(
            states, [e.item.unit for e in encoded], defaults["direction_centre"]
        )
        write_parquet(out / "directions.parquet", fit)
        check = directions.causal_check(
            scorer, encoded, states, fit, metric, defaults["direction_statistic"](probe),
            control=args.control, seed=args.seed,
        )  # fmt: skip
        best = fit.loc[fit["layer"] == check.layer].iloc[0]
        result = {
            "layer": check.layer,
            "site": f"blocks.{check.layer}.{directions.SITE}",
            "span": span,
            "metric": metric.spec,
            "r": float(best["r"]),
            "cross_validated": bool(best["cross_validated"]),
            "delta": check.delta,
            "delta_ablated": check.delta_ablated,
            "delta_random": check.delta_random,
            "shrink": check.shrink,
            f"{study.unit_name}s": len({e.item.unit for e in encoded}),
        }
        write_text(out / "causal_check.json", json.dumps(result, indent=1))
        how = f"leave one {study.unit_name} out" if result["cross_validated"] else "in-sample"
        print(
            f"direction at '{span}': best layer {check.layer} (r = {result['r']:.3f}, {how}); "
            f"projecting it out: Δ {check.delta:+.3f} -> {check.delta_ablated:+.3f} "
            f"(shrinks by {100 * check.shrink:.1f}%)"
        )
        if check.delta_random is not None:
            print(f"  control, a random direction there: Δ -> {check.delta_random:+.3f}")
        written += ["directions.parquet", "causal_check.json"]
    print(f"wrote {out}/{', '.join(written)}")
    print(f"wall time {time.monotonic() - start:.0f} s")


def measure(
    scorer: Scorer,
    pairs: list[Pair],
    patches: list[patching.Patch],
    metric: Metric,
    args: argparse.Namespace,
) -> pd.DataFrame:
    """The patching table of the chosen `--method`; attribution+verify prints how well the
    estimate ranked the verified components."""
    if args.method == "exact":
        return patching.sweep(
            scorer, pairs, patches, metric, backend=args.backend, batch_size=args.batch_size
        )
    df = attribution.attribute(scorer, pairs, patches, metric, batch_size=args.batch_size)
    if args.method == "attribution+verify":
        df = attribution.verify(
            scorer, pairs, df, args.top_k, metric, args.backend, args.batch_size
        )
        fit = attribution.agreement(attribution.effects(df))
        recall = fit["recall@10"]
        print(
            f"attribution vs exact over the {fit['components']} verified components: Spearman "
            f"rho of |effect| {fit['spearman']:+.3f}"
            + ("" if np.isnan(recall) else f", top-10 recall {recall:.2f}")
        )
    return df


def report(
    df: pd.DataFrame, out: Path, args: argparse.Namespace, spans: list[str], name: str
) -> list[str]:
    """patching_summary.csv, the heatmaps and the top five components; the files written."""
    summary = patching.summarise(df, n=args.bootstrap, seed=args.seed)
    write_text(out / "patching_summary.csv", summary.to_csv(index=False))
    written = ["patching_summary.csv"]
    value = "estimated_recovery" if args.method == "attribution" else "recovery"
    pairs = df["clean_prompt_id"].str.cat(df["corrupt_prompt_id"]).nunique()
    title = f"{name}, {df['metric'].iloc[0]}: {pairs} pairs, {args.method}"
    sites = [s for s in args.sites if s != patching.HEAD_SITE]
    plain = summary[summary["head"].isna() & summary[value].notna()]
    if args.positions:  # one column per position: a layer x position map per site and span
        shown = summary[summary[value].notna()]
        position_heatmap(shown, out / "positions.png", value, args.sites, title)
        written.append("positions.png")
    elif sites and not plain.empty:
        shown = plain[["layer", "site", "span"]].assign(recovery=plain[value])
        patching_heatmap(shown, out / "patching.png", sites, spans, title)
        written.append("patching.png")
    heads = summary[summary["head"].notna() & summary[value].notna()]
    if not heads.empty and not args.positions:
        head_heatmap(heads, out / "heads.png", value, spans, title)
        written.append("heads.png")
    what = "exact effect" if args.method != "attribution" else "attribution estimate"
    print(f"top 5 (layer, site, span) by mean {what} on {df['metric'].iloc[0]} over {pairs} pairs:")
    column = "effect" if args.method != "attribution" else "estimate"
    for row in summary.dropna(subset=[column]).head(5).itertuples():
        where = row.site if pd.isna(row.head) else f"{row.site} head {row.head}"
        low, high = getattr(row, f"{column}_low"), getattr(row, f"{column}_high")
        print(
            f"  {row.layer:>3}  {where:<34} {row.span:<17} {getattr(row, column):+.4f} "
            f"[{low:+.4f}, {high:+.4f}]"
        )
    return written


def mediate(
    scorer: Scorer,
    pairs: list[Pair],
    patches: list[patching.Patch],
    metric: Metric,
    out: Path,
    args: argparse.Namespace,
) -> list[str]:
    """mediation.parquet and mediation_summary.csv for `patches`; prints the top components'
    share of the total effect."""
    effects = mediation.mediate(scorer, pairs, patches, metric, args.backend, args.batch_size)
    write_parquet(out / "mediation.parquet", effects)
    summary = mediation.summarise(effects, n=args.bootstrap, seed=args.seed)
    write_text(out / "mediation_summary.csv", summary.to_csv(index=False))
    top = min(5, len(summary))
    share = mediation.top_share(effects, top, n=args.bootstrap, seed=args.seed)
    print(
        f"mediation: the top {top} components' indirect effects carry {share['share']:.1%} "
        f"[{share['low']:.1%}, {share['high']:.1%}] of the total effect"
    )
    return ["mediation.parquet", "mediation_summary.csv"]


def pick_pairs(pairs: list[Pair], gaps: list[float], per_unit: int) -> list[Pair]:
    """The `per_unit` pairs of each unit with the largest |gap| (metric(clean) -
    metric(corrupt), one per pair)."""
    size = [abs(g) if np.isfinite(g) else -1.0 for g in gaps]
    chosen: dict[str, list[Pair]] = {}
    for i in sorted(range(len(pairs)), key=size.__getitem__, reverse=True):
        pair = pairs[i]
        group = chosen.setdefault(pair[0].item.unit, [])
        if len(group) < per_unit:
            group.append(pair)
    return [pair for group in chosen.values() for pair in group]
