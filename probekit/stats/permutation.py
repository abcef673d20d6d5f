"""The structured permutation test of the in-group minus out-group gap of a square matrix.

Rows and columns of the matrix are identities (e.g. perceiver × experiencer) carrying in-group
labels; a cell is in-group when its row and column share a label.

Shuffling the rows and, independently, the columns gives each row i a label ρ(i) and each column
j a label γ(j), uniformly over the arrangements of the label multiset, and the permuted gap only
depends on which cells get equal labels. With few groups there are few such outcomes: with k
distinct labels (religion: 5) only the matching σ = γ⁻¹ ∘ ρ matters, k! of them (120). When the
outcomes are no more than the requested permutations they are enumerated, each once, so the null
distribution, its interval and p are exact; otherwise `n` shuffles are sampled.
"""

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from probekit.core.errors import ProbekitError, StatisticsError
from probekit.core.public import public

# Permuted Δs equal to the observed one up to float rounding count as at least as extreme.
_TIE_TOLERANCE = 1e-12


def _square(Z: np.ndarray) -> np.ndarray:
    """`Z` as a square float matrix with a value in every cell; one line otherwise (an empty
    or NaN cell has no mean to compare, and would make Δ NaN without a word)."""
    try:
        Z = np.asarray(Z, dtype=float)
    except (TypeError, ValueError):
        raise ProbekitError("Z must be a square matrix of numbers") from None
    if Z.ndim != 2 or Z.shape[0] != Z.shape[1]:
        raise ProbekitError(f"expected a square matrix, got shape {Z.shape}")
    if Z.size == 0:
        raise StatisticsError("the matrix is empty; the empathy gap needs at least two groups")
    missing = int((~np.isfinite(Z)).sum())
    if missing:
        raise StatisticsError(
            f"{missing} of the {Z.size} cells of the matrix are NaN or infinite; the empathy gap "
            "needs a value in every cell"
        )
    return Z


def _in_group(labels: Sequence[str], size: int) -> np.ndarray:
    """Boolean mask of the in-group cells: row and column carry the same label."""
    labels = np.asarray(labels)
    if labels.shape != (size,):
        raise ProbekitError(f"got {labels.size} group labels for a {size}x{size} matrix")
    inside = labels[:, None] == labels[None, :]
    if inside.all():
        raise StatisticsError("every cell is in-group; the empathy gap needs two distinct labels")
    return inside


@public()
def empathy_gap(Z: np.ndarray, labels: Sequence[str]) -> float:
    """Δ = mean of Z over in-group cells − mean over out-group cells (Z is used as given)."""
    Z = _square(Z)
    inside = _in_group(labels, len(Z))
    return float(Z[inside].mean() - Z[~inside].mean())


@dataclass(frozen=True, eq=False)
class PermutationResult:
    """Observed Δ, the 2.5–97.5 percentile interval of the null (permuted) Δs, and the one-sided
    p for in-group favouritism (permuted Δ ≥ observed, ties counted).

    `exact`: the null was enumerated (`permuted` holds every outcome once, p = share of them);
    else sampled (p with the +1 correction, (count + 1) / (n + 1))."""

    delta: float
    low: float
    high: float
    p_value: float
    permuted: np.ndarray
    exact: bool = False

    @property
    def significant(self) -> bool:
        """The paper's criterion: the observed Δ lies outside the null interval (2.5–97.5 %)."""
        return not self.low <= self.delta <= self.high

    @property
    def smallest_p(self) -> float:
        """The smallest p this test can give: 1 / outcomes (exact) or 1 / (n + 1)."""
        return 1 / len(self.permuted) if self.exact else 1 / (len(self.permuted) + 1)


@public()
def permutation_test(
    Z: np.ndarray, labels: Sequence[str], n: int = 10000, seed: int = 0
) -> PermutationResult:
    """Structured permutation test of Δ: shuffle rows and, independently, columns of Z.

    The labels stay in place, so the in-group mask no longer lines up with the groups, while
    each perceiver's row and each experiencer's column stay intact (cells are never shuffled
    one by one). When the distinct outcomes number at most `n` they are enumerated exactly;
    otherwise `n` shuffles are drawn with `seed`.
    """
    Z = _square(Z)
    inside = _in_group(labels, len(Z))
    if n < 1:
        raise ProbekitError(f"the permutation test needs at least 1 permutation, got {n}")
    delta = empathy_gap(Z, labels)
    in_cells = int(inside.sum())
    in_sum = _exact_in_group_sums(Z, labels, n)
    exact = in_sum is not None
    if in_sum is None:
        in_sum = _sampled_in_group_sums(Z, inside, n, seed)
    # A permuted matrix keeps its total, so the out-group sum is the total minus the in-group sum.
    permuted = in_sum / in_cells - (Z.sum() - in_sum) / (Z.size - in_cells)
    low, high = np.percentile(permuted, [2.5, 97.5])
    extreme = np.count_nonzero(permuted >= delta - _TIE_TOLERANCE)
    p_value = extreme / len(permuted) if exact else (extreme + 1) / (n + 1)
    return PermutationResult(delta, float(low), float(high), float(p_value), permuted, exact)


def _sampled_in_group_sums(Z: np.ndarray, inside: np.ndarray, n: int, seed: int) -> np.ndarray:
    """In-group sums of `n` matrices with rows and columns shuffled independently."""
    rng = np.random.default_rng(seed)
    order = np.tile(np.arange(len(Z)), (n, 1))
    rows = rng.permuted(order, axis=1)
    cols = rng.permuted(order, axis=1)
    # Permuted matrix k has cell (a, b) = Z[rows[k, a], cols[k, b]].
    a, b = np.nonzero(inside)
    return Z[rows[:, a], cols[:, b]].sum(axis=1)


def _exact_in_group_sums(Z: np.ndarray, labels: Sequence[str], n: int) -> np.ndarray | None:
    """Every equally likely outcome's in-group sum, or None when there are more than `n`."""
    k = len(Z)
    counts = Counter(labels)
    if len(counts) == k:  # distinct labels: one outcome per matching of rows to columns
        if math.factorial(k) > n:
            return None
        matchings = np.array(list(itertools.permutations(range(k))))
        return Z[np.arange(k), matchings].sum(axis=1)
    arrangements = math.factorial(k) // math.prod(math.factorial(c) for c in counts.values())
    if arrangements**2 > n:
        return None
    codes = {label: i for i, label in enumerate(counts)}
    ordered = np.array(list(_arrangements([codes[label] for label in labels])))  # [M, k]
    same = ordered[:, None, :, None] == ordered[None, :, None, :]  # [M rows, M cols, k, k]
    return (same * Z).sum(axis=(2, 3)).reshape(-1)


def _arrangements(items: list[int]) -> Iterator[tuple[int, ...]]:
    """The distinct orderings of a multiset, each once."""
    if not items:
        yield ()
        return
    for first in sorted(set(items)):
        rest = list(items)
        rest.remove(first)
        for tail in _arrangements(rest):
            yield (first, *tail)
