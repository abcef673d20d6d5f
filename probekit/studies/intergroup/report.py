"""What a researcher reads after a run: summary rows, the heatmap, the nationality embedding, the
paper's tables, and what the report pages show (headlines against a gap of 0, the views, each
scale labelled from the run's own answer set)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd

import probekit.studies.intergroup.metrics as metrics
from probekit.core.errors import ProbekitError
from probekit.core.io import atomic_write
from probekit.reporting import Headline, RunFacts, ViewFacts
from probekit.reporting import figures as plots
from probekit.reporting.contract import model_label
from probekit.reporting.headline import (
    SummaryRow,
    format_number,
    format_rate,
    missing,
    row_headlines,
)
from probekit.reporting.latex import markdown_table
from probekit.studies.intergroup.probe import Category, get_category, get_setting
from probekit.studies.report import ReportView

AUTHORS_TSNE_SEED = 42  # the random_state of the authors' t-SNE of nationality perceivers
VIEWS = {
    "exact": "exact expected intensity ({scale}) from the logits",
    "generate": "greedy generation + the authors' parse rule ({scale})",
}
DELTA_UNIT = "z-scores"
DELTA_MEANING = (
    "Δ is the mean z-scored intensity of in-group pairs (perceiver and experiencer of one "
    "identity) minus that of out-group pairs, in standard deviations of the perceiver × "
    "experiencer matrix: above 0, the model rates an emotion as more intense when the persona "
    "shares the identity of the person who felt it."
)


CAPTIONS = {
    "heatmap.png": "Z-normalised mean intensity, perceiver (row) x experiencer (column), "
    "as the paper's heatmaps (its YlGnBu map); black lines set off `a person`; crimson "
    "outlines: the in-group cells Δ averages (perceiver and experiencer of one label: "
    "the diagonal, or ethnicity's blocks); white cells: hidden by the paper's rule (a "
    "paired t-test against the row's and the column's diagonal cell, Bonferroni α / k², "
    "not both significant), not missing data.",
    "embedding.png": "t-SNE of the perceivers' rows of the named-only Z, as the authors' "
    "tsne.py (perplexity 5, random_state 42), coloured by cultural region.",
}
"""Each figure's caption on the report pages (`Study.captions`), by file name."""


def report_view(scores: pd.DataFrame, out: ReportView) -> list[dict[str, Any]]:
    """Statistics of one view (the exact `expected` or the generated `parsed`) and its figures
    (`heatmap.png`, `embedding.png` for nationality, `Z.npy`): one summary row."""
    manifest, mode = out.manifest, out.view
    category = get_category(manifest["category"])
    row = {"model": manifest["model"], "category": category.name, "setting": manifest["setting"]}
    row |= {"view": mode, "mean_valid_mass": float(scores["valid_mass"].mean())}
    if "parsed" in scores:
        answered = scores[scores["parsed"] >= 0]
        agree = (answered["greedy"] == answered["parsed"].astype(str)).mean()
        row["answered_rate"] = len(answered) / len(scores)
        row["ev_generate_agreement"] = float(agree) if len(answered) else float("nan")
    row["refusal_rate"] = 1 - row["answered_rate" if mode == "generate" else "mean_valid_mass"]
    groups, labels = category.identities, category.labels
    min_mass = manifest.get("min_valid_mass", metrics.DEFAULT_MIN_VALID_MASS)
    try:
        summary = metrics.summarize(scores, groups, labels, mode, out.seed, min_valid_mass=min_mass)
    except ProbekitError as exc:  # e.g. every event excluded
        named = metrics.exclude_events(scores, category.named, mode, min_mass)
        everyone = metrics.exclude_events(scores, groups, mode, min_mass)
        row |= {"n_events": scores["event_id"].nunique(), "n_kept": len(named.kept)}
        row |= {"exclusion_rate": named.rate, "heatmap_exclusion_rate": everyone.rate}
        return [{**row, "note": str(exc)}]
    row.update(summary.to_dict())
    plots.heatmap(
        summary.Z,
        groups,
        mask=summary.shown,
        blocks=in_group_blocks(category),
        title=f"{category.name} — Z of mean intensity\n{out.model}, view {mode}, "
        f"N = {summary.heatmap_n_kept} events",
        separators=(1,),
        path=out.path("heatmap.png"),
        mask_label="hidden, not significant (paired t-tests vs the diagonal, Bonferroni α/k²)",
        block_label="in-group cells (perceiver and experiencer of one label), those Δ averages",
    )
    if category.regions:  # as the authors' tsne.py: rows of the named-only Z, perplexity 5
        names = [i.removeprefix("a person from ").removeprefix("the ") for i in category.named]
        regions = [category.regions[i] for i in category.named]
        title = "perceivers by their row of the named-only Z (t-SNE, perplexity 5, random_state "
        path, title = out.path("embedding.png"), title + "42, as the authors)"
        plots.embedding_plot(
            summary.gap_Z, names, regions, path, AUTHORS_TSNE_SEED, title=title, perplexity=5
        )
    buffer = io.BytesIO()
    np.save(buffer, summary.Z)
    atomic_write(out.path("Z.npy"), lambda tmp: tmp.write_bytes(buffer.getvalue()))
    return [row]


