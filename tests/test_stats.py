"""Statistics of the empathy gap study on synthetic data with known answers."""

import itertools
import time

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from probekit import stats
from probekit.errors import ProbekitError

RELIGION = ["a Christian", "a Muslim", "a Jew", "a Buddhist", "a Hindu"]
ETHNICITY = {
    "White": [
        "a white person",
        "a White person",
        "a Caucasian",
        "a White American",
        "a European American",
    ],
    "Black": ["a black person", "a Black person", "an African American", "a Black American"],
    "Asian": ["an Asian person", "an Asian American", "an Asian"],
    "Hispanic": [
        "a Hispanic person",
        "a Hispanic American",
        "a Latino American",
        "a Latino",
        "a Latina",
        "a Latinx",
    ],
}
ETHNICITY_LABELS = [block for block, names in ETHNICITY.items() for _ in names]


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


# --- empathy gap --------------------------------------------------------------------------


def test_gap_diagonal_groups_is_in_minus_out_value():
    Z = np.where(np.eye(5, dtype=bool), 2.0, -0.5)
    assert stats.empathy_gap(Z, RELIGION) == pytest.approx(2.5)


def test_gap_ethnicity_uses_blocks_not_names():
    blocks = np.asarray(ETHNICITY_LABELS)
    same_block = blocks[:, None] == blocks[None, :]
    assert stats.empathy_gap(np.where(same_block, 1.0, 0.0), ETHNICITY_LABELS) == pytest.approx(1)
    # Only the 18 diagonal cells raised: they are 18 of the 25 + 16 + 9 + 36 = 86 in-group cells.
    assert stats.empathy_gap(np.eye(18), ETHNICITY_LABELS) == pytest.approx(18 / 86)


def test_gap_matches_cell_by_cell_definition():
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(18, 18))
    inside = [Z[i, j] for i, j in np.ndindex(Z.shape) if ETHNICITY_LABELS[i] == ETHNICITY_LABELS[j]]
    outside = [
        Z[i, j] for i, j in np.ndindex(Z.shape) if ETHNICITY_LABELS[i] != ETHNICITY_LABELS[j]
    ]
    expected = np.mean(inside) - np.mean(outside)
    assert stats.empathy_gap(Z, ETHNICITY_LABELS) == pytest.approx(expected)


def test_gap_does_not_renormalise():
    Z = np.random.default_rng(2).normal(size=(5, 5))
    delta = stats.empathy_gap(Z, RELIGION)
    assert stats.empathy_gap(3 * Z + 7, RELIGION) == pytest.approx(3 * delta)


@pytest.mark.parametrize(
    ("Z", "labels"),
    [(np.zeros((3, 4)), ["a", "b", "c"]), (np.zeros((3, 3)), ["a", "b"]), (np.zeros((2, 2)), "xx")],
)
def test_gap_rejects_bad_input(Z, labels):
    with pytest.raises(ProbekitError):
        stats.empathy_gap(Z, list(labels))


# --- permutation test ---------------------------------------------------------------------


def test_permutation_detects_planted_effect():
    rng = np.random.default_rng(3)
    Z = stats.zscore(rng.normal(size=(21, 21)) + 3 * np.eye(21))
    result = stats.permutation_test(Z, [str(i) for i in range(21)], n=2000, seed=0)
    assert result.delta == pytest.approx(stats.empathy_gap(Z, [str(i) for i in range(21)]))
    assert result.delta > result.high > 0 > result.low
    assert result.significant
    assert result.p_value == pytest.approx(1 / 2001)
    assert result.permuted.shape == (2000,)


def test_permutation_is_seeded():
    Z = np.random.default_rng(4).normal(size=(5, 5))
    first = stats.permutation_test(Z, RELIGION, n=500, seed=7)
    again = stats.permutation_test(Z, RELIGION, n=500, seed=7)
    np.testing.assert_array_equal(first.permuted, again.permuted)


def test_permutation_shuffles_whole_rows_and_columns():
    Z = np.random.default_rng(5).normal(size=(3, 3))
    labels = ["a", "b", "c"]
    reachable = [
        stats.empathy_gap(Z[np.ix_(rows, cols)], labels)
        for rows in itertools.permutations(range(3))
        for cols in itertools.permutations(range(3))
    ]
    permuted = stats.permutation_test(Z, labels, n=300).permuted
    gaps = np.abs(permuted[:, None] - np.asarray(reachable)[None, :])
    assert gaps.min(axis=1).max() < 1e-12


