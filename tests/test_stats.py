"""Study-generic statistics (probekit.stats) on synthetic data with known answers."""

import itertools

import numpy as np
import pandas as pd
import pytest
from conftest import ETHNICITY_LABELS
from scipy import stats as scipy_stats

from probekit import stats
from probekit.core.errors import ProbekitError, StatisticsError

RELIGION = ["a Christian", "a Muslim", "a Jew", "a Buddhist", "a Hindu"]


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


def test_permutation_is_seeded_when_sampled():
    Z = np.random.default_rng(4).normal(size=(5, 5))
    first = stats.permutation_test(Z, RELIGION, n=100, seed=7)  # 100 < 5! outcomes: sampled
    again = stats.permutation_test(Z, RELIGION, n=100, seed=7)
    other = stats.permutation_test(Z, RELIGION, n=100, seed=8)
    assert not first.exact and first.permuted.shape == (100,)
    np.testing.assert_array_equal(first.permuted, again.permuted)
    assert not np.array_equal(first.permuted, other.permuted)
    assert first.smallest_p == pytest.approx(1 / 101)


@pytest.mark.parametrize("labels", [list("abcde"), list("xxyyz")], ids=["distinct", "blocks"])
def test_exact_enumeration_equals_brute_force_over_all_shuffles(labels):
    """Few outcomes (5! matchings; 30 x 30 label arrangements) are enumerated: the one-sided p and
    the null interval equal those of every one of the 5! x 5! row and column shuffles."""
    Z = np.random.default_rng(13).normal(size=(5, 5)) + 0.8 * np.eye(5)
    every = np.array(
        [
            stats.empathy_gap(Z[np.ix_(rows, cols)], labels)
            for rows in itertools.permutations(range(5))
            for cols in itertools.permutations(range(5))
        ]
    )
    result = stats.permutation_test(Z, labels, n=10000, seed=3)
    assert result.exact
    assert result.p_value == pytest.approx(np.mean(every >= result.delta - 1e-12))
    assert (result.low, result.high) == pytest.approx(tuple(np.percentile(every, [2.5, 97.5])))
    np.testing.assert_allclose(
        np.sort(np.unique(result.permuted.round(12))), np.sort(np.unique(every.round(12)))
    )
    assert len(result.permuted) == (120 if len(set(labels)) == 5 else 900)


def test_religion_smallest_exact_p_is_one_in_120():
    Z = np.random.default_rng(2).normal(size=(5, 5)) + 5 * np.eye(5)
    result = stats.permutation_test(Z, RELIGION)
    assert result.exact and result.p_value == pytest.approx(1 / 120) == result.smallest_p


def test_one_sided_p_counts_only_favouritism():
    """An out-group preference (Δ < 0) is not in-group favouritism: one-sided p near 1."""
    Z = np.random.default_rng(3).normal(size=(21, 21)) - 3 * np.eye(21)
    result = stats.permutation_test(Z, [str(i) for i in range(21)], n=500, seed=0)
    assert result.delta < result.low and result.significant
    assert result.p_value == pytest.approx(1.0)


def test_permutation_shuffles_whole_rows_and_columns():
    Z = np.random.default_rng(5).normal(size=(3, 3))
    labels = ["a", "b", "c"]
    reachable = [
        stats.empathy_gap(Z[np.ix_(rows, cols)], labels)
        for rows in itertools.permutations(range(3))
        for cols in itertools.permutations(range(3))
    ]
    permuted = stats.permutation_test(Z, labels, n=4, seed=0).permuted  # 4 < 3!: sampled
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
    np.testing.assert_array_equal(stats.shown_mask(planted_cube(), reference=0), expected)


def test_cell_pvalues_are_paired_tests_against_in_group_cells():
    X = planted_cube()
    p_perceiver, p_experiencer = stats.cell_pvalues(X, reference=0)
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
    assert stats.shown_mask(X, reference=0)[0, 2]
    assert not stats.shown_mask(X, reference=None)[0, 2]
    assert not stats.shown_mask(X)[0, 2]  # the generic default tests every off-diagonal cell


# --- unit-level exclusion -----------------------------------------------------------------


def question_table() -> pd.DataFrame:
    """Three questions, first seen in the order q3, q1, q2, two rows each."""
    return pd.DataFrame(
        {
            "question": ["q3", "q1", "q2", "q3", "q1", "q2"],
            "group": ["x", "x", "x", "y", "y", "y"],
            "expected": [1.0, 2.0, 3.0, 4.0, 5.0, np.nan],
            "valid_mass": [0.5, 0.001, 0.5, 0.5, np.nan, 0.5],
            "parsed": [3, -1, 2, np.nan, 4, 1],
        },
        index=[10, 11, 12, 13, 14, 15],
    )