def in_group_blocks(category: Category) -> list[tuple[int, int]]:
    """The heatmap's in-group blocks: the ranges of named identities of one label (a single
    cell of the diagonal where each identity is its own group); `a person` has none."""
    return [(start, stop) for start, stop in category.blocks if start > 0]


PAPER_TABLES = {
    "gap": f"Δ in {DELTA_UNIT} [null 2.5–97.5%] p (one-sided)",
    "refusal": "refusal rate as the paper's Table 6: events with a failed answer for any pair "
    "of all groups (exact view: a valid mass below --min-valid-mass)",
    "no_answer": "refusal rate of the run's answers: 1 − mean valid mass (exact), responses "
    "without a number (generate)",
    "intensity": "mean ± std of M",
    "z_range": "(min, max) of Z",
}


def paper_tables(frame: pd.DataFrame) -> pd.DataFrame:
    """The paper's tables in long form: one row per (table, category, setting, view, model) with
    the cell text as the paper prints it; `paper_tables_markdown` puts the models side by side."""
    cells = []
    for r in frame.to_dict("records"):
        key = {k: r.get(k) for k in ("category", "setting", "view")}
        key["model"] = model_label(r.get("model"), r.get("data"))
        gap = pd.notna(r.get("delta", np.nan))
        values = {
            "gap": f"{r['delta']:+.3f} {_null(r)} {_p(r)}" if gap else "—",
            "refusal": format_rate(r.get("heatmap_exclusion_rate")),
            "no_answer": format_rate(r.get("refusal_rate")),
            "intensity": f"{r['mean']:.2f} ± {r['std']:.2f}" if gap else "—",
            "z_range": f"({r['z_min']:.2f}, {r['z_max']:.2f})" if gap else "—",
        }
        cells += [{"table": name, **key, "value": values[name]} for name in PAPER_TABLES]
    return pd.DataFrame(cells, columns=["table", "category", "setting", "view", "model", "value"])


def paper_tables_markdown(tables: pd.DataFrame) -> str:
    """One Markdown table per paper table: rows (category, setting, view), a column per model
    (`(sample data)` after a model that read probekit's sample)."""
    parts = []
    for name, title in PAPER_TABLES.items():
        part = tables[tables["table"] == name]
        if part.empty:
            continue
        index = ["category", "setting", "view"]
        wide = part.pivot_table(
            index=index, columns="model", values="value", aggfunc="first", sort=False
        )
        rows = [[*key, *("—" if pd.isna(v) else v for v in row)] for key, row in wide.iterrows()]
        parts.append(f"### {title}\n\n" + markdown_table([*index, *wide.columns], rows))
    return "\n\n".join(parts) + "\n"


