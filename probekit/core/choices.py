"""Multiple-choice answers shown in several orders: which option sits behind which letter.

A question with n options is shown in order k (k = 0 … n-1, the cyclic shifts) with option
`(j + k) % n` behind the j-th letter, so over all n orders every option takes every letter once.
Averaging an option's probability over the orders removes the model's preference for letters
(position bias); that preference itself is the mean P(letter) over all prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.options import option_error

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def letters(n: int) -> tuple[str, ...]:
    """The first `n` capital letters."""
    if not 1 <= n <= len(LETTERS):
        raise ProbekitError(f"a choice needs 1 to {len(LETTERS)} options, not {n}")
    return tuple(LETTERS[:n])


def cyclic_order(n: int, shift: int) -> tuple[int, ...]:
    """Option index shown behind each letter in order `shift`."""
    return tuple((j + shift) % n for j in range(n))


def cyclic_orders(n: int, count: int) -> list[tuple[int, ...]]:
    """The first `count` cyclic orders of `n` options (order 0 is the original)."""
    if not 1 <= count <= n:
        raise option_error(
            "orders", f"must lie between 1 and {n}, the number of options (got {count})"
        )
    return [cyclic_order(n, k) for k in range(count)]


def letter_of(order: Sequence[int], option: int) -> str:
    """The letter behind which `option` is shown in `order`."""
    return LETTERS[list(order).index(option)]


def position_bias(frame: pd.DataFrame, n: int) -> pd.Series:
    """Mean P(letter) over the prompts of `frame` (its `p::<letter>` columns): 1/n each for a
    model without a preference for positions, whatever the options."""
    return frame[[f"p::{x}" for x in letters(n)]].mean().rename(lambda c: c[3:])