def test_exclusion_drops_unit_with_one_failed_row_and_keeps_order():
    table = question_table()
    failed = pd.Series([False, False, True, False, False, False], index=table.index)
    result = stats.exclude_units(table, "question", failed)
    assert result.kept == ("q3", "q1")
    assert result.n_units == 3
    assert result.rate == pytest.approx(1 / 3)
    nothing_failed = pd.Series(False, index=table.index)
    assert stats.exclude_units(table, "question", nothing_failed).kept == ("q3", "q1", "q2")


def test_exclusion_predicates_mark_failed_rows():
    table = question_table()
    low = stats.low_valid_mass(table, 0.01)
    assert low.tolist() == [False, True, False, False, True, True]  # mass, NaN mass, NaN value
    assert stats.low_valid_mass(table, 0.6).all()
    assert stats.unparsed(table).tolist() == [False, True, False, True, False, False]
    either = stats.low_valid_mass(table, 0.01) | stats.unparsed(table)
    assert stats.exclude_units(table, "question", either).kept == ()


def test_exclusion_rejects_misaligned_mask_and_missing_columns():
    table = question_table()
    with pytest.raises(ProbekitError, match="index"):
        stats.exclude_units(table, "question", pd.Series([False] * 6))
    with pytest.raises(ProbekitError, match="event_id"):
        stats.exclude_units(table, "event_id", pd.Series(False, index=table.index))
    with pytest.raises(ProbekitError, match="valid_mass"):
        stats.low_valid_mass(table.drop(columns="valid_mass"), 0.01)


# --- grouped means ------------------------------------------------------------------------


def emotion_table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model": ["m1", "m1", "m1", "m1", "m2", "m2"],
            "group": ["x", "y", "x", "y", "x", "x"],
            "event_id": ["e1", "e1", "e2", "e2", "e1", "e2"],
            "p::joy": [0.1, 0.2, 0.3, 0.6, 0.5, 0.9],
        }
    )


def test_grouped_means_of_an_arbitrary_column():
    means = stats.grouped_means(emotion_table(), by=["model", "group"], value="p::joy")
    assert list(means.columns) == ["model", "group", "p::joy", "n_rows"]
    assert means[["model", "group"]].values.tolist() == [["m1", "x"], ["m1", "y"], ["m2", "x"]]
    np.testing.assert_allclose(means["p::joy"], [0.2, 0.4, 0.7])
    assert means["n_rows"].tolist() == [2, 2, 2]


def test_grouped_means_over_chosen_units():
    table = emotion_table()
    means = stats.grouped_means(table, ["group"], "p::joy", unit="event_id", units=["e2"])
    assert means["group"].tolist() == ["x", "y"]
    np.testing.assert_allclose(means["p::joy"], [(0.3 + 0.9) / 2, 0.6])
    with pytest.raises(ProbekitError, match="unit column"):
        stats.grouped_means(table, ["group"], "p::joy", units=["e2"])
    with pytest.raises(ProbekitError, match="no scores"):
        stats.grouped_means(table, ["group"], "p::joy", unit="event_id", units=[])


def test_grouped_means_do_not_skip_missing_scores():
    table = emotion_table()
    table.loc[0, "p::joy"] = np.nan
    means = stats.grouped_means(table, ["group"], "p::joy")
    assert np.isnan(means["p::joy"][0])
    assert means["p::joy"][1] == pytest.approx(0.4)


def test_score_cube_takes_any_key_columns_and_rectangular_keys():
    cube = np.arange(2 * 3 * 2, dtype=float).reshape(2, 3, 2)
    table = pd.DataFrame(
        [
            {"model": m, "item": i, "question": f"q{u}", "score": cube[a, b, u]}
            for a, m in enumerate(["m1", "m2"])
            for b, i in enumerate(["i1", "i2", "i3"])
            for u in range(2)
        ]
    ).iloc[::-1]
    items = ["i1", "i2", "i3"]
    X = stats.score_cube(table, "score", "model", "item", "question", ["m1", "m2"], items)
    np.testing.assert_array_equal(X, cube[:, :, ::-1])  # units in first-seen order: q1, q0
    swapped = stats.score_cube(
        table, "score", "model", "item", "question", ["m2", "m1"], ["i3", "i1"], units=["q0"]
    )
    np.testing.assert_array_equal(swapped[:, :, 0], cube[::-1][:, [2, 0], 0])
    with pytest.raises(ProbekitError, match="twice"):
        stats.score_cube(table, "score", "model", "item", "question", ["m1", "m1"])
    with pytest.raises(ProbekitError, match="incomplete: 2 of 2"):
        stats.score_cube(
            table.iloc[1:-1], "score", "model", "item", "question", ["m1", "m2"], items
        )