SUMMARY_HEADER = (
    f"model | category | setting | view | Δ ({DELTA_UNIT}) | 95% CI of Δ (bootstrap) | null "
    "2.5–97.5% | p (one-sided) | raw gap (points) [95% CI] | d_z | p over events (sign-flip) | "
    "valid mass (in-group / out-group) | events for 80% power | refusal rate | events failed "
    "(all groups; the paper's refusal rate) | excluded for Δ (named) | events kept | mean ± std | "
    "(min, max) of Z"
).split(" | ")
SUMMARY_LEGEND = (
    f"Δ: the mean z-scored intensity of in-group minus out-group pairs, in {DELTA_UNIT} "
    "(standard deviations of the perceiver × experiencer matrix of mean intensities). "
    "Refusal rate: the share of the run's answers that are not on the scale, 1 − the mean "
    "valid mass in the exact view (the probability of answering with anything but a number), "
    "the responses without a parseable number in the generate view. Events failed: the "
    "paper's refusal rate (its Table 6), the share of events with a failed answer for any "
    "pair of all groups, `a person` included; in the exact view a failed answer is a valid "
    "mass below --min-valid-mass, so it can be 0 while the refusal rate is high. Excluded "
    "for Δ: the same over the named groups only, the events Δ is computed without. p: exact "
    "when marked =. Events for 80% power: the smallest number of events at which 80% of "
    "bootstrap resamples of this run's kept events give a significant Δ (outside the null "
    f"interval); not computed below {metrics.MIN_POWER_EVENTS} kept events, where resamples "
    "of a smoke-size sample say nothing about a study's size. Raw gap: the same in-group "
    "minus out-group difference before z-scoring, in points of the answer scale, with its "
    "bootstrap 95% CI over events; d_z: its mean over events over their standard deviation "
    "(an effect size, not a test); p over events: the two-sided sign-flip test of the "
    "events' gaps; valid mass: the mean over the in-group and the out-group prompts of the "
    "kept events (a difference means the two sides' expected values rest on different "
    "shares of the model's output)."
)


def summary_markdown(frame: pd.DataFrame) -> str:
    """The summary table: Δ in z-scores with its bootstrap 95 % CI over events, the permutation
    null interval (2.5–97.5 %; Δ outside it is the paper's significance), the one-sided p (exact
    when marked =, else sampled with the +1 correction), the events Δ needs for 80 % power (not
    computed on a smoke-size sample), the refusal rate of the run's own answers, the paper's
    per-event refusal rate, exclusion, mean ± std of M, (min, max) of Z."""
    rows, notes = [], []
    for r in frame.to_dict("records"):
        where = f"- {r['category']}/{r['setting']} ({r['view']}):"
        if isinstance(r.get("note"), str):
            notes.append(f"{where} {r['note']}")
        if r["view"] == "generate" and pd.notna(r.get("answered_rate", np.nan)):
            agreement = r["ev_generate_agreement"]
            agrees = "— (none parsed)" if pd.isna(agreement) else f"{agreement:.1%}"
            notes.append(
                f"{where} a parseable number in {r['answered_rate']:.1%} of the responses; the "
                f"exact greedy answer (`greedy`) equals it in {agrees} of those; mean valid mass "
                f"{r['mean_valid_mass']:.3f}"
            )
        run = [model_label(r.get("model"), r.get("data")), r["category"], r["setting"], r["view"]]
        rates = [format_rate(r.get("refusal_rate")), format_rate(r.get("heatmap_exclusion_rate"))]
        rates += [f"{r['exclusion_rate']:.1%}", f"{r['n_kept']}/{r['n_events']}"]
        if pd.isna(r.get("delta", np.nan)):
            rows.append([*run, *["—"] * 9, *rates, "—", "—"])
            continue
        masses = " / ".join(format_number(r.get(f"valid_mass_{g}_group")) for g in ("in", "out"))
        low, high = (format_number(r.get(f"delta_ci_{k}"), 3, True) for k in ("low", "high"))
        delta = [f"{r['delta']:+.3f}", "—" if low == "—" else f"[{low}, {high}]"]
        context = [_raw_gap(r), format_number(r.get("d_z"), 2, True)]
        context += [format_number(r.get("p_events"), 4), masses, r.get("power", "—")]
        spread = [f"{r['mean']:.2f} ± {r['std']:.2f}", f"({r['z_min']:.2f}, {r['z_max']:.2f})"]
        rows.append([*run, *delta, _null(r), _p(r), *context, *rates, *spread])
    lines = [markdown_table(SUMMARY_HEADER, rows), ""] + notes + ([""] if notes else [])
    return "\n".join([*lines, SUMMARY_LEGEND]) + "\n"


def _null(r: dict[str, Any]) -> str:
    """Δ's permutation null interval (2.5–97.5 %)."""
    return f"[{r['null_low']:+.3f}, {r['null_high']:+.3f}]"


def _p(r: dict[str, Any]) -> str:
    return f"{'=' if r.get('p_exact') else ''}{r['p_value']:.4f}"


