"""The patch and capture analyses of a study, as `probekit patch` and `probekit capture` run them.

The options of `probekit patch` and `capture` are declared here once (`probekit.core.options`):
`PatchOptions` and `CaptureOptions`, on the `HookOptions` every mechanism command reads
(`probekit.mechanism.options`; `probekit.mechanism.steering.SteerOptions` is steer's).
`check_patch` validates patch options against the items before any model is loaded; `run_patch`
then does the rest:
1. Sets: the sets of pairs the study's effect is read on (`MechanismDefaults.effect`,
   mechanism.pairs: intergroup's 2x2 interaction sets of perceiver x experiencer on one event,
   another study's pairs one by one), all of them, or `sets_per_unit` per unit drawn at random
   with `seed`.
2. Patching (`measure`): the clean activation is patched into the corrupt run at each (layer,
   site, span), and each head at `attn.hook_z` (`method="exact"`, mechanism.patching); or every
   component is estimated by attribution patching (`attribution`) and the `top_k` re-measured
   exactly (`attribution+verify`, mechanism.attribution). Writes patching.parquet,
   patching_summary.csv (each component's status, mean effect and estimate, recovery with
   bootstrap intervals over units, p values adjusted over the components), patching.png (layer
   x site, a panel per span), heads.png (layer x head) or positions.png (with `per_position`),
   and prints the five measured components with the largest effect (`run_patch`'s `sweep`
   measures exactly: `probekit patch` keeps its rows as it goes, `probekit.run.patch`).
   `mediation` adds the total,
   direct and indirect effects of the exactly measured components (mediation.parquet,
   mediation_summary.csv; mechanism.mediation).
3. Direction (studies that define one; not with `skip_direction`): per layer, the difference of
   means across the contrast at one span and how well a prompt's projection predicts its gap
   (directions.parquet); cross-fitted by units, each fold's direction (at the layer chosen on
   the other units) is projected out of its held-out units' prompts and the study's statistic
   recomputed, beside `controls` random directions (causal_check.json).
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
from probekit.core.io import check_room, write_parquet, write_text
from probekit.core.items import EncodedItem, Item, Pair, check_span_names
from probekit.core.kinds import choice, int_list, positive_int, text
from probekit.core.options import default_of, named, option
from probekit.engines.base import HookedScorer
from probekit.engines.options import EpsilonOption
from probekit.mechanism import attribution, capture, directions, mediation, patching
from probekit.mechanism.components import MEASURED, Patch, check, grid
from probekit.mechanism.defaults import MechanismDefaults
from probekit.mechanism.options import HookOptions
from probekit.mechanism.pairs import (
    PairSet,
    base_span,
    draw_sets,
    effect_sets,
    single_positions,
    span_positions,
)
from probekit.mechanism.plots import head_heatmap, patching_heatmap, position_heatmap
from probekit.mechanism.readouts import PAIRED, Readout, parse_readout
from probekit.mechanism.sites import HEAD_SITE, chosen_layers, d_model, n_heads
from probekit.mechanism.sites import site as find_site
from probekit.reporting.contract import describe_model
from probekit.reporting.headline import format_p

METHODS = attribution.METHODS
Say = Callable[[str], None]
Sweep = Callable[..., pd.DataFrame]
"""An exact sweep: `probekit.mechanism.patching.sweep`'s arguments, its table."""


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
    sets_per_unit: int | None = option(
        None,
        help="sets of pairs patched per unit (event, item), drawn at random with --seed (a set: "
        "one pair, or the four pairs of an interaction) (default: every set)",
        kind=positive_int,
        metavar="N",
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
        help="resamples of the units (events, items) for the intervals (default %(default)s)",
        kind=positive_int,
    )
    prompt_only: bool = option(
        False,
        help="patch prompt positions only (by default a span that runs to the end, such as "
        "from_<span>, also patches every answer position; nnsight patches the prompt only)",
    )
    controls: int = option(
        5,
        help="random directions projected out beside the study's, as controls (default "
        "%(default)s)",
        kind=positive_int,
    )
    skip_direction: bool = option(False, help="patching (and mediation) only")

    @property
    def through_answer(self) -> bool | None:
        """`patching.sweep`'s `through_answer`: False with `prompt_only`, else its default."""
        return False if self.prompt_only else None


@dataclass(frozen=True)
class CaptureOptions(HookOptions):
    """Capture options: which activations are kept."""


