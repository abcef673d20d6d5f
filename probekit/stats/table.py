"""Checks and row selection shared by the statistics on a long score table."""

from collections.abc import Hashable, Iterable, Mapping, Sequence

import pandas as pd

from probekit.core.errors import ProbekitError, StatisticsError


def require_columns(df: pd.DataFrame, columns: Iterable[str]) -> None:
    """Raise a ProbekitError naming the `columns` the score table lacks."""
    missing = [c for c in dict.fromkeys(columns) if c not in df]
    if missing:
        raise ProbekitError(f"scores lack the column(s) {', '.join(missing)}")


def require_distinct(keys: Sequence[Hashable], what: str) -> None:
    """Raise if `keys` names one value twice (a cube axis or a unit list must not)."""
    duplicated = pd.Index(keys).duplicated()
    if duplicated.any():
        raise ProbekitError(f"the {what} list names {keys[duplicated.argmax()]!r} twice")


def select_rows(df: pd.DataFrame, keys: Mapping[str, Sequence[Hashable]]) -> pd.DataFrame:
    """The rows whose value in each column of `keys` is one of that column's keys.

    The columns must exist, each key list must be free of duplicates, and some row must match.
    """
    require_columns(df, keys)
    inside = pd.Series(True, index=df.index)
    for column, values in keys.items():
        require_distinct(values, column)
        inside &= df[column].isin(values)
    rows = df[inside]
    if rows.empty:
        raise StatisticsError(f"no scores with {' and '.join(keys)} among the given keys")
    return rows