def _raw_gap(r: dict[str, Any]) -> str:
    """The raw gap in the scale's points with its interval (none when it has none)."""
    low, high = (format_number(r.get(k), 2, True) for k in ("raw_gap_ci_low", "raw_gap_ci_high"))
    interval = "" if low == "—" else f" [{low}, {high}]"
    return f"{format_number(r.get('raw_gap'), 2, True)}{interval}"


def context_line(r: dict[str, Any]) -> str:
    """What a reader needs beside Δ, in one line (`Headline.context`): the raw gap in the
    answer scale's points, d_z and the sign-flip p over events, the valid mass overall and by
    group; empty without them."""
    if missing(r.get("raw_gap")):
        return ""
    scale = f"0–{get_setting(r['setting']).scale_max}" if r.get("setting") else "the scale"
    return (
        f"raw gap {_raw_gap(r)} points on {scale}; d_z {format_number(r.get('d_z'), 2, True)}, "
        f"sign-flip p {format_number(r.get('p_events'), 4)} over {r.get('n_kept')} events "
        f"(two-sided); valid mass {format_number(r.get('mean_valid_mass'))} (in-group "
        f"{format_number(r.get('valid_mass_in_group'))}, out-group "
        f"{format_number(r.get('valid_mass_out_group'))})"
    )


PAPER_COLUMNS = {
    "raw_gap": "raw_gap",
    "raw_gap_low": "raw_gap_ci_low",
    "raw_gap_high": "raw_gap_ci_high",
    "d_z": "d_z",
    "p_events": "p_events",
    "valid_mass": "mean_valid_mass",
    "exclusion_rate": "exclusion_rate",
    "agreement": "ev_generate_agreement",
}
"""The paper table's columns beside Δ (`Headline.columns`) and the summary columns they hold:
the raw gap in scale points with its CI, d_z and the sign-flip p over events, the valid mass,
the events excluded for Δ, the exact greedy answer's agreement with the generated one."""


def headlines(rows: pd.DataFrame, manifest: dict[str, Any] | None = None) -> list[Headline]:
    """Δ per (category, setting, view) with its bootstrap CI and one-sided p, against a gap of 0,
    with the paper table's columns (`PAPER_COLUMNS`); the note says whether Δ lies outside the
    permutation null interval (the paper's significance)."""

    def headline(r: SummaryRow) -> Headline:
        if missing(r["delta"]):
            note = "no Δ" if missing(r["note"]) else str(r["note"])
        else:
            where = "outside" if bool(r["significant"]) else "inside"
            note = f"{where} the null interval {_null(r)} (the paper's criterion); events kept "
            note += f"{r['n_kept']}/{r['n_events']}"
        return Headline(
            label=f"Δ, empathy gap ({r['category']}, {r['setting']})",
            **r.estimate("delta", "delta_ci_low", "delta_ci_high", n="n_kept"),
            interval="95% bootstrap CI over events",
            p_value=r["p_value"],
            p_exact=bool(r["p_exact"]) and not missing(r["p_exact"]),
            note=note,
            signed=True,
            primary=r["view"] == "exact",
            reference=0.0,
            reference_label="no gap (Δ = 0)",
            unit=DELTA_UNIT,
            meaning=DELTA_MEANING,
            context=context_line(r),
            columns={name: r[column] for name, column in PAPER_COLUMNS.items()},
        )

    return row_headlines(rows, headline)


def view_facts(rows: pd.DataFrame, run: RunFacts) -> list[ViewFacts]:
    """Per view: the mean valid mass of the exact scores; generate: the share of responses with
    a parseable number and the agreement of the exact greedy answer with it. The intensity scale
    is the run's own answer set (0–10 in P0S1T0)."""
    facts = []
    for r in rows.to_dict("records"):
        view, generate = str(r.get("view")), r.get("view") == "generate"
        answered = r.get("answered_rate") if generate else None
        agreement = r.get("ev_generate_agreement") if generate else None
        described = VIEWS.get(view, view).format(scale=run.scale)
        note = f"events kept for Δ: {r.get('n_kept')}/{r.get('n_events')}"
        mass, label = r.get("mean_valid_mass"), "hold a parseable number"
        facts.append(ViewFacts(view, described, mass, answered, label, agreement, note))
    return facts
