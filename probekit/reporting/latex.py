"""A summary table as a paper prints it (`summary.tex` beside `summary.csv`): a booktabs table
(`\\toprule`, `\\midrule`, `\\bottomrule`; `\\usepackage{booktabs}` in the paper) with each
interval beside its value (`0.120 [0.050, 0.190]`), p-values as `< 0.001` or three decimals, and
the unit and the view in the caption. Written here rather than by pandas' Styler, which needs
jinja2 and formats no intervals. The table's other forms are here too: CSV and Markdown."""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probekit.reporting.headline import format_number, missing

SPECIAL = re.compile(r"[\\&%$#_{}~^<>Δ]")
ESCAPES = {
    "\\": r"\textbackslash{}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": "$<$",
    ">": "$>$",
    "Δ": "$\\Delta$",
}


def escape(text: Any) -> str:
    """`text` with LaTeX's special characters escaped; a dash for a missing cell."""
    if missing(text):
        return "--"
    return SPECIAL.sub(lambda m: ESCAPES.get(m.group(), "\\" + m.group()), str(text))


def cell(value: Any, p: bool = False) -> str:
    """A number to three decimals (`format_number`), a p-value (`p`) as a paper writes it
    (`< 0.001`, else three decimals), a count or anything else as it is."""
    if missing(value):
        return "--"
    if isinstance(value, bool | np.bool_ | numbers.Integral) or not isinstance(value, numbers.Real):
        return str(value)
    return "< 0.001" if p and value < 0.001 else format_number(value)


def intervals(columns: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Each interval's (low, high) columns by the column it goes beside: `X_ci_low`/`X_low` go
    beside `X`, a bare `low`/`ci_low` beside the column before it, and one with no such column
    stands alone under its name (`null` for `null_low`)."""
    found = {}
    for at, low in enumerate(columns):
        if not (low == "low" or low.endswith("_low")):
            continue
        high = low[: -len("low")] + "high"
        if high not in columns:
            continue
        base = re.sub(r"_?(ci_?)?low$", "", low)
        if not base and at > 0:
            base = columns[at - 1]
        found[base or "interval"] = (low, high)
    return found


def paper_table(table: pd.DataFrame) -> pd.DataFrame:
    """`table` as text cells: intervals beside their values, p-values as a paper writes them."""
    columns = [str(c) for c in table.columns]
    pairs = intervals(columns)
    inside = {c for pair in pairs.values() for c in pair}
    out: dict[str, list[str]] = {}
    for column in columns:
        if column in inside:
            continue
        values = table[column].tolist()
        p = column == "p" or column.startswith("p_")  # p, p_value, p_adjusted, p_events
        out[column] = [cell(v, p) for v in values]
        if column in pairs:
            out[column] = [with_interval(v, table, pairs[column], i) for i, v in enumerate(values)]
    for base, pair in pairs.items():
        if base not in out:
            out[base] = [with_interval(None, table, pair, i) for i in range(len(table))]
    return pd.DataFrame(out, columns=list(out))


def with_interval(value: Any, table: pd.DataFrame, pair: tuple[str, str], row: int) -> str:
    """`value [low, high]` of one row (the interval alone when `value` is None)."""
    low, high = (table[c].iloc[row] for c in pair)
    bounds = "--" if missing(low) or missing(high) else f"[{cell(low)}, {cell(high)}]"
    if value is None or (missing(value) and bounds == "--"):
        return bounds
    return f"{cell(value)} {bounds}"


def latex_table(table: pd.DataFrame, caption: str) -> str:
    """`table` (`paper_table`) as a LaTeX table with booktabs rules and `caption`: one row per
    row of `table`."""
    cells = paper_table(table)
    numeric = [c not in table or pd.api.types.is_numeric_dtype(table[c]) for c in cells.columns]
    align = "".join("r" if right else "l" for right in numeric)  # numbers and intervals right
    lines = [
        "\\begin{table}[ht]",
        "\\centering",
        f"\\caption{{{escape(caption)}}}",
        f"\\begin{{tabular}}{{{align}}}",
        "\\toprule",
        " & ".join(escape(c) for c in cells.columns) + " \\\\",
        "\\midrule",
        *(" & ".join(escape(v) for v in row) + " \\\\" for row in cells.itertuples(index=False)),
        "\\bottomrule",
        "\\end{tabular}",
        "\\end{table}",
    ]
    return "\n".join(lines) + "\n"


def write_latex(path: Path, table: pd.DataFrame, title: str, units: Sequence[str]) -> None:
    """Write `table` to `path` as `latex_table`, captioned with its `title`, the unit of its
    headlines (`units`) and the view(s) its rows come from."""
    from probekit.core.io import write_text

    views = sorted({str(v) for v in table["view"]}) if "view" in table else []
    said = {"unit": ", ".join(units), "view": ", ".join(views)}
    parts = [title, *(f"{name}: {text}" for name, text in said.items() if text)]
    write_text(path, latex_table(table, "; ".join(parts) + "."))


def write_csv(path: Path, frame: pd.DataFrame) -> Path:
    """`frame` as a CSV file without its index, written atomically."""
    from probekit.core.io import atomic_write

    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table: the `header` cells, then a line per row of cells (as text)."""

    def line(cells: Iterable[Any]) -> str:
        return "| " + " | ".join(map(str, cells)) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])
