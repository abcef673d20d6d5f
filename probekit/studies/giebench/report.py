"""What a researcher reads after a GIEBench run: tables (csv and Markdown) and two figures,
accuracy per category x prompt type with intervals, and the Raw->ID / Raw->COT shifts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import probekit.studies.giebench.metrics as metrics
from probekit.core.choices import position_bias
from probekit.core.io import write_text
from probekit.reporting import Headline, RunFacts, ViewFacts
from probekit.reporting.figures import new_figure, save_figure
from probekit.reporting.headline import SummaryRow, format_number, missing, row_headlines
from probekit.reporting.latex import markdown_table, write_csv
from probekit.studies.giebench.judge import OPTIONS
from probekit.studies.report import ReportView, context_lines, side_by_side, with_interval

DETAILS = "details.md"
SUMMARY_COLUMNS = ["model", "view", "orders", "prompt_type", "n_items", "accuracy"]
_ACCURACY = {
    False: "the mean exact probability of the correct letter",
    True: "the share of generated verdicts that are right",
}
VIEW_TEXT = {
    "exact": "exact P(A-D) after the prefilled `[[`",
    "explain": "exact P(A-D) read after the model's greedy explanation",
    "generate": "greedy text, GIEBench's regular expression",
}


CAPTIONS = {
    "accuracy.png": "Accuracy (mean exact P(correct letter), or the share right in "
    "generate) per category and prompt type with 95 % bootstrap intervals over items, in "
    "the items' own answer order (and, with --orders above 1, a second panel averaged "
    "over the cyclic orders); dotted line: chance (0.25).",
    "shifts.png": "Change of accuracy from the raw prompt to id and to cot on the same "
    "items, own order; labels: items that flipped wrong->right / right->wrong.",
}
"""Each figure's caption on the report pages (`Study.captions`), by file name."""


def report_view(scores: pd.DataFrame, out: ReportView) -> list[dict[str, Any]]:
    """Tables, figures and the Markdown details (`details.md`) of one run; returns the summary
    rows (overall accuracy per order view and prompt type). The figures are titled with the
    view's model; the data as `describe_data` says it heads the tables' first column."""
    folder, view, seed = out.folder, out.view, out.seed
    frame = metrics.scored(scores, view)
    tables = {
        "accuracy": metrics.accuracy(frame, seed),
        "shifts": metrics.shifts(frame),
        "mismatch": metrics.mismatch(frame),
    }
    shown = {
        name: table.assign(data=out.data)[["data", *table.columns]]
        for name, table in tables.items()
    }
    accuracy_figure(shown.pop("accuracy"), folder / "accuracy.png", f"{out.model}, view {view}")
    if not tables["shifts"].empty:  # each figure's table beside it (`accuracy.csv`, ...)
        shift_figure(shown.pop("shifts"), folder / "shifts.png", f"{out.model}, view {view}")
    for name, table in shown.items():
        write_csv(folder / f"{name}.csv", table)
    overall = tables["accuracy"][tables["accuracy"]["category"] == metrics.OVERALL]
    write_text(folder / DETAILS, section(frame, tables, view))
    return [
        {"model": out.manifest["model"], "view": view, **r}
        | metrics.identity_context(frame, r["prompt_type"], r["orders"], seed)
        | {"run": str(folder)}
        for r in overall.drop(columns="category").to_dict("records")
    ]


