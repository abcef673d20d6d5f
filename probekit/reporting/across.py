"""The paper's table and forest plot across runs (models side by side), beside a report's
summary: `headlines.csv` / `.md` / `.tex` and `forest.png` / `forest.csv`.

`headline_table` is one row per run and headline (`Headline`): the model, the run's identifying
fields (`KEYS`, those its manifest has), the headline's label and view, its value with its
interval (`low`, `high`; `interval` says how it was made), `p`, `n`, `unit`, the study's own
columns (`Headline.columns`: for intergroup the raw gap in scale points, d_z, the valid mass,
the exclusion rate, the exact-vs-generate agreement), and the run's precision `tier` (the
dtype where it has none). When the tiers differ within a table it carries `TIER_NOTE` (its
`attrs["tier_note"]`). The forest plot is each run's primary headline with its interval against
the no-bias value: the same panels the page across runs draws (`forest_panels`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from probekit.core.io import write_text
from probekit.reporting.contract import model_label
from probekit.reporting.figures import HeadlinePanel, HeadlineRow, headline_figure, save_figure
from probekit.reporting.headline import Headline, missing
from probekit.reporting.latex import markdown_table, paper_table, write_csv, write_latex


class RunPage(Protocol):
    """What the table reads of a run (`probekit.reporting.html.RunPage`)."""

    folder: Path
    manifest: dict[str, Any]
    headlines: list[Headline]
    study: str
    scale: str


KEYS = ("category", "setting", "prompt", "orders")
"""The manifest fields that tell a study's runs apart (besides the model), those present."""
TIER_NOTE = (
    "The models do not score in one precision tier ({tiers}): in a run of several models each "
    "keeps the first one's tier unless its device does not offer it, and runs made apart choose "
    "their own. For one arithmetic, run them again with --dtype float32 (or one --tolerance)."
)
HIDDEN = ("study", "run", "primary", "interval", "unit")
"""Columns of `headlines.csv` that `headlines.md` and `.tex` leave to the caption or omit."""


def primary_headlines(run: RunPage) -> list[Headline]:
    """The headlines that stand for the run's study (its first one where none is marked)."""
    return [h for h in run.headlines if h.primary] or run.headlines[:1]


def tier(manifest: Mapping[str, Any]) -> str:
    """The precision tier a run scored in (`precision.tier`), else its dtype."""
    precision = manifest.get("precision")
    chosen = precision.get("tier") if isinstance(precision, dict) else None
    return str(chosen or manifest.get("tier") or manifest.get("dtype") or "—")


def headline_table(runs: Sequence[RunPage]) -> pd.DataFrame:
    """The paper's table of `runs`: a row per run and headline (module docstring), with
    `attrs["tier_note"]` where the runs' tiers differ (else "")."""
    rows = []
    for run in runs:
        keys = {k: run.manifest[k] for k in KEYS if k in run.manifest}
        model = model_label(run.manifest.get("model"))
        for h in run.headlines:
            number = {"value": h.value, "low": h.low, "high": h.high, "p": h.p_value, "n": h.n}
            rows.append(
                {"study": run.study, "model": model, **keys, "headline": h.label}
                | {"view": h.view, **number, "unit": h.unit, "interval": h.interval}
                | {**h.columns, "tier": tier(run.manifest), "primary": h.primary}
                | {"run": str(run.folder)}
            )
    table = pd.DataFrame(rows)
    for column in ("value", "low", "high", "p") if rows else ():
        table[column] = pd.to_numeric(table[column])
    table.attrs["tier_note"] = tier_note(table)
    return table


def tier_note(table: pd.DataFrame) -> str:
    """`TIER_NOTE` naming each model's tier where `table` holds more than one tier, else ""."""
    if table.empty or table["tier"].nunique() < 2:
        return ""
    runs = table.drop_duplicates("run")
    tiers = ", ".join(f"{m}: {t}" for m, t in zip(runs["model"], runs["tier"], strict=True))
    return TIER_NOTE.format(tiers=tiers)


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table as `headlines.md` and `.tex` print it: the columns no row fills and `HIDDEN`
    left out."""
    return table.drop(columns=[c for c in HIDDEN if c in table]).dropna(axis=1, how="all")


def headlines_markdown(table: pd.DataFrame) -> str:
    """The table in Markdown: intervals beside values (`paper_table`), how each interval was
    made, then the tier note."""
    if table.empty:
        return "No run has a headline.\n"
    cells = paper_table(shown(table))
    lines = [markdown_table(cells.columns, cells.values), ""]
    if made := intervals(table):
        lines.append(f"Intervals: {made}.")
    note = table.attrs.get("tier_note") or tier_note(table)
    return "\n".join(lines + ([f"\n**{note}**"] if note else [])) + "\n"


def intervals(table: pd.DataFrame) -> str:
    """How the table's intervals were made, each way once."""
    return ", ".join(dict.fromkeys(i for i in table["interval"] if i))


def forest_panels(runs: Sequence[RunPage]) -> list[HeadlinePanel]:
    """Each study's primary headline across `runs` as panels of `headline_figure`: a panel per
    study and headline, a row per model (its folder too where a model ran twice) with the
    interval, and the study's no-bias value."""
    panels: dict[str, list[tuple[RunPage, Headline]]] = {}
    for run in runs:
        for h in primary_headlines(run):
            panels.setdefault(f"{run.study}: {h.key}", []).append((run, h))
    drawn = []
    for title, items in panels.items():
        names = [model_label(run.manifest.get("model")) for run, _ in items]
        if len(set(names)) < len(names):
            names = [f"{n} ({run.folder.name})" for n, (run, _) in zip(names, items, strict=True)]
        rows = [
            HeadlineRow(name, _number(h.value), _number(h.low), _number(h.high))
            for name, (_, h) in zip(names, items, strict=True)
        ]
        first = items[0][1]
        scales = ", ".join(dict.fromkeys(run.scale for run, _ in items))
        unit = f" ({first.unit})" if first.unit else ""
        axis = f"{first.label}{unit}, answers {scales}"
        if first.interval:
            axis += f"\n{first.interval}"
        drawn.append(
            HeadlinePanel(title, axis, rows, _number(first.reference), first.reference_label)
        )
    return drawn if any(r.value is not None for p in drawn for r in p.rows) else []


def write_across(runs: Sequence[RunPage], folder: Path, title: str) -> pd.DataFrame:
    """Write the paper's table of `runs` (one study's) into `folder` as `headlines.csv`, `.md`
    and `.tex` (captioned `title`), and the forest plot as `forest.png` with its numbers in
    `forest.csv`; return the table."""
    table = headline_table(runs)
    if table.empty:
        return table
    write_csv(folder / "headlines.csv", table)
    write_text(folder / "headlines.md", headlines_markdown(table))
    caption = f"{title}: headlines per model"
    if made := intervals(table):
        caption += f"; intervals: {made}"
    if table.attrs["tier_note"]:
        caption += ". " + table.attrs["tier_note"]
    units = sorted({u for u in table["unit"] if not missing(u) and u})
    write_latex(folder / "headlines.tex", shown(table), caption, units)
    if panels := forest_panels(runs):
        rows = [
            {"panel": p.title, "model": r.name, "value": r.value, "low": r.low, "high": r.high}
            | {"reference": p.reference}
            for p in panels
            for r in p.rows
        ]
        save_figure(headline_figure(panels), folder / "forest.png", pd.DataFrame(rows))
    return table


def _number(value: Any) -> float | None:
    return None if missing(value) else float(value)
