"""Metrics of the intergroup empathy gap study (Hou, Daumé III, Rudinger, NAACL 2025).

Composed from `probekit.stats`. Every matrix is indexed [perceiver, experiencer] in the caller's
group order, with the reference group `a person` first wherever it is included. Scores come as a
long DataFrame with columns `perceiver`, `experiencer`, `event_id`, `emotion` and either
`expected` + `valid_mass` ("exact" view) or `parsed` ("generate" mode, -1 = refusal or unparseable
answer).
"""

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.reporting.contract import TINY_SAMPLE_UNITS
from probekit.stats import (
    Exclusion,
    PowerCurve,
    bootstrap_units,
    empathy_gap,
    exclude_units,
    low_valid_mass,
    paired_effect_size,
    permutation_test,
    require_columns,
    score_cube,
    select_rows,
    shown_mask,
    sign_flip_test,
    units_for_power,
    unparsed,
    zscore,
)
from probekit.studies.base import check_view

REFERENCE = "a person"

DEFAULT_MIN_VALID_MASS = 0.01
"""probekit's choice, not the paper's: in the exact view a prompt whose answers (the numbers of the
scale) carry less than 1 % of the next-token probability mass counts as failed, like a refusal
in generate mode. Small chat models put most mass on prose ("The person felt...") and 5-10 % on
a number; the expected value is conditional on answering with a number, and 1 % keeps that
conditional distribution away from pure noise."""

MIN_POWER_EVENTS = TINY_SAMPLE_UNITS
"""Kept events below which the power analysis is not run: resampling a smoke-size sample (a few
events) says nothing about how many events a study needs."""


def value_column(mode: str) -> str:
    """The score column read in `mode` ("exact" → expected, "generate" → parsed)."""
    return {"exact": "expected", "generate": "parsed"}[check_view(mode, ("exact", "generate"))]


def exclude_events(
    df: pd.DataFrame,
    groups: Sequence[str],
    mode: str,
    min_valid_mass: float = DEFAULT_MIN_VALID_MASS,
) -> Exclusion:
    """The paper's event-level exclusion over the perceiver–experiencer pairs among `groups`.

    An event with a failed answer for ANY pair is dropped from every cell, so all cells average
    the same events and the paired t-tests stay paired. A failed answer is `parsed == -1` in
    generate mode and `valid_mass < min_valid_mass` in the exact view.
    """
    value = value_column(mode)
    columns = [value, "valid_mass"] if mode == "exact" else [value]
    require_columns(df, ["perceiver", "experiencer", "event_id", *columns])
    rows = select_rows(df, {"perceiver": groups, "experiencer": groups})
    failed = (
        low_valid_mass(rows, min_valid_mass, value) if mode == "exact" else unparsed(rows, value)
    )
    return exclude_units(rows, "event_id", failed)


def event_cube(
    df: pd.DataFrame,
    groups: Sequence[str],
    value: str = "expected",
    events: Sequence[str] | None = None,
) -> np.ndarray:
    """Per-event scores X[i, j, e]: perceiver i, experiencer j, event e (default: all events);
    the paper's intensity matrix M is its mean over events, `event_cube(...).mean(axis=2)`.

    Every (perceiver, experiencer, event) must have exactly one score, so that cell means and
    paired tests run over the same events.
    """
    return score_cube(df, value, "perceiver", "experiencer", "event_id", groups, units=events)


@dataclass(frozen=True, eq=False)
class GapSummary:
    """Everything a report needs for one (model, category, setting); its scalar fields, in
    order, are the columns of its summary row (`to_dict`).

    Δ, its permutation null interval (`null_low`, `null_high`), the one-sided p, the bootstrap
    95 % CI of Δ over events (`delta_ci_low`, `delta_ci_high`) and the exclusion over the named
    groups come from the matrix without `a person`; `significant` is the paper's criterion (Δ
    outside the null interval; the p is reported beside it, not used for this flag). Z, the
    mask, mean ± std of M and (min, max) of Z describe the heatmap matrix with `a person`, whose
    exclusion is computed over all groups.

    Beside Δ, on the same kept events and named groups (`event_context`): `raw_gap`, the mean
    in-group minus out-group rating in points of the answer scale, with its bootstrap 95 % CI
    over events; `d_z`, that gap's effect size over events (mean / standard deviation of the
    events' gaps); `p_events`, the two-sided sign-flip test of the events' gaps; and the mean
    valid mass of the in-group and out-group prompts.
    """

    delta: float
    delta_ci_low: float
    delta_ci_high: float
    null_low: float
    null_high: float
    p_value: float
    p_exact: bool
    significant: bool
    exclusion_rate: float
    n_events: int
    n_kept: int
    heatmap_exclusion_rate: float
    heatmap_n_kept: int
    mean: float
    std: float
    z_min: float
    z_max: float
    identities: tuple[str, ...]
    Z: np.ndarray
    shown: np.ndarray
    gap_Z: np.ndarray  # the named-only z-scored matrix Δ is computed on
    power: PowerCurve | None = None  # events needed for Δ to be significant (None: not run)
    context: dict[str, float] | None = None  # `event_context`: the raw gap, d_z, p, valid mass

    def to_dict(self) -> dict[str, float | int | bool | str]:
        """The scalar fields, one row of summary.csv / summary.md."""
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        row = {name: value for name, value in row.items() if np.isscalar(value)}
        needed = None if self.power is None else self.power.needed
        row["events_for_power"] = np.nan if needed is None else needed
        few = f"not computed: {self.n_kept} events kept, under {MIN_POWER_EVENTS}"
        few = few if self.n_kept < MIN_POWER_EVENTS else "—"
        row["power"] = few if self.power is None else self.power.describe("event")
        return {**row, **(self.context or {})}