def section(frame: pd.DataFrame, tables: dict[str, pd.DataFrame], view: str) -> str:
    """The Markdown of one run: accuracy per category, shifts, mismatch, letters and bias."""
    acc = tables["accuracy"]
    acc = acc.assign(cell=_with_interval(acc), column=acc["orders"] + ", " + acc["prompt_type"])
    wide = acc.pivot(index="category", columns="column", values="cell")
    order = [*sorted(c for c in wide.index if c != metrics.OVERALL), metrics.OVERALL]
    wide = wide.reindex(index=order, columns=list(dict.fromkeys(acc["column"]))).reset_index()
    parts = [f"## {view}: accuracy per category (95% CI over items)", "", _markdown(wide), ""]
    for name, heading in SECTIONS.items():
        if not (table := tables[name]).empty:
            shown = table.assign(**{c: table[c].map(f.format) for c, f in FORMATS.items()})
            parts += [f"## {view}: {heading}", "", _markdown(shown), ""]
    single = metrics.single_identity_categories(frame)
    if single:
        parts += [f"No mismatch for {', '.join(single)}: a single identity in the items.", ""]
    own = frame[(frame["order"] == 0) & ~frame["mismatch"]].drop_duplicates("item_id")
    letters = own["correct"].value_counts(normalize=True)  # the items' correct letters
    shares = ", ".join(f"{x} {letters.get(x, 0.0):.0%}" for x in OPTIONS)
    parts.append(f"Correct letter in the items' own order: {shares}.")
    if view != "generate":
        bias = position_bias(frame, len(OPTIONS))  # the model's mean P(letter)
        bias = ", ".join(f"{x} {bias[x]:.3f}" for x in OPTIONS)
        parts.append(f"Position bias, mean P(letter) over all prompts: {bias}.")
    if "cue_missing" in frame:
        parts.append(
            f"Explanations that never reached `[[` (given it, flagged): "
            f"{frame['cue_missing'].mean():.1%}."
        )
    if "parsed" in frame and view == "generate":
        parts.append(
            f"Responses without a `[[X]]` verdict (counted wrong): "
            f"{(frame['parsed'] == '').mean():.1%}."
        )
    return "\n".join(parts) + "\n"


FORMATS = {"before": "{:.3f}", "after": "{:.3f}", "delta": "{:+.3f}"}
SECTIONS = {
    "shifts": "shifts on the same items (own order; +: wrong->right, -: right->wrong)",
    "mismatch": "identity mismatch (own order; the identity replaced by the next one of its "
    "category)",
}


def _with_interval(table: pd.DataFrame) -> list[str]:
    """Each row's accuracy with its interval, `0.500 [0.300, 0.700]`."""
    return [with_interval(*cells) for cells in table[["accuracy", "ci_low", "ci_high"]].to_numpy()]


def summary_markdown(frame: pd.DataFrame) -> str:
    """`summary.md`: overall accuracy per model, view, order view and prompt type, followed by
    each run's details."""
    shown = frame.assign(accuracy=_with_interval(frame))
    keys = ("model", "view", "orders", "prompt_type")
    contexts = context_lines(frame.to_dict("records"), keys, context_line)
    head = [
        "# GIEBench: overall accuracy (pooled over items; 95% CI over items)",
        "",
        _markdown(shown[SUMMARY_COLUMNS]),
        *contexts,
        *(["", CONTEXT_LEGEND, ""] if contexts else []),
    ]
    for run in dict.fromkeys(frame["run"]):  # each run's details (one per model)
        details = Path(run) / DETAILS
        if details.is_file():
            head.append(details.read_text(encoding="utf-8"))
    return "\n".join(head)


CONTEXT_LEGEND = (
    "Context: the accuracy's change from the raw prompt (no identity) on the same items, in "
    "percentage points; d_z, its effect size over items, and p, the two-sided sign-flip test "
    "over items; the mean valid mass of the prompts, overall and by identity category."
)


def context_line(r: dict[str, Any]) -> str:
    """What a reader needs beside an accuracy, in one line (`Headline.context`): its change from
    the raw prompt on the same items in percentage points with d_z and the sign-flip p over
    items, the valid mass overall and by identity category; empty without them."""
    if missing(r.get("mean_valid_mass")):
        return ""
    mass = f"valid mass {format_number(r['mean_valid_mass'])} ({r['valid_mass_by_group']})"
    if missing(r.get("change_from_raw")):
        return mass
    return (
        f"{format_number(100 * r['change_from_raw'], 1, True)} percentage points from the raw "
        f"prompt on the same items (d_z {format_number(r['d_z'], 2, True)}, sign-flip p "
        f"{format_number(r['p_items'], 4)} over items); {mass}"
    )