def test_permutation_of_perceiver_effect_alone_is_null():
    # A pure perceiver effect (constant rows) has no in-group structure under any row/column
    # shuffle; shuffling single cells would produce non-zero gaps.
    Z = np.repeat(np.arange(5.0)[:, None], 5, axis=1)
    result = stats.permutation_test(Z, RELIGION, n=1000)
    np.testing.assert_allclose(result.permuted, 0, atol=1e-12)


def test_permutation_p_values_uniform_under_null():
    rng = np.random.default_rng(6)
    p_values = np.array(
        [
            stats.permutation_test(rng.normal(size=(5, 5)), RELIGION, n=199, seed=s).p_value
            for s in range(300)
        ]
    )
    assert 0.01 <= np.mean(p_values < 0.05) <= 0.10
    assert scipy_stats.kstest(p_values, "uniform").pvalue > 0.001


def test_permutation_is_fast():
    Z = np.random.default_rng(7).normal(size=(21, 21))
    start = time.perf_counter()
    stats.permutation_test(Z, [str(i) for i in range(21)], n=10000)
    assert time.perf_counter() - start < 1.0


# --- z-score ------------------------------------------------------------------------------


def test_zscore_over_all_cells_with_population_std():
    M = np.random.default_rng(8).uniform(0, 100, size=(6, 6))
    Z = stats.zscore(M)
    assert Z.mean() == pytest.approx(0, abs=1e-12)
    assert Z.std(ddof=0) == pytest.approx(1)
    np.testing.assert_allclose(Z, (M - M.mean()) / M.std())
    np.testing.assert_allclose(stats.zscore(5 * M + 2), Z)


def test_zscore_rejects_constant_matrix():
    with pytest.raises(ProbekitError):
        stats.zscore(np.full((3, 3), 4.0))


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
    named = stats.exclude_events(scores, GROUPS[1:], "generate")
    assert named.kept == ("e0", "e2", "e3")
    assert named.rate == pytest.approx(1 / 4)
    full = stats.exclude_events(scores, GROUPS, "generate")
    assert full.kept == ("e0", "e3")
    assert full.n_events == 4
    assert full.rate == pytest.approx(1 / 2)


def test_ev_exclusion_uses_valid_mass_threshold():
    cube = np.ones((3, 3, 3))
    scores = scores_frame(cube, GROUPS, column="expected").assign(valid_mass=0.9)
    threshold = stats.DEFAULT_MIN_VALID_MASS
    below = (scores.event_id == "e0") & (scores.perceiver == "a Muslim")
    scores.loc[below, "valid_mass"] = 0.98 * threshold
    scores.loc[scores.event_id == "e1", "valid_mass"] = threshold  # exactly at it: kept
    result = stats.exclude_events(scores, GROUPS, "ev")
    assert result.kept == ("e1", "e2")
    lenient = stats.exclude_events(scores, GROUPS, "ev", min_valid_mass=0.5 * threshold)
    assert lenient.kept == ("e0", "e1", "e2")


def test_exclusion_rejects_unknown_mode_and_missing_columns():
    with pytest.raises(ProbekitError, match="mode"):
        stats.exclude_events(small_scores(), GROUPS, "sample")
    with pytest.raises(ProbekitError, match="valid_mass"):
        stats.exclude_events(small_scores().rename(columns={"parsed": "expected"}), GROUPS, "ev")


def test_intensity_matrix_rows_are_perceivers_over_kept_events():
    cube = np.random.default_rng(9).uniform(0, 100, size=(3, 3, 5))
    scores = scores_frame(cube, GROUPS, column="expected").sample(frac=1, random_state=0)
    np.testing.assert_allclose(stats.intensity_matrix(scores, GROUPS), cube.mean(axis=2))
    kept = ["e4", "e1"]
    np.testing.assert_allclose(stats.event_cube(scores, GROUPS, events=kept), cube[:, :, [4, 1]])
    reordered = stats.intensity_matrix(scores, GROUPS[::-1], events=kept)
    np.testing.assert_allclose(reordered, cube[::-1, ::-1][:, :, [4, 1]].mean(axis=2))


def test_event_cube_rejects_incomplete_or_duplicate_scores():
    scores = small_scores()
    with pytest.raises(ProbekitError, match="incomplete: 1 of 4"):
        stats.event_cube(scores.drop(index=5), GROUPS, "parsed")
    with pytest.raises(ProbekitError, match="duplicate"):
        stats.event_cube(pd.concat([scores, scores.iloc[:1]]), GROUPS, "parsed")
    with pytest.raises(ProbekitError, match="excluded"):
        stats.event_cube(scores, GROUPS, "parsed", events=[])


# --- cell-wise t-tests --------------------------------------------------------------------