def event_context(
    X: np.ndarray,
    labels: Sequence[str],
    df: pd.DataFrame,
    groups: Sequence[str],
    events: Sequence[str],
    seed: int = 0,
    n_bootstrap: int = 1000,
) -> dict[str, float]:
    """What a reader needs beside Δ (see `GapSummary`), from the kept events' cube `X` of the
    named `groups` (with their in-group `labels`) and the scores `df`."""
    inside = np.asarray(labels)[:, None] == np.asarray(labels)[None, :]
    gaps = X[inside].mean(axis=0) - X[~inside].mean(axis=0)  # each event's raw gap
    raw = bootstrap_units(len(gaps), lambda d: gaps[d].mean(-1), n_bootstrap, seed, batched=True)
    out = {
        "raw_gap": raw.estimate,
        "raw_gap_ci_low": raw.low,
        "raw_gap_ci_high": raw.high,
        "d_z": paired_effect_size(gaps),
        "p_events": sign_flip_test(gaps, seed=seed),
    }
    if "valid_mass" in df:
        rows = select_rows(df, {"perceiver": groups, "experiencer": groups})
        rows = rows[rows["event_id"].isin(events)]
        label = dict(zip(groups, labels, strict=True))
        inside = rows["perceiver"].map(label) == rows["experiencer"].map(label)
        out["valid_mass_in_group"] = float(rows.loc[inside, "valid_mass"].mean())
        out["valid_mass_out_group"] = float(rows.loc[~inside, "valid_mass"].mean())
    return out


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
    mode: str = "exact",
    seed: int = 0,
    n_permutations: int = 10000,
    min_valid_mass: float = DEFAULT_MIN_VALID_MASS,
    n_bootstrap: int = 1000,
    n_power: int = 100,
    n_power_permutations: int = 1000,
) -> GapSummary:
    """Compute the gap statistics and heatmap data of one scores table.

    `groups` lists the identities with `a person` first; `labels` gives the in-group label of
    each identity (default: the identity itself; for ethnicity the four blocks).
    Power: `n_power` resamples of the kept events at each size of a growing grid, each tested
    with `n_power_permutations` permutations (exact where the matchings are fewer) by the
    paper's criterion; `n_power=0` skips it, and so do fewer than `MIN_POWER_EVENTS` kept
    events.
    """
    if not groups or groups[0] != REFERENCE:
        raise ProbekitError(f"the group list must start with {REFERENCE!r}")
    value = value_column(mode)
    named = list(groups[1:])
    gap_events = exclude_events(df, named, mode, min_valid_mass)
    named_labels = _named_labels(groups, labels)
    gap_X = event_cube(df, named, value, gap_events.kept)
    gap_Z = zscore(gap_X.mean(axis=2))
    test = permutation_test(gap_Z, named_labels, n_permutations, seed)
    n_kept = gap_X.shape[2]

    def z_of(events: np.ndarray) -> np.ndarray:  # Z of a resample of the kept events
        return zscore(gap_X[:, :, events].mean(axis=2))

    def gap(events: np.ndarray) -> float:
        return empathy_gap(z_of(events), named_labels)

    def significant(events: np.ndarray) -> bool:
        return permutation_test(z_of(events), named_labels, n_power_permutations, seed).significant

    interval = bootstrap_units(n_kept, gap, n=n_bootstrap, seed=seed)
    power = None
    if n_power and n_kept >= max(2, MIN_POWER_EVENTS):
        power = units_for_power(n_kept, significant, n_resamples=n_power, seed=seed)
    heatmap_events = exclude_events(df, groups, mode, min_valid_mass)
    X = event_cube(df, groups, value, heatmap_events.kept)
    M = X.mean(axis=2)
    Z = zscore(M)
    return GapSummary(
        identities=tuple(groups),
        delta=test.delta,
        null_low=test.low,
        null_high=test.high,
        p_value=test.p_value,
        p_exact=test.exact,
        significant=test.significant,
        delta_ci_low=interval.low,
        delta_ci_high=interval.high,
        exclusion_rate=gap_events.rate,
        n_events=gap_events.n_units,
        n_kept=len(gap_events.kept),
        heatmap_exclusion_rate=heatmap_events.rate,
        heatmap_n_kept=len(heatmap_events.kept),
        mean=float(M.mean()),
        std=float(M.std()),
        z_min=float(Z.min()),
        z_max=float(Z.max()),
        Z=Z,
        shown=shown_mask(X, reference=0),
        gap_Z=gap_Z,
        power=power,
        context=event_context(gap_X, named_labels, df, named, gap_events.kept, seed, n_bootstrap),
    )
