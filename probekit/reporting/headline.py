"""What a study tells the HTML report about one run: its headline numbers and its views.

A study's `headlines(table, manifest) -> list[Headline]` and `view_facts(table, run) ->
list[ViewFacts]` (the `StudyReport` contract, `probekit.reporting.contract`) read the summary
rows of one run (as in its `summary.csv`); the page shows them, and the page across runs takes
each study's primary headline as the model's bias profile, drawn against the study's no-bias
value. The formatting helpers are the page's own, so a test can format a `summary.csv` number
exactly as the page prints it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from probekit.core.public import public

if TYPE_CHECKING:
    import pandas as pd

INTERVAL_NOTE = "interval_note"
"""The summary column and manifest field of a run too small for its headline's interval:
`no interval: N < M events` (`probekit.studies.Probe.interval_fields`)."""


def missing(value: Any) -> bool:
    """True for None, NaN and empty strings: a cell the page shows as a dash."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    try:
        return bool(value != value) or value == ""
    except (TypeError, ValueError):
        return False


def format_number(value: Any, digits: int = 3, signed: bool = False) -> str:
    """A number as the page prints it (fixed `digits`, a sign when `signed`), in scientific
    notation where fixed digits would show it as 0 (a valid mass of 2e-07 is not 0.000); a
    dash if missing."""
    if missing(value):
        return "—"
    number, sign = float(value), "+" if signed else ""
    if number != 0 and abs(number) < 0.5 * 10.0**-digits:
        return f"{number:{sign}.1e}"
    return f"{number:{sign}.{digits}f}"


def format_interval(low: Any, high: Any, digits: int = 3, signed: bool = False) -> str:
    """`[low, high]` as the page prints numbers (`format_number`); a dash if either is missing."""
    if missing(low) or missing(high):
        return "—"
    return f"[{format_number(low, digits, signed)}, {format_number(high, digits, signed)}]"


def format_rate(value: Any) -> str:
    """A share as a percentage with one decimal; a dash if missing."""
    return "—" if missing(value) else f"{float(value):.1%}"


def format_p(value: Any, exact: bool = False) -> str:
    """A p-value to four decimals, `=` before it when it is exact (by enumeration)."""
    return "—" if missing(value) else f"{'=' if exact else ''}{float(value):.4f}"


@public()
@dataclass(frozen=True)
class Headline:
    """One headline number of a run, in one shape for every study: what it is (`label`), its
    `view`, `value` in `unit`, its interval (`low`, `high`, made as `interval` says), p-value and
    mark, and what it means (`meaning`, one sentence). `Run.headline` is the run's primary one.

    `primary` marks the one number that stands for the study in a model's bias profile;
    `key` identifies the same quantity across runs (models side by side); `reference` is the
    value that means no bias (0 for a gap; chance for an accuracy), named by `reference_label`,
    and the page across runs marks it; `n` counts the units (events, items) the number rests on,
    so that the pages flag a tiny sample; `context` is what a reader needs beside the number
    (the raw gap in the answer scale, an effect size and test over units, the valid mass
    overall and by group), one line; `columns` the same context as named values, the paper
    table's extra columns across runs (`probekit.reporting.across`; `raw_gap`, `valid_mass`)."""

    label: str
    view: str
    value: float | None
    low: float | None = None
    high: float | None = None
    interval: str = ""  # how the interval was made, e.g. "95% bootstrap CI over events"
    p_value: float | None = None
    p_exact: bool = False
    mark: str = ""
    note: str = ""
    digits: int = 3
    signed: bool = False
    primary: bool = False
    reference: float | None = None
    reference_label: str = ""
    n: int | None = None
    unit: str = ""  # what the value is measured in (z-scores, probability)
    meaning: str = ""  # what the number says, in one sentence
    context: str = ""  # beside the number: raw gap, effect size and test, valid mass
    columns: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __str__(self) -> str:
        """One line: label and view, value, unit, interval, p, mark; then what it means."""
        line = f"{self.key}: {' '.join(self._parts(f' ({self.interval})'))}"
        line += f"; {self.context}" if self.context else ""
        return line + (f". {self.meaning}" if self.meaning else "")

    def _parts(self, how: str = "") -> list[str]:
        """The value, unit, interval (`how` after it), p and mark, those there are."""
        parts = [self.value_text, *([self.unit] if self.unit else [])]
        if self.interval_text != "—":
            parts.append(self.interval_text + how)
        if not missing(self.p_value):
            parts.append(f"p {self.p_text}")
        return parts + ([f"mark {self.mark}"] if self.mark else [])

    @property
    def key(self) -> str:
        return f"{self.label} ({self.view})"

    @property
    def value_text(self) -> str:
        return format_number(self.value, self.digits, self.signed)

    @property
    def interval_text(self) -> str:
        return format_interval(self.low, self.high, self.digits, self.signed)

    @property
    def p_text(self) -> str:
        return format_p(self.p_value, self.p_exact)

    @property
    def cell(self) -> str:
        """Value, unit, interval, p and mark in one table cell (the models-side-by-side
        tables)."""
        return "—" if missing(self.value) else " ".join(self._parts())


class SummaryRow(dict[str, Any]):
    """One summary row (a line of `summary.csv`) as a study's headline reads it: a column the
    row lacks reads as None, so one headline function serves runs with and without it."""

    def __missing__(self, column: str) -> None:
        return None

    def estimate(self, value: str, low: str, high: str, n: str) -> dict[str, Any]:
        """A headline's view, value, interval and count (`Headline.n`: None where missing) from
        the row's `view` and its columns of these names."""
        count = None if missing(self[n]) else int(self[n])
        view, value, low, high = str(self["view"]), self[value], self[low], self[high]
        return {"view": view, "value": value, "low": low, "high": high, "n": count}


def row_headlines(rows: pd.DataFrame, headline: Callable[[SummaryRow], Headline]) -> list[Headline]:
    """The study's `headline` of each summary row, in order: the one way a study builds its
    headlines (`StudyReport.headlines`)."""
    return [headline(SummaryRow(r)) for r in rows.to_dict("records")]


@dataclass(frozen=True)
class ViewFacts:
    """One view of a run (`exact`, `generate`, `explain`): how much of the probability fell
    on the answer set, how often an answer could be read, and how often the views agree."""

    view: str
    description: str
    valid_mass: float | None = None
    answered: float | None = None  # share of responses with a readable answer (generate)
    answered_label: str = "answer read"
    agreement: float | None = None  # exact greedy answer equals the read answer, among those read
    note: str = ""