def check_patch_options(request: PatchOptions, readout: str | None = None) -> None:
    """One line for patch options that cannot go together, known from the options alone (the
    patch command's check while parsing, before any data or model loads): mediation of
    estimated components, a readout of a pair's two distributions (`readout`, else the
    option's) with attribution or mediation."""
    capture.site_shorts(request.sites)  # every site known
    if request.mediation and request.method == "attribution":
        raise ProbekitError(
            f"{named('mediation')} needs exactly measured components: use {named('method')} "
            "exact or attribution+verify"
        )
    spec = readout or request.readout or ""
    paired = PAIRED in [term.strip() for term in spec.split(" - ")]
    if paired and (request.method != "exact" or request.mediation):
        raise ProbekitError(
            f"the readout {spec} compares a pair's two distributions: use it with "
            f"{named('method')} exact and without {named('mediation')} (attribution needs a "
            "readout linear in one distribution, mediation a readout defined per prompt)"
        )


def check_patch(
    request: PatchOptions,
    items: Sequence[Item],
    answers: Any,
    defaults: MechanismDefaults,
) -> Readout | None:
    """One line for any bad choice that needs no model (naming options with `named`); the
    readout when its spec is fixed (None when the study chooses it from the exact scores)."""
    spec = request.readout or defaults.readout
    check_patch_options(request, spec if isinstance(spec, str) else None)
    if request.spans:
        check_span_names(items, [base_span(s) for s in request.spans])
    return parse_readout(spec, answers) if isinstance(spec, str) else None


