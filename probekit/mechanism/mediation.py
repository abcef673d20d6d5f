"""Causal mediation of a study's behavioural gap per component (Vig et al., NeurIPS 2020).

For a pair (clean = the treatment, corrupt = the base) and a component c (a layer's site at a
span, or one attention head), on the per-prompt readout m:

- total effect    TE   = m(clean) - m(corrupt)                      (the pair's gap)
- indirect effect IE_c = m(corrupt run, c set to its clean value) - m(corrupt)
- direct effect   DE_c = m(clean run, c set to its corrupt value) - m(corrupt)

IE is exact activation patching (`mechanism.patching.sweep`); DE is the same sweep with the two
prompts swapped. A component that carries the whole effect has IE = TE and DE = 0, one that
carries none IE = 0 and DE = TE; TE - IE - DE is what the two paths do together (interaction).
Over a study's sets of pairs (`mechanism.pairs.PairSet`) each effect on a set is the signed sum
of its pairs', as patching's; intervals are bootstrap intervals over units, as patching's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.items import Pair
from probekit.engines.base import HookedScorer
from probekit.mechanism.components import COMPONENT, Patch
from probekit.mechanism.pairs import PairSet, as_sets
from probekit.mechanism.patching import over_units, set_sums, sweep
from probekit.mechanism.readouts import Readout

EFFECTS = ("total", "indirect", "direct")


def mediate(
    scorer: HookedScorer,
    pairs: Sequence[Pair] | Sequence[PairSet],
    patches: Sequence[Patch],
    readout: Readout,
    **options: Any,
) -> pd.DataFrame:
    """One row per (pair, component): pair (its index), unit, set, sign, clean_prompt_id,
    corrupt_prompt_id, layer, site, head, span, total, indirect, direct, readout. `options` go
    to both sweeps (`patching.sweep`: `hooks`, `batch_size`, `through_answer`)."""
    sets = as_sets(pairs)
    forward = sweep(scorer, sets, patches, readout, **options)
    swapped = [replace(s, pairs=tuple((k, c) for c, k in s.pairs)) for s in sets]
    reverse = sweep(scorer, swapped, patches, readout, **options)
    m = readout.column
    corrupt = forward[f"{m}_corrupt"]
    out = forward[["unit", "set", "sign", "clean_prompt_id", "corrupt_prompt_id", *COMPONENT]]
    out = out.assign(
        total=forward[f"{m}_clean"] - corrupt,
        indirect=forward[f"{m}_patched"] - corrupt,
        direct=reverse[f"{m}_patched"].to_numpy() - corrupt,
        readout=readout.spec,
    )
    out.insert(0, "pair", np.arange(len(out)) // len(patches))
    return out


def summarise(
    effects: pd.DataFrame, n: int = 1000, seed: int = 0, level: float = 0.95
) -> pd.DataFrame:
    """Per component: the mean over sets of each effect with its bootstrap interval over units
    (`<effect>`, `<effect>_low`, `<effect>_high`) and `share` = mean IE / mean TE; largest
    |indirect| first."""
    rows = []
    for key, group in effects.groupby(COMPONENT, sort=False, dropna=False):
        row = dict(zip(COMPONENT, key, strict=True))
        sets = set_sums(group, EFFECTS)
        for effect in EFFECTS:
            row |= over_units(sets, effect, None, effect, n, seed, level)
        row["share"] = row["indirect"] / row["total"] if row["total"] != 0 else np.nan
        rows.append(row | {"pairs": len(group), "sets": len(sets)})
    out = pd.DataFrame(rows).astype({"head": "Int64"})
    order = out["indirect"].abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order].reset_index(drop=True)


def top_share(
    effects: pd.DataFrame, top: int, n: int = 1000, seed: int = 0, level: float = 0.95
) -> dict[str, float]:
    """The summed mean indirect effect of the `top` components (largest |mean IE|, chosen once on
    all sets) as a share of the mean total effect, with its bootstrap interval over units."""
    per = summarise(effects, n=1, seed=seed)
    if not 1 <= top <= len(per):
        raise ProbekitError(f"top must lie between 1 and {len(per)} components, got {top}")
    inside = effects.merge(per.head(top)[COMPONENT], on=COMPONENT)
    sets = set_sums(effects.drop_duplicates("pair"), ["total"])
    sets = sets.join(set_sums(inside, ["indirect"])["indirect"])
    ci = over_units(sets, "indirect", "total", "share", n, seed, level)
    return {"top": top, "share": ci["share"], "low": ci["share_low"], "high": ci["share_high"]}
