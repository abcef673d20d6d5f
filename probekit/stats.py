"""Statistics of the intergroup empathy gap study (Hou, Daumé III, Rudinger, NAACL 2025).

Every matrix is indexed [perceiver, experiencer] in the caller's group order, with the reference
group `a person` first wherever it is included. Scores come as a long DataFrame with columns
`perceiver`, `experiencer`, `event_id`, `emotion` and either `expected` + `valid_mass` ("ev"
mode) or `parsed` ("generate" mode, -1 = refusal or unparseable answer).
"""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from probekit.errors import ProbekitError

REFERENCE = "a person"

DEFAULT_MIN_VALID_MASS = 0.01
"""probekit's choice, not the paper's: in ev mode a prompt whose answers (the numbers of the
scale) carry less than 1 % of the next-token probability mass counts as failed, like a refusal
in generate mode. Small chat models put most mass on prose ("The person felt...") and 5-10 % on
a number; the expected value is conditional on answering with a number, and 1 % keeps that
conditional distribution away from pure noise."""

VALUE_COLUMNS = {"ev": "expected", "generate": "parsed"}
"""The score column each mode reads."""

# Permuted Δs equal to the observed one up to float rounding count as at least as extreme.
_TIE_TOLERANCE = 1e-12


def _square(Z: np.ndarray) -> np.ndarray:
    Z = np.asarray(Z, dtype=float)
    if Z.ndim != 2 or Z.shape[0] != Z.shape[1]:
        raise ProbekitError(f"expected a square matrix, got shape {Z.shape}")
    return Z


def _in_group(labels: Sequence[str], size: int) -> np.ndarray:
    """Boolean mask of the in-group cells: row and column carry the same label."""
    labels = np.asarray(labels)
    if labels.shape != (size,):
        raise ProbekitError(f"got {labels.size} group labels for a {size}x{size} matrix")
    inside = labels[:, None] == labels[None, :]
    if inside.all():
        raise ProbekitError("every cell is in-group; the empathy gap needs two distinct labels")
    return inside


def empathy_gap(Z: np.ndarray, labels: Sequence[str]) -> float:
    """Δ = mean of Z over in-group cells − mean over out-group cells (Z is used as given)."""
    Z = _square(Z)
    inside = _in_group(labels, len(Z))
    return float(Z[inside].mean() - Z[~inside].mean())


@dataclass(frozen=True, eq=False)
class PermutationResult:
    """Observed Δ, the 2.5–97.5 percentile interval of the permuted Δs, and the two-sided p."""

    delta: float
    low: float
    high: float
    p_value: float
    permuted: np.ndarray

    @property
    def significant(self) -> bool:
        """The paper's criterion: the observed Δ lies outside the permutation interval."""
        return not self.low <= self.delta <= self.high


def permutation_test(
    Z: np.ndarray, labels: Sequence[str], n: int = 10000, seed: int = 0
) -> PermutationResult:
    """Structured permutation test of Δ: shuffle rows and, independently, columns of Z.

    The labels stay in place, so the in-group mask no longer lines up with the groups, while
    each perceiver's row and each experiencer's column stay intact (cells are never shuffled
    one by one). Every in-group position then receives a uniformly random cell, so the null
    is centred at 0 and the two-sided p counts |Δ_perm| ≥ |Δ|, with the +1 correction.
    """
    Z = _square(Z)
    inside = _in_group(labels, len(Z))
    if n < 1:
        raise ProbekitError(f"the permutation test needs at least 1 permutation, got {n}")
    rng = np.random.default_rng(seed)
    order = np.tile(np.arange(len(Z)), (n, 1))
    rows = rng.permuted(order, axis=1)
    cols = rng.permuted(order, axis=1)
    # Permuted matrix k has cell (a, b) = Z[rows[k, a], cols[k, b]]; its total is unchanged,
    # so the out-group sum is the total minus the in-group sum.
    a, b = np.nonzero(inside)
    in_sum = Z[rows[:, a], cols[:, b]].sum(axis=1)
    permuted = in_sum / a.size - (Z.sum() - in_sum) / (Z.size - a.size)
    delta = empathy_gap(Z, labels)
    low, high = np.percentile(permuted, [2.5, 97.5])
    extreme = np.count_nonzero(np.abs(permuted) >= abs(delta) - _TIE_TOLERANCE)
    return PermutationResult(
        delta=delta,
        low=float(low),
        high=float(high),
        p_value=float((extreme + 1) / (n + 1)),
        permuted=permuted,
    )


