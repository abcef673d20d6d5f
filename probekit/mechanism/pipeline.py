"""The patch and capture analyses of a study, as `probekit patch` and `probekit capture` run them.

The options of `probekit patch` and `capture` are declared here once (`probekit.core.options`):
`PatchOptions` and `CaptureOptions`, on the `HookOptions` every mechanism command reads
(`probekit.mechanism.options`; `probekit.mechanism.steering.SteerOptions` is steer's).
`check_patch` validates patch options against the items before any model is loaded; `run_patch`
then does the rest:
1. Pairs: the study's counterfactual pairs (intergroup: in-group (g, g) vs out-group (g, h) on
   the same event), the `pairs_per_unit` with the largest readout gap (`pick_pairs`).
2. Patching (`measure`): the clean activation is patched into the corrupt run at each (layer,
   site, span), and each head at `attn.hook_z` (`method="exact"`, mechanism.patching); or every
   component is estimated by attribution patching (`attribution`) and the `top_k` re-measured
   exactly (`attribution+verify`, mechanism.attribution). Writes patching.parquet,
   patching_summary.csv (each component's mean effect and estimate with bootstrap intervals over
   pairs), patching.png (layer x site, a panel per span), heads.png (layer x head) or
   positions.png (with `per_position`), and prints the five components with the largest effect.
   `mediation` adds the total, direct and indirect effects of the exactly measured components
   (mediation.parquet, mediation_summary.csv; mechanism.mediation).
3. Direction (studies that define one; not with `skip_direction`): per layer, the difference of
   means across the contrast at one span and how well a prompt's projection predicts its gap
   (directions.parquet); at the best layer the direction is projected out and the study's
   statistic recomputed (causal_check.json).
`run_capture` writes a study's activations (mechanism.capture).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.io import write_parquet, write_text
from probekit.core.items import PROMPT_ID, EncodedItem, Item, Pair, check_span_names
from probekit.core.kinds import choice, int_list, positive_int, text
from probekit.core.options import default_of, named, option
from probekit.engines.base import HookedScorer
from probekit.engines.options import EpsilonOption
from probekit.mechanism import attribution, capture, directions, mediation, patching
from probekit.mechanism.components import Patch, check, grid
from probekit.mechanism.defaults import MechanismDefaults
from probekit.mechanism.options import HookOptions
from probekit.mechanism.pairs import base_span, pick_pairs, single_positions
from probekit.mechanism.plots import head_heatmap, patching_heatmap, position_heatmap
from probekit.mechanism.readouts import PAIRED, Readout, parse_readout
from probekit.mechanism.sites import HEAD_SITE, chosen_layers, n_heads
from probekit.mechanism.sites import site as find_site

METHODS = attribution.METHODS
Say = Callable[[str], None]


@dataclass(frozen=True)
class PatchOptions(HookOptions):
    """Patch options: the components, the readout, the method and what else to measure."""

    heads: list[int] | None = option(
        None, help=f"heads at {HEAD_SITE} (default: every head)", kind=int_list
    )
    readout: str | None = option(
        None,
        help="the per-prompt readout (TransformerLens's patching metric): expected, p:<answer>, "
        "p_correct, a difference 'X - Y', or tv (overlap 1 - TV with the pair's clean "
        "distribution; --method exact only) (default: the study's)",
        kind=text,
    )
    method: str = option(
        "exact",
        help="exact patching, attribution estimates, or both for the --top-k estimated",
        kind=choice("method", METHODS),
    )
    top_k: int = option(
        20,
        help="components re-measured by attribution+verify (default %(default)s)",
        kind=positive_int,
    )
    pairs_per_unit: int = option(
        1,
        help="pairs patched per unit (event, item), largest gap first (default %(default)s)",
        kind=positive_int,
    )
    per_position: bool = option(
        False,
        help="patch each position of each span on its own (span@-k ... span@-1, aligned at the "
        "span's end; a layer x position heatmap per site)",
    )
    mediation: bool = option(
        False, help="also the direct effect of each exactly measured component (one more sweep)"
    )
    bootstrap: int = option(
        1000,
        help="resamples of the pairs for the intervals (default %(default)s)",
        kind=positive_int,
    )
    prompt_only: bool = option(
        False,
        help="patch prompt positions only (by default a span that runs to the end, such as "
        "from_<span>, also patches every answer position; nnsight patches the prompt only)",
    )
    control: bool = option(False, help="also project out a random direction (slower)")
    skip_direction: bool = option(False, help="patching (and mediation) only")

    @property
    def through_answer(self) -> bool | None:
        """`patching.sweep`'s `through_answer`: False with `prompt_only`, else its default."""
        return False if self.prompt_only else None


