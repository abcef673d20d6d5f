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

Causal check. At the layer with the largest r, the direction fitted on all units is projected out
of the residual stream (x <- x - (x.u) u) at every token of the span during the prompt pass, every
prompt is scored again, and the study's statistic (intergroup: the empathy gap Δ) is recomputed.
A random unit direction at the same place is the control. The statistic is computed on every
prompt's readout, without the study's exclusion rules: the check compares the same prompts before
and after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from probekit.core.errors import ProbekitError
from probekit.core.items import PROMPT_ID, EncodedItem
from probekit.core.progress import progress
from probekit.engines.base import HookedScorer
from probekit.mechanism.interventions import score_with
from probekit.mechanism.readouts import Readout
from probekit.mechanism.sites import site

SITE = site("resid_post")  # the states are read and edited at blocks.{layer}.hook_resid_post
VALUE = "value"  # the readout's column in `States.frame`
Statistic = Callable[[pd.DataFrame, str], float]  # (frame, value column) -> e.g. Δ


@dataclass(frozen=True)
class States:
    """One row per prompt (`frame`: prompt_id, key columns, contrast, value, gap) and its
    span states `acts[prompt, layer, d]` at `layers`."""

    frame: pd.DataFrame
    acts: np.ndarray
    layers: list[int]
    span: str


@dataclass(frozen=True)
class CausalCheck:
    """The statistic before and after projecting the direction out at `layer` (and for a
    random one)."""

    layer: int
    delta: float
    delta_ablated: float
    delta_random: float | None

    @property
    def shrink(self) -> float:
        """Share of the statistic removed by the ablation: (Δ - Δ_ablated) / Δ."""
        return (self.delta - self.delta_ablated) / self.delta if self.delta else float("nan")


def span_states(
    scorer: HookedScorer,
    prompts: Sequence[EncodedItem],
    span: str,
    readout: Readout,
    contrast: Callable[[EncodedItem], bool],
    centre: Sequence[str],
    layers: Sequence[int] | None = None,
    batch_size: int | None = None,
) -> States:
    """Score every prompt once, keeping its `span` states at `layers` (default all)."""
    layers = list(range(scorer.model.n_layers)) if layers is None else list(layers)
    size = batch_size or scorer.batch_size
    rows, acts = [], []
    bar = progress(len(prompts), "prompt", "directions")
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        spans = [_span(p, span) for p in chunk]
        locs = [(row, pos) for row, positions in enumerate(spans) for pos in positions]
        reads = {SITE.hook(layer): locs for layer in layers}
        results, values = score_with(scorer, [p.input_ids for p in chunk], reads=reads)
        stacked = torch.stack([values[hook] for hook in reads], dim=1).double()  # [locs, L, d]
        at = 0
        for prompt, positions, result in zip(chunk, spans, results, strict=True):
            acts.append(stacked[at : at + len(positions)].mean(dim=0).numpy())
            at += len(positions)
            rows.append(
                {
                    PROMPT_ID: prompt.id,
                    **prompt.item.key,
                    "contrast": contrast(prompt),
                    VALUE: readout(result, prompt.item),
                }
            )
        bar.update(len(chunk))
    bar.close()
    frame = pd.DataFrame(rows)
    frame["gap"] = _centred(frame[VALUE].to_numpy(), frame, centre)
    return States(frame, np.stack(acts), layers, span)


def diff_of_means(acts: np.ndarray, contrast: np.ndarray) -> np.ndarray:
    """Unit vector along mean(contrast) - mean(not contrast) of `acts[prompt, d]`."""
    contrast = np.asarray(contrast, dtype=bool)
    if contrast.all() or not contrast.any():
        raise ProbekitError("a difference of means needs prompts on both sides of the contrast")
    direction = acts[contrast].mean(axis=0) - acts[~contrast].mean(axis=0)
    norm = np.linalg.norm(direction)
    return direction / norm if norm > 0 else direction


def projection_fit(states: States, units: Sequence[str], centre: Sequence[str]) -> pd.DataFrame:
    """Per layer: Pearson r between each prompt's centred projection and its gap.

    `units[i]` is prompt i's unit (event, question): the leave-one-unit-out folds."""
    frame = states.frame
    units = np.asarray(units)
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
    batch_size: int | None = None,
) -> list[float]:
    """The readout of every prompt with `direction` projected out of
    `blocks.{layer}.hook_resid_post` at every token of `span`."""
    model = scorer.model
    unit = torch.as_tensor(direction / np.linalg.norm(direction), dtype=model.dtype)
    unit = unit.to(model.device)

    def remove(x: torch.Tensor) -> torch.Tensor:
        return x - (x @ unit)[:, None] * unit

    size = batch_size or scorer.batch_size
    out = []
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        locs = [(row, pos) for row, p in enumerate(chunk) for pos in _span(p, span)]
        results, _ = score_with(
            scorer, [p.input_ids for p in chunk], edits={SITE.hook(layer): (locs, remove)}
        )
        out += [readout(r, p.item) for r, p in zip(results, chunk, strict=True)]
    return out


def causal_check(
    scorer: HookedScorer,
    prompts: Sequence[EncodedItem],
    states: States,
    fit: pd.DataFrame,
    readout: Readout,
    statistic: Statistic,
    control: bool = True,
    seed: int = 0,
    batch_size: int | None = None,
) -> CausalCheck:
    """Project the best layer's direction out at the states' span; the statistic before and
    after (and after projecting out a random direction, with `control`)."""
    if fit["r"].isna().all():
        raise ProbekitError("no layer has a defined correlation; the causal check has no layer")
    layer = int(fit.loc[fit["r"].idxmax(), "layer"])
    k = states.layers.index(layer)
    direction = diff_of_means(states.acts[:, k], states.frame["contrast"].to_numpy())
    if not np.linalg.norm(direction):
        raise ProbekitError(f"the two sides of the contrast have equal means at layer {layer}")
    frame = states.frame.copy()
    base = statistic(frame, VALUE)
    frame["ablated"] = project_out(
        scorer, prompts, states.span, layer, direction, readout, batch_size
    )
    random = None
    if control:
        vector = np.random.default_rng(seed).standard_normal(direction.shape)
        frame["random"] = project_out(
            scorer, prompts, states.span, layer, vector, readout, batch_size
        )
        random = statistic(frame, "random")
    return CausalCheck(layer, base, statistic(frame, "ablated"), random)


def _span(prompt: EncodedItem, span: str) -> list[int]:
    if span not in prompt.positions:
        raise ProbekitError(
            f"unknown span {span!r}: the prompts have {', '.join(prompt.positions)}"
        )
    return prompt.positions[span]


def _centred(values: np.ndarray, frame: pd.DataFrame, centre: Sequence[str]) -> np.ndarray:
    """`values` (one per row of `frame`) minus their mean within each group of `centre`."""
    series = pd.Series(values, index=frame.index)
    return (series - series.groupby([frame[c] for c in centre]).transform("mean")).to_numpy()


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok] - x[ok].mean(), y[ok] - y[ok].mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator > 0 else float("nan")
