"""A contrast direction at one span, and a causal check of it, for any study.

For every prompt and layer, the state is the mean of `blocks.{layer}.hook_resid_post` over the
tokens of a span the study names (intergroup: the experiencer). The direction of a layer is the
difference of means between the prompts on each side of a boolean contrast the study defines
(intergroup: in-group vs out-group), as a unit vector.

Prediction. A prompt's gap is its readout (e.g. the expected intensity) minus the mean over the
prompts that share its `centre` columns (intergroup: the same event and perceiver), so it measures
how much more this prompt's identity moves the answer than the others. Its projection on the
direction is centred the same way, and the Pearson r between the two is taken over all prompts.
The direction that scores a unit's prompts is fitted on the other units (leave one unit out), so
a prompt never helps to define the direction it is scored on; with a single unit the fit is
in-sample (`cross_validated`).

Causal check, cross-fitted. The units are split into folds (at most `FOLDS`, seeded); for each
fold the layer is chosen (largest r) and the direction fitted on the other folds' units only, and
projected out of the residual stream (x <- x - (x.u) u) at every token of the span of the held-out
fold's prompts during the prompt pass; so no prompt is ablated along a direction, or at a layer,
chosen on its own unit. Every prompt is scored again and the study's statistic (intergroup: the
empathy gap Δ) recomputed on the ablated readouts. `controls` random unit directions, each
projected out at the same fold's layer, are the control. Each statistic, the share it shrinks
by, and the controls' mean share have percentile bootstrap intervals over units (every drawn unit
relabelled, `probekit.stats.bootstrap_ci`; the statistic reads the `unit` column). The statistic
is computed on every prompt's readout, without the study's exclusion rules: the check compares
the same prompts before and after.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from probekit.core.errors import ProbekitError
from probekit.core.items import PROMPT_ID, EncodedItem
from probekit.core.progress import progress
from probekit.engines.base import HookedScorer
from probekit.mechanism.defaults import Statistic
from probekit.mechanism.interventions import score_edited, score_with
from probekit.mechanism.pairs import span_positions
from probekit.mechanism.readouts import Readout
from probekit.mechanism.sites import site
from probekit.stats import bootstrap_ci

SITE = site("resid_post")  # the states are read and edited at blocks.{layer}.hook_resid_post
VALUE = "value"  # the readout's column in `States.frame`
FOLDS = 5
"""The most folds of units a direction or vector is cross-fitted on (fewer units: one each)."""


@dataclass(frozen=True)
class States:
    """One row per prompt (`frame`: prompt_id, key columns, contrast, value, gap) and its
    span states `acts[prompt, layer, d]` at `layers`."""

    frame: pd.DataFrame
    acts: np.ndarray
    layers: list[int]
    span: str


def span_states(
    scorer: HookedScorer,
    prompts: Sequence[EncodedItem],
    span: str,
    readout: Readout,
    contrast: Callable[[EncodedItem], bool],
    centre: Sequence[str],
) -> States:
    """Score every prompt once, keeping its `span` states at every layer."""
    layers, size = list(range(scorer.model.n_layers)), scorer.batch_size
    rows, acts = [], []
    with progress(len(prompts), "prompt", "directions") as bar:
        for start in range(0, len(prompts), size):
            chunk = prompts[start : start + size]
            spans = [span_positions(p, span) for p in chunk]
            locs = [(row, pos) for row, positions in enumerate(spans) for pos in positions]
            reads = {SITE.hook(layer): locs for layer in layers}
            results, values = score_with(scorer, [p.input_ids for p in chunk], reads=reads)
            stacked = torch.stack([values[hook] for hook in reads], dim=1).double()  # [locs, L, d]
            acts += [part.mean(dim=0).numpy() for part in stacked.split(list(map(len, spans)))]
            rows += [
                {PROMPT_ID: prompt.id, "unit": prompt.item.unit, **prompt.item.key}
                | {"contrast": contrast(prompt), VALUE: readout(result, prompt.item)}
                for prompt, result in zip(chunk, results, strict=True)
            ]
            bar.update(len(chunk))
    frame = pd.DataFrame(rows)
    frame["gap"] = _centred(frame[VALUE].to_numpy(), frame, centre)
    return States(frame, np.stack(acts), layers, span)


def mean_difference(acts: np.ndarray, contrast: Sequence[bool]) -> np.ndarray:
    """mean(prompts where `contrast`) - mean(the others) of `acts[prompt, d]`."""
    side = np.asarray(contrast, dtype=bool)
    if side.all() or not side.any():
        raise ProbekitError("a difference of means needs prompts on both sides of the contrast")
    return acts[side].mean(axis=0) - acts[~side].mean(axis=0)


def diff_of_means(acts: np.ndarray, contrast: Sequence[bool]) -> np.ndarray:
    """`mean_difference` as a unit vector."""
    direction = mean_difference(acts, contrast)
    norm = np.linalg.norm(direction)
    return direction / norm if norm > 0 else direction


def projection_fit(states: States, units: Sequence[str], centre: Sequence[str]) -> pd.DataFrame:
    """Per layer: Pearson r between each prompt's centred projection and its gap.

    `units[i]` is prompt i's unit (event, question): the leave-one-unit-out folds."""
    frame, units = states.frame, np.asarray(units)
    folds = pd.unique(units)
    contrast = frame["contrast"].to_numpy()
    rows = []
    for k, layer in enumerate(states.layers):
        acts = states.acts[:, k]
        projection = np.empty(len(frame))
        for unit in folds:
            held = units == unit
            train = ~held if len(folds) > 1 else held
            projection[held] = acts[held] @ diff_of_means(acts[train], contrast[train])
        r = _pearson(_centred(projection, frame, centre), frame["gap"].to_numpy())
        rows.append({"layer": layer, "r": r, "cross_validated": len(folds) > 1})
    return pd.DataFrame(rows)