def run_patch(
    model: Any,
    study: Any,
    probe: Any,
    encoded: Sequence[EncodedItem],
    request: PatchOptions,
    out: str | Path,
    say: Say = print,
    sweep: Sweep | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """The whole patch analysis of a study's encoded items into `out` (the model's precision
    tier settled already): the files written, and the record of the run (what its manifest
    adds: the readout, the sets patched and how they were chosen, the components). `sweep`
    measures exactly (`patching.sweep` by default)."""
    defaults: MechanismDefaults = study.mechanism_defaults()
    items = [prompt.item for prompt in encoded]
    readout = check_patch(request, items, probe.answers, defaults)
    spans = list(request.spans or defaults.spans or [n for i in items[:1] for n in i.span_names])
    layers = chosen_layers(model, request.layers or None, "patch")
    found = effect_sets(defaults.effect, probe, encoded, study.pairs(probe, encoded))
    sets = draw_sets(found, request.sets_per_unit, request.seed)
    pairs = [pair for s in sets for pair in s.pairs]
    if request.per_position:
        spans = single_positions(spans, pairs)
    patches = components(model, pairs, layers, request.sites, spans, request.heads)
    if request.method == "attribution+verify" and not 1 <= request.top_k <= len(patches):
        raise ProbekitError(
            f"{named('top_k')} must lie between 1 and the number of components "
            f"({len(patches)}), got {request.top_k}"
        )
    scorer = exact_scorer(model, probe.answers, request.batch_size)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    if readout is None:  # the study chooses it from the exact scores
        results = list(scorer.score([e.input_ids for e in encoded]))
        readout = parse_readout(defaults.readout(probe, encoded, results), probe.answers)
        say(f"readout {readout.spec}: the study's default, read from the exact scores")
    unit = study.unit_name
    selection = f"random {request.sets_per_unit} per {unit}, seed {request.seed}"
    selection = "all" if request.sets_per_unit is None else selection
    units = len({s.unit for s in sets})
    say(
        f"{len(patches)} components ({len(layers)} layers) x {len(pairs)} pairs in {len(sets)} "
        f"{defaults.effect.name} sets on {units} {unit}s ({selection})"
    )
    asked = {"method": request.method, "top_k": request.top_k, "hooks": request.hooks}
    asked |= {"batch_size": request.batch_size, "through_answer": request.through_answer}
    df = measure(scorer, sets, patches, readout, **asked, say=say, sweep=sweep)
    df = patching.annotate(df, n=request.bootstrap, seed=request.seed)  # as probekit.patch's
    df.attrs["selection"] = selection
    if weak := df.attrs.get("weak_signal"):
        print(f"probekit: warning: {weak}", file=sys.stderr)
    write_parquet(folder / "patching.parquet", df)
    title = f"{describe_model(model.describe())}, {probe.name}"
    record = {"contrast": defaults.effect.name, "resampled": unit, "selection": selection}
    written = ["patching.parquet", *report(df, folder, request, spans, title, say, record)]
    record |= {"readout": readout.spec, "layers": layers, "spans": spans, "units": units}
    record["components"] = len(patches)
    record["sets"] = [
        {"unit": s.unit, "name": s.name, "pairs": [[a.id, b.id] for a, b in s.pairs]} for s in sets
    ]
    if request.mediation:  # the direct effects of the exactly measured components
        exact = request.method == "exact"
        measured = patches if exact else attribution.top_components(df, request.top_k)
        asked = {"hooks": request.hooks, "batch_size": request.batch_size}
        effects = mediation.mediate(scorer, sets, measured, readout, **asked)
        write_parquet(folder / "mediation.parquet", effects)
        summary = mediation.summarise(effects, n=request.bootstrap, seed=request.seed)
        write_text(folder / "mediation_summary.csv", summary.to_csv(index=False))
        top = min(5, len(summary))
        share = mediation.top_share(effects, top, n=request.bootstrap, seed=request.seed)
        say(
            f"mediation: the top {top} components' indirect effects carry {share['share']:.1%} "
            f"[{share['low']:.1%}, {share['high']:.1%}] of the total effect (interval over units)"
        )
        written += ["mediation.parquet", "mediation_summary.csv"]
    direction = None if request.skip_direction else defaults.direction
    if direction and readout.paired:
        say(f"no direction analysis: it needs a readout of one prompt, and {readout.spec} is not")
    elif direction:
        written += direction_check(
            scorer, study, probe, encoded, direction, readout, folder, request, say
        )
    return written, record


def components(
    model: Any,
    pairs: Sequence[Pair],
    layers: Sequence[int] | None,
    sites: Sequence[str],
    spans: Sequence[str],
    heads: Sequence[int] | None,
) -> list[Patch]:
    """The patches of `grid` at the `layers` chosen (`chosen_layers`) and `heads` (default:
    every head), checked on the pairs before any scoring."""
    layers = chosen_layers(model, layers, "patch")
    patches = grid(layers, sites, spans, heads or range(n_heads(model)))
    check(model, pairs, patches)
    return patches


def exact_scorer(model: Any, answers: Any, batch_size: int | None) -> HookedScorer:
    """The scorer patching reads: exact distributions (the `epsilon` of `probekit patch`)."""
    epsilon = default_of(EpsilonOption, "epsilon", "patch")
    return model.scorer(answers, epsilon=epsilon, batch_size=batch_size)


def measure(
    scorer: HookedScorer,
    pairs: Sequence[PairSet],
    patches: Sequence[Patch],
    readout: Readout,
    *,
    say: Say = print,
    method: str = "exact",
    top_k: int = 20,
    hooks: str = "transformer_lens",
    batch_size: int | None = None,
    sweep: Sweep | None = None,
    **options: Any,
) -> pd.DataFrame:
    """The patching table of `method` (exact: by `sweep`, `patching.sweep` by default, with
    `options`: `through_answer`, `progress`, `distributions`); attribution+verify says how well
    the estimate ranked the verified components. Exact patching shows a progress bar on a
    terminal."""
    if method == "exact":
        run = sweep or patching.sweep
        return run(scorer, pairs, patches, readout, hooks=hooks, batch_size=batch_size, **options)
    if options.get("distributions"):
        raise ProbekitError("distributions=True needs method='exact'")
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
    say: Say,
    record: dict[str, str],
) -> list[str]:
    """patching_summary.csv (with the `record` columns: the contrast, the unit resampled, how
    the sets were chosen, and the p values' adjustment, added to `record`), the heatmaps and
    the top five measured components; the files written."""
    summary = patching.summarise(df, n=request.bootstrap, seed=request.seed)
    record["adjustment"] = summary.attrs["adjustment"]
    summary = summary.assign(**record)
    write_text(out / "patching_summary.csv", summary.to_csv(index=False))
    written = ["patching_summary.csv"]
    attributed = request.method == "attribution"
    value = "estimated_recovery" if attributed else "recovery"
    pairs = df[["clean_prompt_id", "corrupt_prompt_id"]].drop_duplicates().shape[0]
    title = f"{name}, {df['readout'].iloc[0]}: {pairs} pairs, {request.method}"
    names = [find_site(s).name for s in request.sites]
    sites = [s for s in names if s != HEAD_SITE]
    plain = summary[summary["head"].isna()]
    if request.per_position:  # one column per position: a layer x position map per site and span
        position_heatmap(summary, out / "positions.png", value, names, title)
        written.append("positions.png")
    elif sites and plain[value].notna().any():
        patching_heatmap(plain, out / "patching.png", sites, spans, title, value)
        written.append("patching.png")
    heads = summary[summary["head"].notna()]
    if heads[value].notna().any() and not request.per_position:
        head_heatmap(heads, out / "heads.png", value, spans, title)
        written.append("heads.png")
    if line := patching.noise_line(df):
        say(line)
    column = "estimate" if attributed else "effect"
    say(top_components(summary, column, pairs, df["readout"].iloc[0]))
    return written


