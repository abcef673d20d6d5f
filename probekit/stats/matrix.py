"""Matrix normalisation and cell-wise paired t-tests of a cube X[row, column, unit].

A cell (i, j) is tested against the diagonal cells of its row and column, (i, i) and (j, j),
over units; an optional reference row/column (e.g. a neutral identity) is left untested.
"""

import warnings

import numpy as np

from probekit.core.errors import ProbekitError, StatisticsError


def zscore(M: np.ndarray) -> np.ndarray:
    """(M − mean) / std over all cells, population std, as the paper normalises matrices."""
    M = np.asarray(M, dtype=float)
    std = M.std()
    if not np.isfinite(std) or std == 0:
        raise StatisticsError("cannot z-normalise a matrix that is constant or not finite")
    return (M - M.mean()) / std


def cell_pvalues(X: np.ndarray, reference: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Paired t-test p-values of each cell against its diagonal cells, over units.

    Returns (p_row, p_column): cell (i, j) vs (i, i) and vs (j, j). Untested cells (the
    diagonal and the `reference` row and column) are NaN, and so are cells whose unit-wise
    differences are all zero, and every cell of one unit (a test over units needs two).
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 3 or X.shape[0] != X.shape[1]:
        raise ProbekitError(f"expected a cube X[row, column, unit], got shape {X.shape}")
    k = len(X)
    p_row = np.full((k, k), np.nan)
    p_column = np.full((k, k), np.nan)
    if X.shape[2] < 2:
        return p_row, p_column
    tested = ~np.eye(k, dtype=bool)  # off the diagonal, not the reference's row or column
    if reference is not None:
        tested[reference, :] = tested[:, reference] = False
    i, j = np.nonzero(tested)
    from scipy import stats  # on use: scipy is slow to import

    # Zero-variance differences yield NaN p-values (masked below); scipy's warning adds nothing.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p_row[i, j] = stats.ttest_rel(X[i, i], X[i, j], axis=1).pvalue
        p_column[i, j] = stats.ttest_rel(X[j, j], X[i, j], axis=1).pvalue
    return p_row, p_column


def shown_mask(X: np.ndarray, alpha: float = 0.05, reference: int | None = None) -> np.ndarray:
    """Which heatmap cells to show: both paired tests significant at Bonferroni α / k².

    k counts all rows of X, the reference included. The diagonal and the `reference` row and
    column are always shown; every other cell is masked unless it differs significantly from
    both its row's and its column's diagonal cell.
    """
    p_row, p_column = cell_pvalues(X, reference)
    k = len(p_row)
    threshold = alpha / k**2
    shown = (p_row < threshold) & (p_column < threshold)
    shown |= np.eye(k, dtype=bool)
    if reference is not None:
        shown[reference, :] = shown[:, reference] = True
    return shown