def project_out(
    scorer: HookedScorer,
    prompts: Sequence[EncodedItem],
    span: str,
    layer: int,
    direction: np.ndarray,
    readout: Readout,
) -> list[float]:
    """The readout of every prompt with `direction` projected out of
    `blocks.{layer}.hook_resid_post` at every token of `span`."""
    model = scorer.model
    unit = torch.as_tensor(direction / np.linalg.norm(direction), dtype=model.dtype)
    unit = unit.to(model.device)

    def remove(x: torch.Tensor) -> torch.Tensor:
        return x - (x @ unit)[:, None] * unit

    where = functools.partial(span_positions, span=span)
    results = score_edited(scorer, prompts, SITE.hook(layer), where, remove)
    return [readout(r, p.item) for r, p in zip(results, prompts, strict=True)]


def causal_check(
    scorer: HookedScorer,
    prompts: Sequence[EncodedItem],
    states: States,
    readout: Readout,
    statistic: Statistic,
    centre: Sequence[str],
    controls: int = 5,
    seed: int = 0,
    n: int = 1000,
) -> dict[str, Any]:
    """The cross-fitted causal check of the module's docstring, with `controls` random
    directions, folds and random directions drawn from `seed`, `n` bootstrap resamples: `folds`,
    `layers` (each unit's, chosen on the other folds), the statistic before (`delta`) and after
    projecting the direction out (`ablated`), the share it shrinks by (`shrink`) and the random
    controls' mean share (`random_shrink`), each with its 95% interval over units
    (`<name>_low`, `<name>_high`), and the controls' statistics (`delta_random`, `controls`)."""
    frame = states.frame.copy()
    units = list(frame["unit"])
    fold = unit_folds(units, seed)
    contrast, gap = frame["contrast"].to_numpy(), frame["gap"].to_numpy()
    randoms = np.random.default_rng(seed).standard_normal((controls, states.acts.shape[-1]))
    columns = ["ablated", *(f"random{c + 1}" for c in range(controls))]
    ablated = np.full((len(columns), len(frame)), np.nan)
    layers: dict[str, int] = {}
    for k in range(int(fold.max()) + 1):
        held, train = fold == k, fold != k
        fits = []
        for acts in np.moveaxis(states.acts[train], 1, 0):  # each layer's, in-sample on train
            projection = acts @ diff_of_means(acts, contrast[train])
            fits.append(_pearson(_centred(projection, frame[train], centre), gap[train]))
        if np.isnan(fits).all():
            raise ProbekitError("no layer has a defined correlation; the causal check has no layer")
        at = int(np.nanargmax(fits))
        direction = diff_of_means(states.acts[train, at], contrast[train])
        chosen = [prompts[i] for i in np.flatnonzero(held)]
        for row, vector in enumerate([direction, *randoms]):
            layer = states.layers[at]
            ablated[row, held] = project_out(scorer, chosen, states.span, layer, vector, readout)
        layers |= {u: states.layers[at] for u, f in zip(units, fold, strict=True) if f == k}
    frame = frame.assign(**dict(zip(columns, ablated, strict=True)))
    found = {
        c: bootstrap_ci(frame, "unit", lambda d, c=c: statistic(d, c), n=n, seed=seed)
        for c in [VALUE, *columns]
    }
    base, controlled = found[VALUE], columns[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = {c: ((base.estimate - found[c].estimate) / base.estimate) for c in columns}
        drawn = {c: (base.resampled - found[c].resampled) / base.resampled for c in columns}
    out: dict[str, Any] = {"folds": int(fold.max()) + 1, "layers": layers}
    for name, value, resampled in (
        ("delta", base.estimate, base.resampled),
        ("ablated", found["ablated"].estimate, found["ablated"].resampled),
        ("shrink", shares["ablated"], drawn["ablated"]),
        (
            "random_shrink",
            np.mean([shares[c] for c in controlled]),
            np.mean([drawn[c] for c in controlled], 0),
        ),
    ):
        low, high = np.nanpercentile(resampled, [2.5, 97.5])
        out |= {name: float(value), f"{name}_low": float(low), f"{name}_high": float(high)}
    random = [found[c].estimate for c in controlled]
    return out | {"delta_random": random, "controls": len(random)}


def unit_folds(units: Sequence[str], seed: int) -> np.ndarray:
    """Each prompt's fold: its unit's, the units dealt in a seeded order into at most `FOLDS`
    folds (a direction or vector is fitted on the other folds); one line with fewer than two
    units."""
    names = list(dict.fromkeys(units))
    if len(names) < 2:
        raise ProbekitError(
            "a direction is fitted on units held out from those it is used on, so it needs at "
            f"least two units; these prompts have {len(names)}"
        )
    order = np.random.default_rng(seed).permutation(len(names))
    fold_of = {names[i]: k % min(FOLDS, len(names)) for k, i in enumerate(order)}
    return np.array([fold_of[u] for u in units])


def _centred(values: np.ndarray, frame: pd.DataFrame, centre: Sequence[str]) -> np.ndarray:
    """`values` (one per row of `frame`) minus their mean within each group of `centre`."""
    series = pd.Series(values, index=frame.index)
    return (series - series.groupby([frame[c] for c in centre]).transform("mean")).to_numpy()


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok] - x[ok].mean(), y[ok] - y[ok].mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator > 0 else float("nan")