def top_components(summary: pd.DataFrame, column: str, pairs: int, readout: str) -> str:
    """The five measured components with the largest mean `column` (effect or estimate), each
    with its interval over units and adjusted p, and a line for those left out (known by
    construction, or a weak signal)."""
    measured = summary["status"] == MEASURED
    weak = summary["weak_signal"].astype(bool) if "weak_signal" in summary else False
    ranked = summary[measured & ~weak].dropna(subset=[column])
    what = "attribution estimate" if column == "estimate" else "exact effect"
    lines = [
        f"top {min(5, len(ranked))} of {len(summary)} components (layer, site, span) by mean "
        f"{what} on {readout} over {pairs} pairs (interval over units, Holm-adjusted p):"
    ]
    for row in ranked.head(5).itertuples():
        where = row.site if pd.isna(row.head) else f"{row.site} head {row.head}"
        low, high = getattr(row, f"{column}_low"), getattr(row, f"{column}_high")
        lines.append(
            f"  {row.layer:>3}  {where:<34} {row.span:<17} {row.swapped:<12} "
            f"{getattr(row, column):+.4f} [{low:+.4f}, {high:+.4f}] p {format_p(row.p_adjusted)}"
        )
    left = summary.loc[~measured, "status"].value_counts().to_dict()
    left["weak signal"] = int((measured & weak).sum())
    if parts := [f"{count} {status}" for status, count in left.items() if count]:
        lines.append(f"  left out: {', '.join(parts)} (see status, weak_signal)")
    return "\n".join(lines)


def direction_check(
    scorer: HookedScorer,
    study: Any,
    probe: Any,
    encoded: Sequence[EncodedItem],
    direction: Any,
    readout: Readout,
    out: Path,
    request: PatchOptions,
    say: Say = print,
) -> list[str]:
    """directions.parquet (the fit per layer, leave one unit out) and causal_check.json (the
    statistic before and after projecting the cross-fitted direction out, beside the random
    controls, with intervals over units; not with one unit, said in one line)."""
    states = directions.span_states(
        scorer, encoded, direction.span, readout, direction.contrast(probe), direction.centre
    )
    fit = directions.projection_fit(states, [e.item.unit for e in encoded], direction.centre)
    write_parquet(out / "directions.parquet", fit)
    unit = study.unit_name
    if states.frame["unit"].nunique() < 2:
        say(
            f"no causal check of the direction: it is fitted on {unit}s held out from those it "
            f"ablates, and this run has one {unit}"
        )
        return ["directions.parquet"]
    found = directions.causal_check(
        scorer,
        encoded,
        states,
        readout,
        direction.statistic(probe),
        direction.centre,
        controls=request.controls,
        seed=request.seed,
        n=request.bootstrap,
    )
    result = {"site": directions.SITE.name, "span": direction.span, "readout": readout.spec}
    result |= {"interval": f"95% bootstrap interval over {unit}s", **found}
    result[f"{unit}s"] = states.frame["unit"].nunique()
    write_text(out / "causal_check.json", json.dumps(result, indent=1))
    layers = sorted(set(found["layers"].values()))

    def said(name: str) -> str:
        return f"{found[name]:+.3f} [{found[name + '_low']:+.3f}, {found[name + '_high']:+.3f}]"

    say(
        f"direction at '{direction.span}', cross-fitted over {found['folds']} folds of {unit}s "
        f"(layers chosen on the other folds: {', '.join(map(str, layers))}); projecting it out: "
        f"Δ {said('delta')} -> {said('ablated')}, shrinks by {said('shrink')}; "
        f"{found['controls']} random directions: shrink {said('random_shrink')} (intervals "
        f"over {unit}s)"
    )
    return ["directions.parquet", "causal_check.json"]


def check_capture(request: CaptureOptions, items: Sequence[Item]) -> None:
    """One line for any bad choice that needs no model."""
    capture.site_shorts(request.sites)  # every site known
    if request.spans:
        check_span_names(items, request.spans)


def run_capture(
    model: Any,
    probe: Any,
    encoded: Sequence[EncodedItem],
    request: CaptureOptions,
    out: str | Path,
    say: Say = print,
) -> capture.CaptureResult:
    """Capture a study's encoded items into `out` (resumable) and say where the files are; a
    disk without room for the shards is refused first (`shard_bytes`)."""
    layers = chosen_layers(model, request.layers or None, "capture")
    # about the bytes of the shards: layers x sites x span positions x d_model x the storage
    # dtype's, less those of a capture resumed
    positions = sum(
        len(span_positions(e, name)) for e in encoded for name in (request.spans or e.positions)
    )
    needs = len(layers) * len(request.sites) * positions * d_model(model)
    written = sum(f.stat().st_size for f in Path(out).glob("shards/*"))
    check_room(out, needs * capture.STORAGE_DTYPE.itemsize - written, "the activation shards")
    asked = (request.sites, request.spans, request.hooks, request.batch_size)
    result = capture.capture(model, encoded, out, layers, *asked)
    say(
        f"captured {result.captured} prompts ({result.skipped} already there) of {probe.name} at "
        f"layers {layers}\nshards: {result.out_dir / 'shards'}\nindex:  {result.out_dir / 'index'}"
        " (probekit.mechanism.capture.read_index / read_activations)"
    )
    return result
