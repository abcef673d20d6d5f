"""How many units a finding needs: the share of significant results on resamples of each size.

For a finished run, draw `size` units with replacement (a bootstrap of a smaller or equal study),
apply the significance test, and repeat; the power at that size is the share of significant
resamples. The smallest size whose power reaches the target (80 % by default) is the number of
units a replication should plan for. Sizes above the run's own unit count are not extrapolated.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from probekit.core.errors import ProbekitError, StatisticsError

DEFAULT_POWER = 0.8


@dataclass(frozen=True, eq=False)
class PowerCurve:
    """Power at each tried size, and the smallest size that reaches `target` (None if none)."""

    sizes: tuple[int, ...]
    power: tuple[float, ...]
    target: float
    needed: int | None

    def describe(self, unit: str = "unit") -> str:
        """One line: `24 events`; `≤ 3 events` when the smallest size tried already reaches the
        target; `> 48 events` when even the largest size falls short."""
        if self.needed is not None:
            at_most = "≤ " if self.needed == self.sizes[0] else ""
            return f"{at_most}{self.needed} {unit}s"
        return f"> {self.sizes[-1]} {unit}s ({self.power[-1]:.0%} power at {self.sizes[-1]})"


def default_sizes(n_units: int, smallest: int = 3, step: float = 1.5) -> list[int]:
    """A geometric grid from `smallest` to `n_units` (always included)."""
    sizes, size = [], float(smallest)
    while size < n_units:
        sizes.append(int(round(size)))
        size *= step
    return sorted({*sizes, n_units})


def units_for_power(
    n_units: int,
    significant: Callable[[np.ndarray], bool],
    sizes: Sequence[int] | None = None,
    n_resamples: int = 100,
    seed: int = 0,
    target: float = DEFAULT_POWER,
) -> PowerCurve:
    """Power of `significant(unit indices)` at each size (default grid up to `n_units`),
    stopping at the first size that reaches `target`."""
    if n_units < 2:
        raise StatisticsError(f"a power analysis needs at least 2 units, got {n_units}")
    if not 0 < target < 1:
        raise ProbekitError(f"the target power must lie in (0, 1), got {target}")
    rng = np.random.default_rng(seed)
    tried: list[int] = []
    power: list[float] = []
    for size in sizes or default_sizes(n_units):
        hits = sum(bool(significant(rng.integers(0, n_units, size))) for _ in range(n_resamples))
        tried.append(int(size))
        power.append(hits / n_resamples)
        if power[-1] >= target:
            break
    needed = tried[-1] if power[-1] >= target else None
    return PowerCurve(tuple(tried), tuple(power), target, needed)
