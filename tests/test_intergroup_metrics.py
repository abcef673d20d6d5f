"""Intergroup metrics composed from probekit.stats, on synthetic scores with known answers."""

import itertools

import numpy as np
import pandas as pd
import pytest

from probekit import stats
from probekit.core.errors import ProbekitError
from probekit.studies.intergroup import metrics

RELIGION = ["a Christian", "a Muslim", "a Jew", "a Buddhist", "a Hindu"]


def scores_frame(cube: np.ndarray, groups: list[str], column: str = "parsed") -> pd.DataFrame:
    """A long scores table from X[perceiver, experiencer, event], events named e0, e1, ..."""
    rows = [
        {
            "perceiver": groups[i],
            "experiencer": groups[j],
            "event_id": f"e{e}",
            "emotion": "joy",
            column: cube[i, j, e],
        }
        for i, j, e in np.ndindex(cube.shape)
    ]
    return pd.DataFrame(rows)


# --- exclusion and matrices ---------------------------------------------------------------

GROUPS = ["a person", "a Christian", "a Muslim"]


def small_scores() -> pd.DataFrame:
    """Three groups, four events: e1 refused between named groups, e2 only with `a person`."""
    cube = np.arange(3 * 3 * 4, dtype=float).reshape(3, 3, 4)
    cube[1, 2, 1] = -1
    cube[0, 2, 2] = -1
    frame = scores_frame(cube, GROUPS)
    outsider = frame.iloc[:1].assign(perceiver="a Jew", parsed=-1, event_id="e3")
    return pd.concat([frame, outsider], ignore_index=True)


def test_generate_exclusion_drops_event_everywhere():
    scores = small_scores()
    named = metrics.exclude_events(scores, GROUPS[1:], "generate")
    assert named.kept == ("e0", "e2", "e3")
    assert named.rate == pytest.approx(1 / 4)
    full = metrics.exclude_events(scores, GROUPS, "generate")
    assert full.kept == ("e0", "e3")
    assert full.n_units == 4
    assert full.rate == pytest.approx(1 / 2)


def test_ev_exclusion_uses_valid_mass_threshold():
    cube = np.ones((3, 3, 3))
    scores = scores_frame(cube, GROUPS, column="expected").assign(valid_mass=0.9)
    threshold = metrics.DEFAULT_MIN_VALID_MASS
    below = (scores.event_id == "e0") & (scores.perceiver == "a Muslim")
    scores.loc[below, "valid_mass"] = 0.98 * threshold
    scores.loc[scores.event_id == "e1", "valid_mass"] = threshold  # exactly at it: kept
    result = metrics.exclude_events(scores, GROUPS, "exact")
    assert result.kept == ("e1", "e2")
    lenient = metrics.exclude_events(scores, GROUPS, "exact", min_valid_mass=0.5 * threshold)
    assert lenient.kept == ("e0", "e1", "e2")


def test_exclusion_rejects_unknown_view_and_missing_columns():
    with pytest.raises(ProbekitError, match="unknown view"):
        metrics.exclude_events(small_scores(), GROUPS, "sample")
    with pytest.raises(ProbekitError, match="valid_mass"):
        metrics.exclude_events(
            small_scores().rename(columns={"parsed": "expected"}), GROUPS, "exact"
        )


def test_event_cube_rows_are_perceivers_over_kept_events():
    cube = np.random.default_rng(9).uniform(0, 100, size=(3, 3, 5))
    scores = scores_frame(cube, GROUPS, column="expected").sample(frac=1, random_state=0)
    every_event = metrics.event_cube(scores, GROUPS)  # the paper's M is its mean over events
    np.testing.assert_allclose(every_event.mean(axis=2), cube.mean(axis=2))
    kept = ["e4", "e1"]
    np.testing.assert_allclose(metrics.event_cube(scores, GROUPS, events=kept), cube[:, :, [4, 1]])
    reordered = metrics.event_cube(scores, GROUPS[::-1], events=kept)
    np.testing.assert_allclose(reordered, cube[::-1, ::-1][:, :, [4, 1]])