@dataclass(frozen=True)
class CaptureOptions(HookOptions):
    """Capture options: which activations are kept."""


def check_patch_options(request: PatchOptions) -> None:
    """One line for patch options that cannot go together, known from the options alone (the
    patch command's check while parsing, before any data or model loads): mediation of
    estimated components, a pair's readout with attribution or mediation."""
    for name in request.sites:
        find_site(name)
    if request.mediation and request.method == "attribution":
        raise ProbekitError(
            f"{named('mediation')} needs exactly measured components: use {named('method')} "
            "exact or attribution+verify"
        )
    terms = [term.strip() for term in (request.readout or "").split(" - ")]
    if request.readout and PAIRED in terms:
        _refuse_paired(request.readout, request)


def check_patch(
    request: PatchOptions,
    items: Sequence[Item],
    answers: Any,
    defaults: MechanismDefaults,
) -> Readout | None:
    """One line for any bad choice that needs no model (naming options with `named`); the
    readout when its spec is fixed (None when the study chooses it from the exact scores)."""
    check_patch_options(request)
    if request.spans:
        check_span_names(items, [base_span(s) for s in request.spans])
    spec = request.readout or defaults.readout
    if not isinstance(spec, str):
        return None
    readout = parse_readout(spec, answers)
    if readout.paired:
        _refuse_paired(readout.spec, request)
    return readout


def _refuse_paired(spec: str, request: PatchOptions) -> None:
    """One line for a readout of a pair's two distributions with attribution or mediation."""
    if request.method != "exact" or request.mediation:
        raise ProbekitError(
            f"the readout {spec} compares a pair's two distributions: use it with "
            f"{named('method')} exact and without {named('mediation')} (attribution needs a "
            "readout linear in one distribution, mediation a readout defined per prompt)"
        )


def run_patch(
    model: Any,
    study: Any,
    probe: Any,
    items: Sequence[Item],
    request: PatchOptions,
    out: str | Path,
    say: Say = print,
) -> list[str]:
    """The whole patch analysis of a study's items into `out`; the files written."""
    defaults: MechanismDefaults = study.mechanism_defaults()
    readout = check_patch(request, items, probe.answers, defaults)
    spans = list(request.spans or defaults.spans or [n for i in items[:1] for n in i.span_names])
    layers = chosen_layers(model, request.layers or None, "patch")
    heads = list(request.heads) if request.heads else list(range(n_heads(model)))
    encoded = [model.encode(item) for item in items]
    model.settle_precision(probe.answers, [e.input_ids for e in encoded])
    pairs = study.pairs(probe, encoded)
    if request.per_position:
        spans = single_positions(spans, pairs)
    patches = grid(layers, request.sites, spans, heads)
    check(model, pairs, patches)  # fail on bad input before any scoring
    if request.method == "attribution+verify" and not 1 <= request.top_k <= len(patches):
        raise ProbekitError(
            f"{named('top_k')} must lie between 1 and the number of components "
            f"({len(patches)}), got {request.top_k}"
        )
    epsilon = default_of(EpsilonOption, "epsilon", "patch")  # exact distributions
    scorer = model.scorer(probe.answers, epsilon=epsilon, batch_size=request.batch_size)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)

    direction = None if request.skip_direction else defaults.direction
    if direction and readout is not None and readout.paired:
        say(f"no direction analysis: it needs a readout of one prompt, and {readout.spec} is not")
        direction = None
    if direction:  # one scoring pass gives the readout of every prompt and the span's states
        states = directions.span_states(
            scorer, encoded, direction.span, readout, direction.contrast(probe), direction.centre
        )
        value = dict(zip(states.frame[PROMPT_ID], states.frame[directions.VALUE], strict=True))
        gaps = [value[clean.id] - value[corrupt.id] for clean, corrupt in pairs]
    else:
        results = list(scorer.score([e.input_ids for e in encoded]))  # batched and windowed
        if readout is None:
            readout = parse_readout(defaults.readout(probe, encoded, results), probe.answers)
            say(f"readout {readout.spec}: the study's default, read from the exact scores")
        gaps = readout_gaps(
            readout, pairs, dict(zip([e.id for e in encoded], results, strict=True))
        )
    chosen = pick_pairs(pairs, gaps, request.pairs_per_unit)
    say(f"{len(patches)} components ({len(layers)} layers) x {len(chosen)} pairs")
    df = measure(
        scorer,
        chosen,
        patches,
        readout,
        request.method,
        request.top_k,
        request.hooks,
        request.batch_size,
        say,
        request.through_answer,
    )
    df = patching.annotate(df, n=request.bootstrap, seed=request.seed)  # as probekit.patch's
    if weak := df.attrs.get("weak_signal"):
        print(f"probekit: warning: {weak}", file=sys.stderr)
    write_parquet(folder / "patching.parquet", df)
    title = f"{model.name}, {probe.name}"
    written = ["patching.parquet", *report(df, folder, request, spans, title, say)]
    if request.mediation:
        exact = request.method == "exact"
        measured = patches if exact else attribution.top_components(df, request.top_k)
        written += mediate(scorer, chosen, measured, readout, folder, request, say)
    if direction:
        written += direction_check(
            scorer, study, probe, encoded, states, direction, readout, folder, request, say
        )
    return written