def planted_cube() -> np.ndarray:
    """4 groups (`a person` first), 40 events sharing a per-event offset, plus small noise.

    Cell means: in-group (1,1) = (2,2) = 80 and (3,3) = 50; out-group cells 50, except
    (2,1) = 80. Only (1,2) differs from both its in-group cells (1,1) and (2,2).
    """
    rng = np.random.default_rng(10)
    means = np.full((4, 4), 50.0)
    means[1, 1] = means[2, 2] = means[2, 1] = 80
    means[0, :] = means[:, 0] = 80
    offsets = rng.normal(0, 10, size=40)
    return means[:, :, None] + offsets + rng.normal(0, 1, size=(4, 4, 40))


def test_shown_mask_needs_both_tests_significant():
    expected = np.ones((4, 4), dtype=bool)
    expected[2, 1] = False  # equal to both its in-group cells
    expected[3, 1] = expected[3, 2] = False  # equal to the perceiver's in-group cell (3,3)
    expected[1, 3] = expected[2, 3] = False  # equal to the experiencer's in-group cell (3,3)
    np.testing.assert_array_equal(stats.shown_mask(planted_cube()), expected)


def test_cell_pvalues_are_paired_tests_against_in_group_cells():
    X = planted_cube()
    p_perceiver, p_experiencer = stats.cell_pvalues(X)
    assert p_perceiver[1, 2] == pytest.approx(scipy_stats.ttest_rel(X[1, 1], X[1, 2]).pvalue)
    assert p_experiencer[1, 2] == pytest.approx(scipy_stats.ttest_rel(X[2, 2], X[1, 2]).pvalue)
    assert np.isnan(p_perceiver[0, 1]) and np.isnan(p_experiencer[2, 2])


def test_shown_mask_uses_bonferroni_over_all_groups():
    # Event-wise differences m + s·(±1): t = m / (s·sqrt(E/(E−1)) / sqrt(E)), E = 10, so
    # p = 0.01 passes 0.05 but not the Bonferroni level 0.05 / 4² ≈ 0.0031.
    E = 10
    t = scipy_stats.t.isf(0.005, df=E - 1)
    signs = np.tile([1.0, -1.0], E // 2)
    X = np.zeros((4, 4, E))
    X[1, 2] = t * np.sqrt(E / (E - 1)) / np.sqrt(E) + signs
    X[1, 1] = X[2, 2] = 0.0
    p_perceiver, p_experiencer = stats.cell_pvalues(X)
    assert p_perceiver[1, 2] == pytest.approx(0.01)
    assert p_experiencer[1, 2] == pytest.approx(0.01)
    assert not stats.shown_mask(X)[1, 2]
    assert stats.shown_mask(X, alpha=0.05 * 16)[1, 2]


def test_shown_mask_without_reference_tests_first_row():
    X = np.zeros((3, 3, 5))
    assert stats.shown_mask(X)[0, 2]
    assert not stats.shown_mask(X, reference=None)[0, 2]


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
    scores.loc[failed, "valid_mass"] = 0.2 * stats.DEFAULT_MIN_VALID_MASS
    return scores, groups


def test_summarize_generate_mode():
    scores, groups = religion_scores("generate")
    summary = stats.summarize(scores, groups, mode="generate", seed=0, n_permutations=1000)
    assert summary.exclusion_rate == pytest.approx(1 / 30)
    assert summary.heatmap_exclusion_rate == pytest.approx(2 / 30)
    assert (summary.n_events, summary.n_kept, summary.heatmap_n_kept) == (30, 29, 28)
    named_events = [f"e{e}" for e in range(30) if e != 0]
    gap_Z = stats.zscore(stats.intensity_matrix(scores, RELIGION, "parsed", named_events))
    assert summary.delta == pytest.approx(stats.empathy_gap(gap_Z, RELIGION))
    assert summary.delta > summary.high and summary.significant
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
    with_reference = stats.summarize(scores, groups, labels=groups, n_permutations=200)
    named_only = stats.summarize(scores, groups, labels=RELIGION, n_permutations=200)
    assert with_reference.to_dict() == named_only.to_dict()
    assert with_reference.n_kept == 29
    full_matrix = stats.intensity_matrix(
        scores, groups, events=[f"e{e}" for e in range(30) if e != 5]
    )
    assert with_reference.mean == pytest.approx(full_matrix.mean())
    assert with_reference.std == pytest.approx(full_matrix.std())


def test_summarize_requires_reference_first():
    scores, groups = religion_scores("ev")
    with pytest.raises(ProbekitError, match="a person"):
        stats.summarize(scores, groups[::-1])
