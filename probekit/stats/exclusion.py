"""Unit-level exclusion: a unit (an event, a question) with any failed row is dropped whole.

Dropping whole units keeps every cell of a comparison averaging the same units, so paired tests
stay paired. The predicates build the failed-row mask from probekit's score columns; studies
combine them with `|`.
"""

from collections.abc import Hashable
from dataclasses import dataclass

import pandas as pd

from probekit.core.errors import ProbekitError, StatisticsError
from probekit.stats.table import require_columns


@dataclass(frozen=True)
class Exclusion:
    """Units kept (in first-seen order) out of the `n_units` in the table."""

    kept: tuple[Hashable, ...]
    n_units: int

    @property
    def rate(self) -> float:
        """Share of units dropped."""
        return 1 - len(self.kept) / self.n_units


def exclude_units(df: pd.DataFrame, unit: str, failed: pd.Series) -> Exclusion:
    """Keep the units of column `unit` none of whose rows is marked in `failed` (same index)."""
    require_columns(df, [unit])
    if not failed.index.equals(df.index):
        raise ProbekitError("the failed-row mask does not share the score table's index")
    units = pd.unique(df[unit])
    if len(units) == 0:
        raise StatisticsError("no units to exclude from: the score table is empty")
    bad = set(df.loc[failed.to_numpy(dtype=bool), unit])
    return Exclusion(kept=tuple(u for u in units if u not in bad), n_units=len(units))


def low_valid_mass(df: pd.DataFrame, min_valid_mass: float, value: str = "expected") -> pd.Series:
    """Rows whose answers carry less than `min_valid_mass` of the probability, or no score.

    `valid_mass` or `value` being NaN also counts as failed: no conditional score exists.
    """
    require_columns(df, ["valid_mass", value])
    mass = df["valid_mass"]
    return df[value].isna() | mass.isna() | (mass < min_valid_mass)


def unparsed(df: pd.DataFrame, value: str = "parsed") -> pd.Series:
    """Rows whose generated answer was refused or not parsed (NaN or negative, e.g. -1)."""
    require_columns(df, [value])
    parsed = df[value]
    return parsed.isna() | (parsed < 0)