def readout_gaps(readout: Readout, pairs: Sequence[Pair], results: dict[str, Any]) -> list[float]:
    """readout(clean) - readout(corrupt) of each pair, from the exact results by prompt id."""
    return [
        readout(results[clean.id], clean.item, results[clean.id])
        - readout(results[corrupt.id], corrupt.item, results[clean.id])
        for clean, corrupt in pairs
    ]


def measure(
    scorer: HookedScorer,
    pairs: Sequence[Pair],
    patches: Sequence[Patch],
    readout: Readout,
    method: str = "exact",
    top_k: int = 20,
    hooks: str = "transformer_lens",
    batch_size: int | None = None,
    say: Say = print,
    through_answer: bool | None = None,
) -> pd.DataFrame:
    """The patching table of `method`; attribution+verify says how well the estimate ranked
    the verified components. Exact patching shows a progress bar on a terminal."""
    if method == "exact":
        return patching.sweep(
            scorer,
            pairs,
            patches,
            readout,
            hooks=hooks,
            batch_size=batch_size,
            through_answer=through_answer,
        )
    if method not in METHODS:
        raise ProbekitError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    df = attribution.attribute(scorer, pairs, patches, readout, batch_size=batch_size)
    if method == "attribution+verify":
        df = attribution.verify(scorer, pairs, df, top_k, readout, hooks, batch_size)
        fit = attribution.agreement(attribution.effects(df))
        recall = fit["recall@10"]
        say(
            f"attribution vs exact over the {fit['components']} verified components: Spearman "
            f"rho of |effect| {fit['spearman']:+.3f}"
            + ("" if np.isnan(recall) else f", top-10 recall {recall:.2f}")
        )
    return df


def report(
    df: pd.DataFrame,
    out: Path,
    request: PatchOptions,
    spans: list[str],
    name: str,
    say: Say = print,
) -> list[str]:
    """patching_summary.csv, the heatmaps and the top five components; the files written."""
    summary = patching.summarise(df, n=request.bootstrap, seed=request.seed)
    write_text(out / "patching_summary.csv", summary.to_csv(index=False))
    written = ["patching_summary.csv"]
    attributed = request.method == "attribution"
    value = "estimated_recovery" if attributed else "recovery"
    pairs = df["clean_prompt_id"].str.cat(df["corrupt_prompt_id"]).nunique()
    title = f"{name}, {df['readout'].iloc[0]}: {pairs} pairs, {request.method}"
    names = [find_site(s).name for s in request.sites]
    sites = [s for s in names if s != HEAD_SITE]
    plain = summary[summary["head"].isna() & summary[value].notna()]
    if request.per_position:  # one column per position: a layer x position map per site and span
        shown = summary[summary[value].notna()]
        position_heatmap(shown, out / "positions.png", value, names, title)
        written.append("positions.png")
    elif sites and not plain.empty:
        shown = plain[["layer", "site", "span"]].assign(recovery=plain[value])
        patching_heatmap(shown, out / "patching.png", sites, spans, title)
        written.append("patching.png")
    heads = summary[summary["head"].notna() & summary[value].notna()]
    if not heads.empty and not request.per_position:
        head_heatmap(heads, out / "heads.png", value, spans, title)
        written.append("heads.png")
    what = "attribution estimate" if attributed else "exact effect"
    column = "estimate" if attributed else "effect"
    ranked = summary.dropna(subset=[column])
    line = patching.noise_line(df)
    if line:
        say(line)
    say(
        f"top {min(5, len(ranked))} of {len(summary)} components (layer, site, span) by mean "
        f"{what} on {df['readout'].iloc[0]} over {pairs} pairs:"
    )
    for row in ranked.head(5).itertuples():
        where = row.site if pd.isna(row.head) else f"{row.site} head {row.head}"
        low, high = getattr(row, f"{column}_low"), getattr(row, f"{column}_high")
        say(
            f"  {row.layer:>3}  {where:<34} {row.span:<17} {getattr(row, column):+.4f} "
            f"[{low:+.4f}, {high:+.4f}]"
        )
    return written


