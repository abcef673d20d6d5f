"""Causal mediation of a study's behavioural gap per component (Vig et al., NeurIPS 2020).

For a pair (clean = the treatment, corrupt = the base) and a component c (a layer's site at a
span, or one attention head), on the per-prompt readout m:

- total effect    TE   = m(clean) - m(corrupt)                      (the pair's gap)
- indirect effect IE_c = m(corrupt run, c set to its clean value) - m(corrupt)
- direct effect   DE_c = m(clean run, c set to its corrupt value) - m(corrupt)

IE is exact activation patching (`mechanism.patching.sweep`); DE is the same sweep with the two
prompts swapped. A component that carries the whole effect has IE = TE and DE = 0, one that
carries none IE = 0 and DE = TE; TE - IE - DE is what the two paths do together (interaction).
Intervals are bootstrap intervals over pairs (`probekit.stats.bootstrap_units`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict, Unpack

import numpy as np
import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.items import Pair
from probekit.engines.base import HookedScorer
from probekit.mechanism.components import COMPONENT, Patch
from probekit.mechanism.patching import sweep
from probekit.mechanism.readouts import Readout
from probekit.stats import bootstrap_units, mean_ratio

EFFECTS = ("total", "indirect", "direct")


class SweepKwargs(TypedDict, total=False):
    """The keywords of `patching.sweep` that `mediate` passes to both its sweeps."""

    hooks: str
    batch_size: int | None
    through_answer: bool | None


def mediate(
    scorer: HookedScorer,
    pairs: Sequence[Pair],
    patches: Sequence[Patch],
    readout: Readout,
    **options: Unpack[SweepKwargs],
) -> pd.DataFrame:
    """One row per (pair, component): pair (its index), clean_prompt_id, corrupt_prompt_id,
    layer, site, head, span, total, indirect, direct, readout. `options` go to both sweeps
    (`patching.sweep`: `hooks`, `batch_size`, `through_answer`)."""
    forward = sweep(scorer, pairs, patches, readout, **options)
    swapped = [(corrupt, clean) for clean, corrupt in pairs]
    reverse = sweep(scorer, swapped, patches, readout, **options)
    m = readout.column
    corrupt = forward[f"{m}_corrupt"]
    out = forward[["clean_prompt_id", "corrupt_prompt_id", *COMPONENT]].copy()
    out.insert(0, "pair", np.repeat(np.arange(len(pairs)), len(patches)))
    out["total"] = forward[f"{m}_clean"] - corrupt
    out["indirect"] = forward[f"{m}_patched"] - corrupt
    out["direct"] = reverse[f"{m}_patched"].to_numpy() - corrupt
    out["readout"] = readout.spec
    return out


def summarise(
    effects: pd.DataFrame, n: int = 1000, seed: int = 0, level: float = 0.95
) -> pd.DataFrame:
    """Per component: the mean over pairs of each effect with its bootstrap interval over pairs
    (`<effect>`, `<effect>_low`, `<effect>_high`) and `share` = mean IE / mean TE; largest
    |indirect| first."""
    rows = []
    for key, group in effects.groupby(COMPONENT, sort=False, dropna=False):
        row = dict(zip(COMPONENT, key, strict=True))
        for effect in EFFECTS:
            values = group.sort_values("pair")[effect].to_numpy()
            ci = bootstrap_units(
                len(values), lambda d, v=values: v[d].mean(-1), n, seed, level, batched=True
            )
            row |= {effect: ci.estimate, f"{effect}_low": ci.low, f"{effect}_high": ci.high}
        row["share"] = row["indirect"] / row["total"] if row["total"] != 0 else np.nan
        row["pairs"] = len(group)
        rows.append(row)
    out = pd.DataFrame(rows)
    out["head"] = out["head"].astype("Int64")
    order = out["indirect"].abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order].reset_index(drop=True)


def top_share(
    effects: pd.DataFrame, top: int, n: int = 1000, seed: int = 0, level: float = 0.95
) -> dict[str, float]:
    """The summed mean indirect effect of the `top` components (largest |mean IE|, chosen once on
    all pairs) as a share of the mean total effect, with its bootstrap interval over pairs."""
    per = summarise(effects, n=1, seed=seed)
    if not 1 <= top <= len(per):
        raise ProbekitError(f"top must lie between 1 and {len(per)} components, got {top}")
    chosen = per.head(top)[COMPONENT]
    inside = effects.merge(chosen, on=COMPONENT)
    indirect = inside.groupby("pair")["indirect"].sum().sort_index().to_numpy()
    total = effects.groupby("pair")["total"].first().sort_index().to_numpy()

    ci = bootstrap_units(len(total), mean_ratio(indirect, total), n, seed, level, batched=True)
    return {"top": top, "share": ci.estimate, "low": ci.low, "high": ci.high}