# --- bootstrap ----------------------------------------------------------------------------


def unit_scores(n_units: int, seed: int = 0) -> pd.DataFrame:
    """`n_units` units of 3 rows each; a unit's rows share its level plus small noise."""
    rng = np.random.default_rng(seed)
    level = np.repeat(rng.normal(10, 2, size=n_units), 3)
    return pd.DataFrame(
        {
            "unit": np.repeat([f"u{u}" for u in range(n_units)], 3),
            "score": level + rng.normal(0, 0.1, size=3 * n_units),
        }
    )


def mean_score(df: pd.DataFrame) -> float:
    return float(df["score"].mean())


def test_bootstrap_is_seeded():
    table = unit_scores(40)
    first = stats.bootstrap_ci(table, "unit", mean_score, n=200, seed=5)
    again = stats.bootstrap_ci(table, "unit", mean_score, n=200, seed=5)
    other = stats.bootstrap_ci(table, "unit", mean_score, n=200, seed=6)
    np.testing.assert_array_equal(first.resampled, again.resampled)
    assert (first.low, first.high) == (again.low, again.high)
    assert not np.array_equal(first.resampled, other.resampled)
    assert first.resampled.shape == (200,)


def test_bootstrap_interval_contains_estimate_and_shrinks_with_units():
    few = stats.bootstrap_ci(unit_scores(20), "unit", mean_score, n=1000)
    many = stats.bootstrap_ci(unit_scores(500), "unit", mean_score, n=1000)
    for result, table in ((few, unit_scores(20)), (many, unit_scores(500))):
        assert result.estimate == pytest.approx(table["score"].mean())
        assert result.low < result.estimate < result.high
        assert result.low == pytest.approx(np.percentile(result.resampled, 2.5))
    assert many.high - many.low < (few.high - few.low) / 2


def test_bootstrap_normal_interval_is_mean_plus_minus_1_96_std():
    result = stats.bootstrap_ci(unit_scores(30), "unit", mean_score, method="normal")
    center, spread = result.resampled.mean(), result.resampled.std()
    assert result.low == pytest.approx(center - 1.96 * spread, rel=1e-4)
    assert result.high == pytest.approx(center + 1.96 * spread, rel=1e-4)
    wider = stats.bootstrap_ci(unit_scores(30), "unit", mean_score, level=0.99, method="normal")
    assert wider.high - wider.low > result.high - result.low


def test_bootstrap_moves_whole_units():
    table = unit_scores(25)
    within = table.groupby("unit")["score"].agg(lambda s: tuple(s))
    seen = []

    def rows_per_unit(df: pd.DataFrame) -> float:
        sizes = df.groupby("unit").size()
        seen.append(set(df.groupby("unit")["score"].agg(lambda s: tuple(s))))
        return float(sizes.nunique() == 1 and sizes.iloc[0] == 3 and len(sizes) == 25)

    result = stats.bootstrap_ci(table, "unit", rows_per_unit, n=50)
    assert (result.resampled == 1).all()
    assert all(draws <= set(within) for draws in seen)


def test_a_batched_statistic_gives_the_per_resample_interval():
    """`batched=True` reads the same draws in one call per chunk: the same resampled values
    (to rounding), the same estimate, for any chunking; a wrong shape is one line."""
    values = np.random.default_rng(2).normal(size=37)
    plain = stats.bootstrap_units(37, lambda d: values[d].mean(), n=300, seed=4)
    batched = stats.bootstrap_units(37, lambda d: values[d].mean(-1), n=300, seed=4, batched=True)
    np.testing.assert_allclose(batched.resampled, plain.resampled, rtol=0, atol=1e-14)
    assert batched.estimate == pytest.approx(plain.estimate, abs=1e-14)
    assert (batched.low, batched.high) == pytest.approx((plain.low, plain.high), abs=1e-14)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("probekit.stats.bootstrap.BATCH_CELLS", 100)  # 2 resamples per chunk
        chunked = stats.bootstrap_units(37, lambda d: values[d].mean(-1), 300, 4, batched=True)
    np.testing.assert_array_equal(chunked.resampled, batched.resampled)
    with pytest.raises(ProbekitError, match="one value per resample"):
        stats.bootstrap_units(37, lambda d: values[d], n=10, batched=True)