def mediate(
    scorer: HookedScorer,
    pairs: list[Pair],
    patches: list[Patch],
    readout: Readout,
    out: Path,
    request: PatchOptions,
    say: Say = print,
) -> list[str]:
    """mediation.parquet and mediation_summary.csv for `patches`; says the top components'
    share of the total effect."""
    effects = mediation.mediate(
        scorer, pairs, patches, readout, hooks=request.hooks, batch_size=request.batch_size
    )
    write_parquet(out / "mediation.parquet", effects)
    summary = mediation.summarise(effects, n=request.bootstrap, seed=request.seed)
    write_text(out / "mediation_summary.csv", summary.to_csv(index=False))
    top = min(5, len(summary))
    share = mediation.top_share(effects, top, n=request.bootstrap, seed=request.seed)
    say(
        f"mediation: the top {top} components' indirect effects carry {share['share']:.1%} "
        f"[{share['low']:.1%}, {share['high']:.1%}] of the total effect"
    )
    return ["mediation.parquet", "mediation_summary.csv"]


def direction_check(
    scorer: HookedScorer,
    study: Any,
    probe: Any,
    encoded: Sequence[EncodedItem],
    states: directions.States,
    direction: Any,
    readout: Readout,
    out: Path,
    request: PatchOptions,
    say: Say = print,
) -> list[str]:
    """directions.parquet (the fit per layer) and causal_check.json (the statistic before and
    after projecting the best layer's direction out)."""
    fit = directions.projection_fit(states, [e.item.unit for e in encoded], direction.centre)
    write_parquet(out / "directions.parquet", fit)
    found = directions.causal_check(
        scorer,
        encoded,
        states,
        fit,
        readout,
        direction.statistic(probe),
        control=request.control,
        seed=request.seed,
    )
    best = fit.loc[fit["layer"] == found.layer].iloc[0]
    result = {
        "layer": found.layer,
        "site": directions.SITE.name,
        "span": direction.span,
        "readout": readout.spec,
        "r": float(best["r"]),
        "cross_validated": bool(best["cross_validated"]),
        "delta": found.delta,
        "delta_ablated": found.delta_ablated,
        "delta_random": found.delta_random,
        "shrink": found.shrink,
        f"{study.unit_name}s": len({e.item.unit for e in encoded}),
    }
    write_text(out / "causal_check.json", json.dumps(result, indent=1))
    how = f"leave one {study.unit_name} out" if result["cross_validated"] else "in-sample"
    say(
        f"direction at '{direction.span}': best layer {found.layer} (r = {result['r']:.3f}, "
        f"{how}); projecting it out: Δ {found.delta:+.3f} -> {found.delta_ablated:+.3f} "
        f"(shrinks by {100 * found.shrink:.1f}%)"
    )
    if found.delta_random is not None:
        say(f"  control, a random direction there: Δ -> {found.delta_random:+.3f}")
    return ["directions.parquet", "causal_check.json"]


def check_capture(request: CaptureOptions, items: Sequence[Item]) -> None:
    """One line for any bad choice that needs no model."""
    for name in request.sites:
        find_site(name)
    if request.spans:
        check_span_names(items, request.spans)


def run_capture(
    model: Any,
    probe: Any,
    items: Sequence[Item],
    request: CaptureOptions,
    out: str | Path,
    say: Say = print,
) -> capture.CaptureResult:
    """Capture a study's items into `out` (resumable) and say where the files are."""
    check_capture(request, items)
    layers = chosen_layers(model, request.layers or None, "capture")
    result = capture.capture(
        model,
        (model.encode(item) for item in items),
        out,
        layers=layers,
        sites=request.sites,
        spans=request.spans,
        hooks=request.hooks,
        batch_size=request.batch_size,
    )
    say(
        f"captured {result.captured} prompts ({result.skipped} already there) of {probe.name} at "
        f"layers {layers}\nshards: {result.out_dir / 'shards'}\nindex:  {result.out_dir / 'index'}"
        " (probekit.mechanism.capture.read_index / load_activations / read_activations)"
    )
    return result
