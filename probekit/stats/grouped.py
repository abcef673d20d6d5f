"""Means of a score column: per group of rows, or as a dense cube over two key columns and units.

A score column is any numeric column of the long table: an expected value, P(answer) such as
`p::joy`, P(correct). Units (events, questions) are restricted to a chosen list, typically the
`kept` of an `Exclusion`.
"""

from collections.abc import Hashable, Sequence

import numpy as np
import pandas as pd

from probekit.core.errors import ProbekitError, StatisticsError
from probekit.stats.table import require_columns, require_distinct, select_rows


def grouped_means(
    df: pd.DataFrame,
    by: Sequence[str],
    value: str,
    *,
    unit: str | None = None,
    units: Sequence[Hashable] | None = None,
) -> pd.DataFrame:
    """Mean of `value` per combination of the `by` columns, over the rows of `units` in `unit`.

    One row per group in first-seen order: the `by` columns, the mean (named `value`) and
    `n_rows`. A group holding a NaN score gets NaN rather than a mean over fewer rows, so a
    missed exclusion shows instead of biasing the mean.
    """
    if not by:
        raise ProbekitError("grouped_means needs at least one column to group by")
    if units is not None and unit is None:
        raise ProbekitError("choosing units needs the unit column (`unit=`)")
    require_columns(df, [*by, value, *([unit] if unit else [])])
    if units is not None:
        df = df[df[unit].isin(units)]
    if df.empty:
        raise StatisticsError("no scores left to average")
    grouped = df.groupby(list(by), sort=False, dropna=False)[value]
    means, sizes = grouped.mean(), grouped.size()
    if df[value].isna().any():
        means[grouped.count() < sizes] = np.nan
    return pd.DataFrame({value: means, "n_rows": sizes}).reset_index()


def _codes(values: pd.Series, keys: Sequence[Hashable]) -> np.ndarray:
    """Position of each value in `keys` (-1 if absent), as int64 for flat indexing.

    Factorising first hashes each distinct value once, several times faster than a Categorical.
    """
    codes, uniques = pd.factorize(values)
    return pd.Index(keys).get_indexer(uniques).astype(np.int64)[codes]


def score_cube(
    df: pd.DataFrame,
    value: str,
    row: str,
    column: str,
    unit: str,
    row_keys: Sequence[Hashable],
    column_keys: Sequence[Hashable] | None = None,
    units: Sequence[Hashable] | None = None,
) -> np.ndarray:
    """Per-unit scores X[r, c, u] for row key r, column key c and unit u (default: all units).

    `column_keys` defaults to `row_keys` (a square cube). Every (r, c, u) must have exactly one
    score, so that cell means and paired tests run over the same units.
    """
    column_keys = row_keys if column_keys is None else column_keys
    require_columns(df, [row, column, unit, value])
    rows = select_rows(df, {row: row_keys, column: column_keys})
    if units is None:
        units = pd.unique(rows[unit])
    else:
        require_distinct(units, unit)
        rows = rows[rows[unit].isin(units)]
    if len(units) == 0:
        raise StatisticsError(f"no {unit} left to average; every one was excluded")
    n_rows, n_columns, n_units = len(row_keys), len(column_keys), len(units)
    flat = (
        _codes(rows[row], row_keys) * n_columns + _codes(rows[column], column_keys)
    ) * n_units + _codes(rows[unit], units)
    counts = np.bincount(flat, minlength=n_rows * n_columns * n_units)
    if (counts > 1).any():
        raise ProbekitError(f"scores hold duplicate rows for one {row}, {column} and {unit}")
    incomplete = np.count_nonzero(counts.reshape(n_rows * n_columns, n_units).min(axis=0) == 0)
    if incomplete:
        raise StatisticsError(
            f"scores are incomplete: {incomplete} of {n_units} {unit} values lack some "
            f"{row}-{column} pair among the keys"
        )
    cube = np.empty(n_rows * n_columns * n_units)
    cube[flat] = rows[value].to_numpy(dtype=float)
    return cube.reshape(n_rows, n_columns, n_units)