def zscore(M: np.ndarray) -> np.ndarray:
    """(M − mean) / std over all cells, population std, as the paper normalises matrices."""
    M = np.asarray(M, dtype=float)
    std = M.std()
    if not np.isfinite(std) or std == 0:
        raise ProbekitError("cannot z-normalise a matrix that is constant or not finite")
    return (M - M.mean()) / std


def value_column(mode: str) -> str:
    """The score column read in `mode` ("ev" → expected, "generate" → parsed)."""
    if mode not in VALUE_COLUMNS:
        raise ProbekitError(f"unknown scoring mode {mode!r}; use 'ev' or 'generate'")
    return VALUE_COLUMNS[mode]


def _rows_among(df: pd.DataFrame, groups: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """The score rows whose perceiver and experiencer are both in `groups`."""
    missing = [c for c in ("perceiver", "experiencer", "event_id", *columns) if c not in df]
    if missing:
        raise ProbekitError(f"scores lack the column(s) {', '.join(missing)}")
    if len(set(groups)) != len(groups):
        raise ProbekitError("the group list names an identity twice")
    rows = df[df["perceiver"].isin(groups) & df["experiencer"].isin(groups)]
    if rows.empty:
        raise ProbekitError(f"no scores for the groups {', '.join(groups)}")
    return rows


def _failed(rows: pd.DataFrame, mode: str, min_valid_mass: float) -> pd.Series:
    """Which rows are failed answers: refusals in generate mode, low valid mass in ev mode."""
    if mode == "generate":
        parsed = rows["parsed"]
        return parsed.isna() | (parsed < 0)
    mass = rows["valid_mass"]
    return rows["expected"].isna() | mass.isna() | (mass < min_valid_mass)


@dataclass(frozen=True)
class Exclusion:
    """Events kept after event-level exclusion, out of `n_events` scored among the groups."""

    kept: tuple[str, ...]
    n_events: int

    @property
    def rate(self) -> float:
        """Share of events dropped (the paper's refusal rate in generate mode)."""
        return 1 - len(self.kept) / self.n_events


def exclude_events(
    df: pd.DataFrame,
    groups: Sequence[str],
    mode: str,
    min_valid_mass: float = DEFAULT_MIN_VALID_MASS,
) -> Exclusion:
    """The paper's event-level exclusion over the perceiver–experiencer pairs among `groups`.

    An event with a failed answer for ANY pair is dropped from every cell, so all cells average
    the same events and the paired t-tests stay paired. A failed answer is `parsed == -1` in
    generate mode and `valid_mass < min_valid_mass` in ev mode.
    """
    value = value_column(mode)
    columns = [value, "valid_mass"] if mode == "ev" else [value]
    rows = _rows_among(df, groups, columns)
    bad = set(rows.loc[_failed(rows, mode, min_valid_mass), "event_id"])
    events = pd.unique(rows["event_id"])
    return Exclusion(kept=tuple(e for e in events if e not in bad), n_events=len(events))


def _codes(values: pd.Series, categories: Sequence[str]) -> np.ndarray:
    """Position of each value in `categories` (-1 if absent), as int64 for flat indexing.

    Factorising first hashes each distinct string once, several times faster than a Categorical.
    """
    codes, uniques = pd.factorize(values)
    return pd.Index(categories).get_indexer(uniques).astype(np.int64)[codes]


def event_cube(
    df: pd.DataFrame,
    groups: Sequence[str],
    value: str = "expected",
    events: Sequence[str] | None = None,
) -> np.ndarray:
    """Per-event scores X[i, j, e]: perceiver i, experiencer j, event e (default: all events).

    Every (perceiver, experiencer, event) must have exactly one score, so that cell means and
    paired tests run over the same events.
    """
    rows = _rows_among(df, groups, [value])
    if events is None:
        events = pd.unique(rows["event_id"])
    else:
        rows = rows[rows["event_id"].isin(events)]
    if len(events) == 0:
        raise ProbekitError("no events left to average; every event was excluded")
    k, n_events = len(groups), len(events)
    perceiver = _codes(rows["perceiver"], groups)
    experiencer = _codes(rows["experiencer"], groups)
    event = _codes(rows["event_id"], events)
    flat = (perceiver * k + experiencer) * n_events + event
    counts = np.bincount(flat, minlength=k * k * n_events)
    if (counts > 1).any():
        raise ProbekitError("scores hold duplicate rows for one perceiver, experiencer and event")
    incomplete = np.count_nonzero(counts.reshape(k * k, n_events).min(axis=0) == 0)
    if incomplete:
        raise ProbekitError(
            f"scores are incomplete: {incomplete} of {n_events} events lack some "
            "perceiver-experiencer pair among the groups"
        )
    cube = np.empty(k * k * n_events)
    cube[flat] = rows[value].to_numpy(dtype=float)
    return cube.reshape(k, k, n_events)


def intensity_matrix(
    df: pd.DataFrame,
    groups: Sequence[str],
    value: str = "expected",
    events: Sequence[str] | None = None,
) -> np.ndarray:
    """M[i, j] = mean score of perceiver i for experiencer j over `events` (default: all)."""
    return event_cube(df, groups, value, events).mean(axis=2)


def _tested_cells(k: int, reference: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the off-diagonal cells not involving the reference group."""
    tested = ~np.eye(k, dtype=bool)
    if reference is not None:
        tested[reference, :] = tested[:, reference] = False
    return np.nonzero(tested)


def cell_pvalues(X: np.ndarray, reference: int | None = 0) -> tuple[np.ndarray, np.ndarray]:
    """Paired t-test p-values of each cell against its in-group cells, over events.

    Returns (p_perceiver, p_experiencer): cell (i, j) vs (i, i) and vs (j, j). Untested cells
    (the diagonal and the `reference` row and column) are NaN, and so are cells whose event-wise
    differences are all zero.
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 3 or X.shape[0] != X.shape[1]:
        raise ProbekitError(f"expected a cube X[perceiver, experiencer, event], got {X.shape}")
    if X.shape[2] < 2:
        raise ProbekitError("paired t-tests need at least 2 kept events")
    k = len(X)
    i, j = _tested_cells(k, reference)
    p_perceiver = np.full((k, k), np.nan)
    p_experiencer = np.full((k, k), np.nan)
    # Zero-variance differences yield NaN p-values (masked below); scipy's warning adds nothing.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p_perceiver[i, j] = stats.ttest_rel(X[i, i], X[i, j], axis=1).pvalue
        p_experiencer[i, j] = stats.ttest_rel(X[j, j], X[i, j], axis=1).pvalue
    return p_perceiver, p_experiencer


def shown_mask(X: np.ndarray, alpha: float = 0.05, reference: int | None = 0) -> np.ndarray:
    """Which heatmap cells to show: both paired tests significant at Bonferroni α / n².

    n counts all groups in X, `a person` included. The diagonal and the `reference` row and
    column are always shown; every other cell is masked unless it differs significantly from
    both the perceiver's and the experiencer's in-group cell.
    """
    p_perceiver, p_experiencer = cell_pvalues(X, reference)
    k = len(p_perceiver)
    threshold = alpha / k**2
    shown = (p_perceiver < threshold) & (p_experiencer < threshold)
    shown |= np.eye(k, dtype=bool)
    if reference is not None:
        shown[reference, :] = shown[:, reference] = True
    return shown


@dataclass(frozen=True, eq=False)
class GapSummary:
    """Everything a report needs for one (model, category, setting).

    Δ, its permutation interval, p and the exclusion over the named groups come from the matrix
    without `a person`; Z, the mask, mean ± std of M and (min, max) of Z describe the heatmap
    matrix with `a person`, whose exclusion is computed over all groups.
    """

    identities: tuple[str, ...]
    delta: float
    low: float
    high: float
    p_value: float
    exclusion_rate: float
    n_events: int
    n_kept: int
    heatmap_exclusion_rate: float
    heatmap_n_kept: int
    mean: float
    std: float
    z_min: float
    z_max: float
    Z: np.ndarray
    shown: np.ndarray

    @property
    def significant(self) -> bool:
        """Δ lies outside the 2.5–97.5 percentile interval of the permuted Δs."""
        return not self.low <= self.delta <= self.high

    def to_dict(self) -> dict[str, float | int | bool]:
        """The scalar fields, one row of summary.csv / summary.md."""
        return {
            "delta": self.delta,
            "ci_low": self.low,
            "ci_high": self.high,
            "p_value": self.p_value,
            "significant": self.significant,
            "exclusion_rate": self.exclusion_rate,
            "n_events": self.n_events,
            "n_kept": self.n_kept,
            "heatmap_exclusion_rate": self.heatmap_exclusion_rate,
            "heatmap_n_kept": self.heatmap_n_kept,
            "mean": self.mean,
            "std": self.std,
            "z_min": self.z_min,
            "z_max": self.z_max,
        }


def _named_labels(groups: Sequence[str], labels: Sequence[str] | None) -> list[str]:
    """Labels of the named groups; `labels` may cover all groups or only the named ones."""
    named = list(groups[1:])
    if labels is None:
        return named
    if len(labels) == len(groups):
        return list(labels[1:])
    if len(labels) == len(named):
        return list(labels)
    raise ProbekitError(f"got {len(labels)} labels for {len(groups)} groups")


def summarize(
    df: pd.DataFrame,
    groups: Sequence[str],
    labels: Sequence[str] | None = None,
    mode: str = "ev",
    seed: int = 0,
    n_permutations: int = 10000,
    min_valid_mass: float = DEFAULT_MIN_VALID_MASS,
) -> GapSummary:
    """Compute the gap statistics and heatmap data of one scores table.

    `groups` lists the identities with `a person` first; `labels` gives the in-group label of
    each identity (default: the identity itself; for ethnicity the four blocks).
    """
    if not groups or groups[0] != REFERENCE:
        raise ProbekitError(f"the group list must start with {REFERENCE!r}")
    value = value_column(mode)
    named = list(groups[1:])
    gap_events = exclude_events(df, named, mode, min_valid_mass)
    gap_Z = zscore(intensity_matrix(df, named, value, gap_events.kept))
    test = permutation_test(gap_Z, _named_labels(groups, labels), n_permutations, seed)
    heatmap_events = exclude_events(df, groups, mode, min_valid_mass)
    X = event_cube(df, groups, value, heatmap_events.kept)
    M = X.mean(axis=2)
    Z = zscore(M)
    return GapSummary(
        identities=tuple(groups),
        delta=test.delta,
        low=test.low,
        high=test.high,
        p_value=test.p_value,
        exclusion_rate=gap_events.rate,
        n_events=gap_events.n_events,
        n_kept=len(gap_events.kept),
        heatmap_exclusion_rate=heatmap_events.rate,
        heatmap_n_kept=len(heatmap_events.kept),
        mean=float(M.mean()),
        std=float(M.std()),
        z_min=float(Z.min()),
        z_max=float(Z.max()),
        Z=Z,
        shown=shown_mask(X),
    )
