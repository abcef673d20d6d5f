"""What every study's report shares: the view being reported (`ReportView`: where its files go,
the model its figures name, its seed), bars with intervals side by side, and per-group cells. A
study's own `report` module holds only what is its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probekit.reporting.contract import figure_model
from probekit.reporting.headline import format_interval, format_number


@dataclass(frozen=True)
class ReportView:
    """One view of scored rows being reported: the run's `folder` and `manifest` (or those of any
    set of the probe's scored rows), the `view`, the `suffix` its files take (`_exact` for the
    exact view of a generate run) and the data the rows read as `Study.describe_data` says it."""

    folder: Path
    manifest: Mapping[str, Any]
    view: str
    suffix: str = ""
    data: str | None = None

    @property
    def model(self) -> str:
        """The model as a figure's title names it (`figure_model`: with the sample data said)."""
        return figure_model(self.manifest, self.data)

    @property
    def seed(self) -> int:
        """The run's seed, which the statistics' resamples take."""
        return int(self.manifest.get("seed", 0))

    def path(self, name: str) -> Path:
        """The file `name` of this view: `heatmap.png` is `heatmap_exact.png` with `_exact`."""
        stem, dot, extension = name.partition(".")
        return self.folder / f"{stem}{self.suffix}{dot}{extension}"


def group_name(key: Any) -> str:
    """A group's name from its key in a groupby: the values of its columns joined by `/`."""
    return "/".join(map(str, key)) if isinstance(key, tuple) else str(key)


def by_group(values: pd.Series) -> str:
    """Per-group numbers in one cell, `group value; ...` (small values in scientific notation,
    `format_number`)."""
    return "; ".join(f"{group_name(k)} {format_number(v)}" for k, v in values.items())


def context_lines(
    records: Sequence[Mapping[str, Any]], keys: Sequence[str], line: Callable[[Any], str]
) -> list[str]:
    """`- <the row's keys>: <its context line>` for each summary row with a context line."""
    return [f"- {', '.join(str(r[k]) for k in keys)}: {line(r)}" for r in records if line(r)]


def with_interval(value: Any, low: Any, high: Any) -> str:
    """A value with its interval, `0.500 [0.300, 0.700]` (`format_number`, `format_interval`)."""
    return f"{format_number(value)} {format_interval(low, high)}"


def side_by_side(ax: Any, series: Sequence[tuple[str, Any, Any, Any]], colour: int = 0) -> list:
    """Bars of several series side by side at x = 0, 1, ... on `ax`, each `(label, values, lows,
    highs)` (lows and highs None for bars without an interval), coloured in turn from the
    palette's `colour`-th; each series' x positions."""
    from probekit.reporting.figures import CATEGORICAL  # matplotlib: only when drawing

    width = 0.8 / len(series)
    positions = []
    for k, (label, values, lows, highs) in enumerate(series):
        values = np.asarray(values, dtype=float)
        x = np.arange(len(values)) + (k - (len(series) - 1) / 2) * width
        errors = None
        if lows is not None:
            errors = np.clip([values - np.asarray(lows), np.asarray(highs) - values], 0, None)
        shade = CATEGORICAL[(k + colour) % len(CATEGORICAL)]
        ax.bar(x, values, width, label=label, yerr=errors, capsize=2, color=shade)
        positions.append(x)
    return positions