def accuracy_figure(acc: pd.DataFrame, path: Path, view: str) -> Path:
    """Bars of accuracy per category (and overall), one per prompt type, with the 95 % CI and
    the number of items in the title; one panel per order view (own order, averaged)."""
    views = list(dict.fromkeys(acc["orders"]))
    fig = new_figure(10, 3.2 * len(views))
    axes = fig.subplots(len(views), 1, squeeze=False)[:, 0]
    for ax, orders in zip(axes, views, strict=True):
        part = acc[acc["orders"] == orders]
        categories = list(dict.fromkeys(part["category"]))
        series = []
        for prompt_type in dict.fromkeys(part["prompt_type"]):
            rows = part[part["prompt_type"] == prompt_type].set_index("category")
            rows = rows.reindex(categories)
            series.append((prompt_type, rows["accuracy"], rows["ci_low"], rows["ci_high"]))
        side_by_side(ax, series)
        ax.axhline(0.25, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
        ax.set_ylim(0, 1)
        ax.set_ylabel("accuracy")
        n_items = int(part.loc[part["category"] == metrics.OVERALL, "n_items"].max())
        ax.set_title(f"GIEBench: {view}, {orders}, N = {n_items} items (dotted: chance)")
        ax.legend(fontsize=8)
    return save_figure(fig, path, acc)


def shift_figure(shifts: pd.DataFrame, path: Path, view: str) -> Path:
    """Change of accuracy from raw to id and to cot per category, each bar labelled +plus/-minus
    (the items that flipped)."""
    categories = list(dict.fromkeys(shifts["category"]))
    fig = new_figure(10, 3.4)
    ax = fig.subplots()
    by_shift = [
        (name, rows.set_index("category").reindex(categories))
        for name, rows in shifts.groupby("shift", sort=False)
    ]
    positions = side_by_side(ax, [(name, r["delta"], None, None) for name, r in by_shift], 1)
    for x, (_, rows) in zip(positions, by_shift, strict=True):
        flips = rows[["delta", "flips_plus", "flips_minus"]].to_numpy()
        for xi, (d, plus, minus) in zip(x, flips, strict=True):
            if np.isfinite(d):
                above = "bottom" if d >= 0 else "top"
                ax.text(xi, d, f"+{int(plus)}/-{int(minus)}", ha="center", fontsize=6, va=above)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    ax.set_ylabel("change of accuracy")
    ax.set_title(
        f"GIEBench: {view}, shifts on the same items, own order "
        "(labels: +wrong->right / -right->wrong)"
    )
    ax.legend(fontsize=8)
    return save_figure(fig, path, shifts)


def _markdown(frame: pd.DataFrame) -> str:
    """`frame` as a Markdown table, empty cells for missing values."""
    return markdown_table(frame.columns, frame.astype(object).fillna("").to_numpy())


def headlines(rows: pd.DataFrame, manifest: dict[str, Any] | None = None) -> list[Headline]:
    """Overall accuracy per order view and prompt type with its interval, against chance (0.25);
    the identity prompt's (`id`), averaged over orders where the run has several, stands for the
    study."""
    orders = metrics.AVERAGED if metrics.AVERAGED in set(rows["orders"]) else metrics.OWN

    def headline(r: SummaryRow) -> Headline:
        return Headline(
            label=f"accuracy, {r['prompt_type']} prompt ({r['orders']})",
            **r.estimate("accuracy", "ci_low", "ci_high", n="n_items"),
            interval="95% bootstrap CI over items",
            note=f"{int(r['n_items'])} items; chance 0.25",
            primary=r["prompt_type"] == "id" and r["orders"] == orders,
            reference=1 / len(OPTIONS),
            reference_label="chance (0.25)",
            unit="share of items" if r["view"] == "generate" else "probability",
            meaning=f"How often the judge picks the answer that fits the user's identity with "
            f"the {r['prompt_type']} prompt ({_ACCURACY[r['view'] == 'generate']}); 0.25 is "
            "chance among four answers.",
            context=context_line(r),
            columns={"valid_mass": r["mean_valid_mass"]}
            | {name: r[name] for name in ("change_from_raw", "d_z", "p_items")},
        )

    return row_headlines(rows, headline)


def view_facts(rows: pd.DataFrame, run: RunFacts) -> list[ViewFacts]:
    """The run's view with the mean valid mass on its answers (from `scores.parquet`), the share
    of explanations that reached `[[` (explain) or of responses with a verdict (generate)."""
    view = str(rows["view"].iloc[0])
    scores = pd.read_parquet(run.folder / "scores.parquet")
    answered, label = None, "answer read"
    if view == "explain" and "cue_missing" in scores:
        answered, label = 1 - float(scores["cue_missing"].mean()), "explanations reaching `[[`"
    if view == "generate" and "parsed" in scores:
        answered, label = float((scores["parsed"] != "").mean()), "with a [[X]] verdict"
    mass = float(scores["valid_mass"].mean()) if "valid_mass" in scores else None
    described = f"{VIEW_TEXT.get(view, view)}; answers {run.scale}"
    return [ViewFacts(view, described, mass, answered, label)]
