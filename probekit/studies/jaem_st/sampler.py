"""The authors' sampling of social contexts (`combine_social_dims.py`), seeded.

Rows are the Cartesian product of the template index and the evaluated dimensions (template-major,
then each dimension in metadata order), repeated until the data set reaches `dataset_size`,
rounded up as the authors round: N + cart - (N mod cart), so 400 becomes 486 with 162
combinations and an exact multiple gains one whole extra copy. Every other dimension is drawn per
row as the authors draw it: an integer below the largest size among those dimensions, modulo the
dimension's own size, which favours the first values of a smaller dimension (2/7 for the first of
six when the largest has seven). The authors seed nothing; here the draw is seeded, and
`uniform=True` draws each value with equal probability instead.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from probekit.core.options import option_error
from probekit.studies.jaem_st.data import Dimension

TEMPLATE = "template_index"


def rounded_size(size: int, cart: int) -> int:
    """The authors' row count: `size + cart - size % cart`."""
    return size + cart - size % cart


def sample_rows(
    n_templates: int,
    dimensions: tuple[Dimension, ...],
    evaluated: tuple[str, ...],
    dataset_size: int,
    seed: int = 0,
    uniform: bool = False,
) -> pd.DataFrame:
    """One row per sample: `template_index`, then one column per dimension (`Dimension.column`)
    holding its value; the row's position is the sample index."""
    if dataset_size < 1:
        raise option_error("dataset_size", f"must be at least 1 (got {dataset_size})")
    by_name = {d.name: d for d in dimensions}
    cart_dims = [by_name[name] for name in evaluated]
    drawn = [d for d in dimensions if d.name not in evaluated]
    product = list(itertools.product(range(n_templates), *(d.values for d in cart_dims)))
    total = rounded_size(dataset_size, len(product))
    rows = pd.DataFrame(
        product * (total // len(product)), columns=[TEMPLATE, *(d.column for d in cart_dims)]
    )
    if drawn:
        sizes = np.array([len(d.values) for d in drawn])
        rng = np.random.default_rng(seed)
        if uniform:
            codes = rng.integers(sizes, size=(total, len(drawn)))
        else:
            codes = rng.integers(sizes.max(), size=(total, len(drawn))) % sizes
        for k, dim in enumerate(drawn):
            rows[dim.column] = np.asarray(dim.values, dtype=object)[codes[:, k]]
    return rows[[TEMPLATE, *(d.column for d in dimensions)]]
