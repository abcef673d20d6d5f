"""Tests over a study's units and their adjustment for the family read together.

A mechanism reads many numbers at once (one per layer of the lens, one per patched component),
so a p value read alone overstates what one of them shows. probekit adjusts each family with
Holm's step-down method (Holm 1979): the k-th smallest of m p values is multiplied by m - k + 1,
and the adjusted values are made non-decreasing; it controls the family-wise error rate under
any dependence between the tests, without a model of it. The per-unit test is the sign-flip
(randomisation) test of a mean of zero: under the null a unit's value is as likely negative as
positive, so flipping the signs of the units' values gives the null distribution of their mean
(every one of the 2^n flips when they are at most `n`, else `n` seeded draws).
"""

import itertools

import numpy as np

from probekit.core.errors import ProbekitError

# Flipped means equal to the observed one up to float rounding count as at least as extreme.
_TIE = 1e-12


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm-adjusted p values of a family, in the given order; NaN entries (not tested) stay
    NaN and do not count in the family's size."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(np.isfinite(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(order)
    scaled = p[order] * (m - np.arange(m))
    out[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return out


def sign_flip_test(values: np.ndarray, n: int = 10000, seed: int = 0) -> float:
    """Two-sided p of the sign-flip test that the units' `values` have mean 0: the share of
    sign flips whose |mean| is at least the observed one (exact over the 2^k flips of k units
    when 2^k <= n, else `n` draws with the +1 correction); NaN without a finite value."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if n < 1:
        raise ProbekitError(f"the sign-flip test needs at least 1 flip, got {n}")
    if len(x) == 0:
        return float("nan")
    observed = abs(x.mean())
    if 2 ** len(x) <= n:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(x))))
        flipped = np.abs(signs @ x) / len(x)
        return float(np.mean(flipped >= observed - _TIE))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(n, len(x)))
    hits = np.count_nonzero(np.abs(signs @ x) / len(x) >= observed - _TIE)
    return float((hits + 1) / (n + 1))


def paired_effect_size(values: np.ndarray) -> float:
    """Cohen's d_z of per-unit differences: their mean over their standard deviation (n - 1);
    NaN with fewer than two finite values or no spread."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2 or x.std(ddof=1) == 0:
        return float("nan")
    return float(x.mean() / x.std(ddof=1))