def test_bootstrap_mean_is_the_table_bootstrap_of_a_mean():
    table = unit_scores(23).sample(frac=1, random_state=1)  # units in no order
    table.loc[table.index[:4], "score"] = np.nan  # skipped, as pandas' mean skips them
    table.loc[table["unit"] == table["unit"].iloc[0], "score"] = np.nan  # a unit of NaN only
    fast = stats.bootstrap_mean(table, "unit", "score", n=400, seed=3)
    slow = stats.bootstrap_ci(table, "unit", mean_score, n=400, seed=3)
    np.testing.assert_allclose(fast.resampled, slow.resampled, rtol=1e-12)
    assert fast.estimate == pytest.approx(slow.estimate, rel=1e-12)
    assert (fast.low, fast.high) == pytest.approx((slow.low, slow.high), rel=1e-12)
    with pytest.raises(ProbekitError, match="missing values"):
        stats.bootstrap_mean(table.assign(unit=None), "unit", "score")


def test_mean_ratio_is_nan_where_the_drawn_denominator_is_zero():
    numerator, denominator = np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.0, 4.0])
    ratio = stats.mean_ratio(numerator, denominator)
    draws = np.array([[0, 1, 2], [0, 0, 1], [2, 2, 0]])
    expected = [6 / 4, np.nan, 7 / 8]
    np.testing.assert_allclose(ratio(draws), expected)
    assert ratio(np.arange(3)) == pytest.approx(6 / 4)


def test_bootstrap_rejects_bad_arguments():
    table = unit_scores(5)
    with pytest.raises(ProbekitError, match="method"):
        stats.bootstrap_ci(table, "unit", mean_score, method="bca")
    with pytest.raises(ProbekitError, match="level"):
        stats.bootstrap_ci(table, "unit", mean_score, level=95)
    with pytest.raises(ProbekitError, match="resample"):
        stats.bootstrap_ci(table, "unit", mean_score, n=0)


# --- no statistic of nothing ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: stats.empathy_gap(np.full((3, 3), np.nan), ["a", "b", "c"]),
            "9 of the 9 cells of the matrix are NaN or infinite",
        ),
        (
            lambda: stats.empathy_gap(np.where(np.eye(3) > 0, np.nan, 1.0), ["a", "b", "c"]),
            "3 of the 9 cells of the matrix are NaN",
        ),
        (lambda: stats.empathy_gap(np.zeros((0, 0)), []), "the matrix is empty"),
        (
            lambda: stats.permutation_test(np.full((3, 3), np.nan), ["a", "b", "c"]),
            "cells of the matrix are NaN",
        ),
        (
            lambda: stats.bootstrap_mean(
                pd.DataFrame({"u": [1, 2], "x": [np.nan, np.nan]}), "u", "x"
            ),
            "the column 'x' has no values",
        ),
        (
            lambda: stats.bootstrap_ci(
                pd.DataFrame({"u": [1, 2], "x": [np.nan, np.nan]}), "u", lambda d: d.x.mean()
            ),
            "the statistic is NaN on the whole table",
        ),
        (
            lambda: stats.bootstrap_ci(pd.DataFrame({"u": [], "x": []}), "u", lambda d: 0.0),
            "cannot bootstrap an empty score table",
        ),
    ],
)
def test_all_nan_or_empty_input_is_one_line_not_nan(call, message):
    """A statistic of nothing is refused (a StatisticsError) rather than returned as NaN."""
    with pytest.raises(StatisticsError, match=message) as error:
        call()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: stats.bootstrap_mean("x", "u", "x"), r"df must be a DataFrame \(got 'x'\)"),
        (
            lambda: stats.bootstrap_mean(pd.DataFrame({"u": [1]}), "u", "u", n="3"),
            r"n must be an integer \(got '3'\)",
        ),
        (
            lambda: stats.bootstrap_ci(pd.DataFrame({"u": [1]}), "u", "mean"),
            r"statistic must be a function \(got 'mean'\)",
        ),
        (
            lambda: stats.bootstrap_mean(pd.DataFrame({"u": [1]}), "u", "u", levels=0.9),
            r"unknown keyword levels for bootstrap_mean\(\); did you mean level\?",
        ),
        (
            lambda: stats.permutation_test(np.eye(3), ["a", "b", "c"], n=2.5),
            r"n must be an integer \(got 2.5\)",
        ),
    ],
)
def test_wrong_kinds_are_one_line_naming_the_keyword(call, message):
    with pytest.raises(ProbekitError, match=message):
        call()