def test_event_cube_is_the_generic_cube_with_intergroup_columns():
    cube = np.random.default_rng(12).uniform(0, 100, size=(3, 3, 4))
    scores = scores_frame(cube, GROUPS, column="expected").sample(frac=1, random_state=1)
    kept = ["e3", "e0", "e2"]
    generic = stats.score_cube(
        scores, "expected", "perceiver", "experiencer", "event_id", GROUPS, GROUPS, kept
    )
    np.testing.assert_array_equal(metrics.event_cube(scores, GROUPS, events=kept), generic)
    np.testing.assert_array_equal(generic, cube[:, :, [3, 0, 2]])


def test_event_cube_rejects_incomplete_or_duplicate_scores():
    scores = small_scores()
    with pytest.raises(ProbekitError, match="incomplete: 1 of 4"):
        metrics.event_cube(scores.drop(index=5), GROUPS, "parsed")
    with pytest.raises(ProbekitError, match="duplicate"):
        metrics.event_cube(pd.concat([scores, scores.iloc[:1]]), GROUPS, "parsed")
    with pytest.raises(ProbekitError, match="excluded"):
        metrics.event_cube(scores, GROUPS, "parsed", events=[])


# --- summary ------------------------------------------------------------------------------


def religion_scores(mode: str) -> tuple[pd.DataFrame, list[str]]:
    groups = ["a person", *RELIGION]
    rng = np.random.default_rng(11)
    cube = 50 + 20 * np.eye(6)[:, :, None] + rng.normal(0, 5, size=(6, 6, 30))
    if mode == "generate":
        cube = np.rint(cube)
        cube[2, 3, 0] = -1  # named pair: dropped from both sets
        cube[0, 4, 1] = -1  # `a person` pair: dropped from the heatmap set only
        return scores_frame(cube, groups), groups
    scores = scores_frame(cube, groups, column="expected").assign(valid_mass=1.0)
    failed = (scores.event_id == "e5") & (scores.perceiver == "a Jew")
    scores.loc[failed, "valid_mass"] = 0.2 * metrics.DEFAULT_MIN_VALID_MASS
    return scores, groups


def test_summarize_generate_mode():
    scores, groups = religion_scores("generate")
    summary = metrics.summarize(scores, groups, mode="generate", seed=0, n_permutations=1000)
    assert summary.exclusion_rate == pytest.approx(1 / 30)
    assert summary.heatmap_exclusion_rate == pytest.approx(2 / 30)
    assert (summary.n_events, summary.n_kept, summary.heatmap_n_kept) == (30, 29, 28)
    named_events = [f"e{e}" for e in range(30) if e != 0]
    gap_M = metrics.event_cube(scores, RELIGION, "parsed", named_events).mean(axis=2)
    gap_Z = stats.zscore(gap_M)
    assert summary.delta == pytest.approx(stats.empathy_gap(gap_Z, RELIGION))
    assert summary.delta > summary.null_high and summary.significant
    assert summary.Z.shape == summary.shown.shape == (6, 6)
    assert summary.Z.mean() == pytest.approx(0, abs=1e-12)
    assert summary.Z.std() == pytest.approx(1)
    assert (summary.z_min, summary.z_max) == (summary.Z.min(), summary.Z.max())
    assert summary.shown[0].all() and summary.shown[:, 0].all()
    row = summary.to_dict()
    assert row["n_kept"] == 29 and row["significant"] is True
    assert all(np.isscalar(v) for v in row.values())


def test_summarize_ev_mode_accepts_labels_with_or_without_reference():
    scores, groups = religion_scores("ev")
    with_reference = metrics.summarize(scores, groups, labels=groups, n_permutations=200)
    named_only = metrics.summarize(scores, groups, labels=RELIGION, n_permutations=200)
    assert with_reference.to_dict() == named_only.to_dict()
    assert with_reference.n_kept == 29
    kept = [f"e{e}" for e in range(30) if e != 5]
    full_matrix = metrics.event_cube(scores, groups, events=kept).mean(axis=2)
    assert with_reference.mean == pytest.approx(full_matrix.mean())
    assert with_reference.std == pytest.approx(full_matrix.std())


def test_summarize_requires_reference_first():
    scores, groups = religion_scores("ev")
    with pytest.raises(ProbekitError, match="a person"):
        metrics.summarize(scores, groups[::-1])


def test_delta_has_a_bootstrap_interval_over_events_and_an_exact_p():
    """Religion's 5 named groups: p is exact (5! = 120 matchings, smallest 1/120); Δ's 95 % CI
    resamples events, contains Δ, is seeded, and narrows with more events."""
    groups = ["a person", *RELIGION]
    cube = 50 + 3 * np.eye(6)[:, :, None] + np.random.default_rng(5).normal(0, 5, (6, 6, 40))
    scores = scores_frame(np.rint(cube), groups)
    summary = metrics.summarize(scores, groups, mode="generate", seed=0, n_bootstrap=300)
    assert summary.p_exact and summary.p_value == pytest.approx(1 / 120)
    assert summary.delta_ci_low < summary.delta < summary.delta_ci_high
    again = metrics.summarize(scores, groups, mode="generate", seed=0, n_bootstrap=300)
    assert (again.delta_ci_low, again.delta_ci_high) == (
        summary.delta_ci_low,
        summary.delta_ci_high,
    )
    few = scores[scores["event_id"].isin([f"e{e}" for e in range(1, 8)])]
    narrow = summary.delta_ci_high - summary.delta_ci_low
    wide = metrics.summarize(few, groups, mode="generate", seed=0, n_bootstrap=300)
    assert wide.delta_ci_high - wide.delta_ci_low > narrow
    row = summary.to_dict()
    assert {"delta_ci_low", "delta_ci_high", "null_low", "null_high", "p_exact"} <= set(row)
    named = stats.zscore(metrics.event_cube(scores, RELIGION, "parsed").mean(axis=2))
    np.testing.assert_allclose(summary.gap_Z, named)  # what Δ and the embedding read


def test_bootstrap_units_hands_the_statistic_unit_indices():
    values = np.arange(10.0)
    result = stats.bootstrap_units(10, lambda units: values[units].mean(), n=200, seed=1)
    assert result.estimate == pytest.approx(4.5)
    assert result.low < 4.5 < result.high and result.resampled.shape == (200,)
    with pytest.raises(ProbekitError, match="without units"):
        stats.bootstrap_units(0, lambda units: 0.0)


def test_power_counts_the_events_a_significant_gap_needs():
    """A strong planted gap needs few events, a weaker one more; no gap never reaches 80 %."""
    groups = ["a person", *RELIGION]
    noise = np.random.default_rng(3).normal(0, 5, (6, 6, 40))

    def needed(effect):
        cube = 50 + effect * np.eye(6)[:, :, None] + noise
        summary = metrics.summarize(
            scores_frame(cube, groups), groups, mode="generate", n_bootstrap=50, n_power=60
        )
        return summary.power

    strong, weak, none = needed(8.0), needed(2.0), needed(0.0)
    assert strong.needed is not None and weak.needed is not None
    assert strong.needed < weak.needed <= 40
    assert none.needed is None and none.describe("event").startswith("> 40 events")
    assert needed(8.0).power == strong.power  # seeded
    row = metrics.summarize(
        scores_frame(50 + noise, groups), groups, mode="generate", n_bootstrap=50, n_power=0
    ).to_dict()
    assert row["power"] == "—" and np.isnan(row["events_for_power"])  # n_power=0 skips it


def test_power_curve_stops_at_the_target_and_validates():
    values = np.random.default_rng(0).normal(0.5, 1, 200)

    def significant(units):
        sample = values[units]
        return sample.mean() / (sample.std(ddof=1) / np.sqrt(len(sample))) > 1.96

    curve = stats.units_for_power(200, significant, n_resamples=100, seed=1)
    assert curve.needed == curve.sizes[-1] and curve.power[-1] >= 0.8
    assert all(p < 0.8 for p in curve.power[:-1])
    assert curve.sizes == tuple(sorted(curve.sizes)) and curve.needed < 200
    assert curve.describe("event") == f"{curve.needed} events"
    always = stats.units_for_power(200, lambda units: True, seed=1)
    assert always.needed == 3 and always.describe("event") == "≤ 3 events"  # the smallest tried
    with pytest.raises(ProbekitError, match="at least 2 units"):
        stats.units_for_power(1, significant)
    with pytest.raises(ProbekitError, match="target power"):
        stats.units_for_power(10, significant, target=1.0)


def test_no_power_figure_on_a_smoke_size_sample():
    """Resampling a few events says nothing about a study's size: under `MIN_POWER_EVENTS` kept
    events the power is not computed, and the summary row says why (no "≤ 3 events" beside the
    page's tiny-sample warning)."""
    groups = ["a person", *RELIGION]
    noise = np.random.default_rng(3).normal(0, 5, (6, 6, metrics.MIN_POWER_EVENTS))
    cube = 50 + 8.0 * np.eye(6)[:, :, None] + noise
    few = metrics.summarize(
        scores_frame(cube[:, :, :3], groups), groups, mode="generate", n_bootstrap=50, n_power=20
    )
    assert few.power is None and few.significant  # a strong gap, still no power figure
    row = few.to_dict()
    assert row["power"] == "not computed: 3 events kept, under 30"
    assert np.isnan(row["events_for_power"])
    enough = metrics.summarize(
        scores_frame(cube, groups), groups, mode="generate", n_bootstrap=50, n_power=20
    )
    assert enough.power is not None and enough.power.needed is not None


def test_delta_comes_with_its_raw_gap_effect_size_test_and_valid_mass():
    """Beside Δ in z: the raw gap in the scale's points with its interval over events, d_z and
    the sign-flip p of the events' gaps, and the valid mass of each side, each against a
    direct computation; the summary, summary.md and the headline carry them."""
    from probekit.studies.intergroup import report

    groups = ["a person", *RELIGION]
    rng = np.random.default_rng(2)
    cube = 50 + 1.5 * np.eye(6)[:, :, None] + rng.normal(0, 1, (6, 6, 6))
    scores = scores_frame(cube, groups, column="expected")
    inside = scores["perceiver"] == scores["experiencer"]
    scores["valid_mass"] = np.where(inside, 0.4, 0.3)
    summary = metrics.summarize(scores, groups, mode="exact", seed=0, n_bootstrap=400)
    named = cube[1:, 1:]
    gaps = np.array(
        [
            named[..., e][np.eye(5, dtype=bool)].mean()
            - named[..., e][~np.eye(5, dtype=bool)].mean()
            for e in range(6)
        ]
    )
    row = summary.to_dict()
    assert row["raw_gap"] == pytest.approx(gaps.mean())
    assert row["d_z"] == pytest.approx(gaps.mean() / gaps.std(ddof=1))
    flips = np.array(list(itertools.product((1, -1), repeat=6)))
    direct = np.mean(np.abs(flips @ gaps) / 6 >= abs(gaps.mean()) - 1e-12)
    assert row["p_events"] == pytest.approx(direct) == pytest.approx(2 / 64)
    draws = np.random.default_rng(0).integers(6, size=(400, 6))
    low, high = np.percentile(gaps[draws].mean(1), [2.5, 97.5])
    assert (row["raw_gap_ci_low"], row["raw_gap_ci_high"]) == pytest.approx((low, high))
    assert (row["valid_mass_in_group"], row["valid_mass_out_group"]) == pytest.approx((0.4, 0.3))
    line = {
        **row,
        "category": "religion",
        "setting": "P0S0T0",
        "view": "exact",
        "model": "m",
        "mean_valid_mass": 0.32,
        "refusal_rate": 0.68,
    }
    (headline,) = report.headlines(pd.DataFrame([line]))
    assert headline.context.startswith(f"raw gap {gaps.mean():+.2f} [")
    assert "points on 0–100; d_z" in headline.context and "sign-flip p 0.0312" in headline.context
    assert "valid mass 0.320 (in-group 0.400, out-group 0.300)" in headline.context
    assert headline.context in str(headline)
    table = report.summary_markdown(pd.DataFrame([line]))
    assert "| raw gap (points) [95% CI] | d_z | p over events (sign-flip) |" in table
    assert f"| {gaps.mean():+.2f} [" in table and "| 0.400 / 0.300 |" in table
