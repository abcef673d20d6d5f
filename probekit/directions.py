"""The in-group/out-group direction at the experiencer span, and a causal check of it.

For every prompt and layer, the state is the mean of `blocks.{layer}.hook_resid_post` over the
experiencer span's tokens. The direction of a layer is the difference of means between in-group
prompts (perceiver and experiencer share a label) and out-group prompts, as a unit vector.

Prediction. A prompt's intensity gap is its expected intensity minus the mean over the
experiencers of its (event, perceiver), so it measures how much more this perceiver feels for
this experiencer than for the others. Its projection on the direction is centred the same way,
and the Pearson r between the two is taken over all prompts. The direction that scores an event's
prompts is fitted on the other events (leave one event out), so a prompt never helps to define
the direction it is scored on; with a single event the fit is in-sample (`cross_validated`).

Causal check. At the layer with the largest r, the direction fitted on all events is projected
out of the residual stream (x <- x - (x.u) u) at every experiencer token during the prompt pass,
every prompt is scored again, and the empathy gap Δ of the intergroup study (z-scored matrix of
the named groups) is recomputed. A random unit direction at the same place is the control.
Δ here uses every prompt's expected intensity, without the study's valid-mass exclusion of
events: the check compares the same prompts before and after, whatever mass the answers carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from probekit.errors import ProbekitError
from probekit.patching import StudyPrompt, score_with
from probekit.scoring.engine import Scorer
from probekit.stats import empathy_gap, intensity_matrix, zscore
from probekit.studies.intergroup import Category

SITE = "hook_resid_post"
GROUP = ["event_id", "perceiver"]


@dataclass(frozen=True)
class States:
    """One row per prompt (`frame`: event_id, emotion, perceiver, experiencer, in_group,
    expected, gap) and its experiencer-span states `acts[prompt, layer, d]` at `layers`."""

    frame: pd.DataFrame
    acts: np.ndarray
    layers: list[int]


@dataclass(frozen=True)
class CausalCheck:
    """Δ before and after projecting the direction out at `layer` (and for a random one)."""

    layer: int
    delta: float
    delta_ablated: float
    delta_random: float | None

    @property
    def shrink(self) -> float:
        """Share of Δ removed by the ablation: (Δ - Δ_ablated) / Δ."""
        return (self.delta - self.delta_ablated) / self.delta if self.delta else float("nan")


def experiencer_states(
    scorer: Scorer,
    prompts: Sequence[StudyPrompt],
    category: Category,
    layers: Sequence[int] | None = None,
    batch_size: int | None = None,
) -> States:
    """Score every prompt once, keeping its experiencer-span states at `layers` (default all)."""
    layers = list(range(scorer.model.n_layers)) if layers is None else list(layers)
    label = dict(zip(category.identities, category.labels, strict=True))
    size = batch_size or scorer.batch_size
    rows, acts = [], []
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        spans = [p.prompt.positions["experiencer"] for p in chunk]
        locs = [(row, pos) for row, span in enumerate(spans) for pos in span]
        reads = {f"blocks.{layer}.{SITE}": locs for layer in layers}
        results, values = score_with(scorer, [p.ids for p in chunk], reads=reads)
        stacked = torch.stack([values[hook] for hook in reads], dim=1).double()  # [locs, L, d]
        at = 0
        for prompt, span, result in zip(chunk, spans, results, strict=True):
            acts.append(stacked[at : at + len(span)].mean(dim=0).numpy())
            at += len(span)
            rows.append(
                {
                    "event_id": prompt.event_id,
                    "emotion": prompt.emotion,
                    "perceiver": prompt.perceiver,
                    "experiencer": prompt.experiencer,
                    "in_group": label[prompt.perceiver] == label[prompt.experiencer],
                    "expected": np.nan if result.expected is None else result.expected,
                }
            )
    frame = pd.DataFrame(rows)
    frame["gap"] = _centred(frame["expected"].to_numpy(), frame)
    return States(frame, np.stack(acts), layers)


def diff_of_means(acts: np.ndarray, in_group: np.ndarray) -> np.ndarray:
    """Unit vector along mean(in-group) - mean(out-group) of `acts[prompt, d]`."""
    in_group = np.asarray(in_group, dtype=bool)
    if in_group.all() or not in_group.any():
        raise ProbekitError("a difference of means needs both in-group and out-group prompts")
    direction = acts[in_group].mean(axis=0) - acts[~in_group].mean(axis=0)
    norm = np.linalg.norm(direction)
    return direction / norm if norm > 0 else direction


def projection_fit(states: States) -> pd.DataFrame:
    """Per layer: Pearson r between each prompt's centred projection and its intensity gap."""
    frame = states.frame
    events = frame["event_id"].to_numpy()
    folds = pd.unique(events)
    in_group = frame["in_group"].to_numpy()
    rows = []
    for k, layer in enumerate(states.layers):
        acts = states.acts[:, k]
        projection = np.empty(len(frame))
        for event in folds:
            held = events == event
            train = ~held if len(folds) > 1 else held
            projection[held] = acts[held] @ diff_of_means(acts[train], in_group[train])
        r = _pearson(_centred(projection, frame), frame["gap"].to_numpy())
        rows.append({"layer": layer, "r": r, "cross_validated": len(folds) > 1})
    return pd.DataFrame(rows)


def delta(frame: pd.DataFrame, category: Category, value: str = "expected") -> float:
    """Δ of the intergroup study from per-prompt scores (named groups, z-scored matrix)."""
    M = intensity_matrix(frame, list(category.named), value=value)
    return empathy_gap(zscore(M), list(category.named_labels))


def project_out(
    scorer: Scorer,
    prompts: Sequence[StudyPrompt],
    layer: int,
    direction: np.ndarray,
    batch_size: int | None = None,
) -> list[float]:
    """Expected intensities with `direction` projected out of `blocks.{layer}.hook_resid_post`
    at every experiencer token."""
    model = scorer.model
    unit = torch.as_tensor(direction / np.linalg.norm(direction), dtype=model.dtype)
    unit = unit.to(model.device)

    def remove(x: torch.Tensor) -> torch.Tensor:
        return x - (x @ unit)[:, None] * unit

    size = batch_size or scorer.batch_size
    out = []
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        spans = [p.prompt.positions["experiencer"] for p in chunk]
        locs = [(row, pos) for row, span in enumerate(spans) for pos in span]
        results, _ = score_with(
            scorer, [p.ids for p in chunk], edits={f"blocks.{layer}.{SITE}": (locs, remove)}
        )
        out += [np.nan if r.expected is None else r.expected for r in results]
    return out


def causal_check(
    scorer: Scorer,
    prompts: Sequence[StudyPrompt],
    category: Category,
    states: States,
    fit: pd.DataFrame,
    control: bool = True,
    seed: int = 0,
    batch_size: int | None = None,
) -> CausalCheck:
    """Project the best layer's direction out at the experiencer span; Δ before and after."""
    if fit["r"].isna().all():
        raise ProbekitError("no layer has a defined correlation; the causal check has no layer")
    best = fit.loc[fit["r"].idxmax()]
    layer = int(best["layer"])
    k = states.layers.index(layer)
    direction = diff_of_means(states.acts[:, k], states.frame["in_group"].to_numpy())
    if not np.linalg.norm(direction):
        raise ProbekitError(f"the in-group and out-group means coincide at layer {layer}")
    frame = states.frame.copy()
    base = delta(frame, category)
    frame["ablated"] = project_out(scorer, prompts, layer, direction, batch_size)
    random = None
    if control:
        vector = np.random.default_rng(seed).standard_normal(direction.shape)
        frame["random"] = project_out(scorer, prompts, layer, vector, batch_size)
        random = delta(frame, category, "random")
    return CausalCheck(layer, base, delta(frame, category, "ablated"), random)


def _centred(values: np.ndarray, frame: pd.DataFrame) -> np.ndarray:
    """`values` (one per row of `frame`) minus their mean within each (event, perceiver)."""
    series = pd.Series(values, index=frame.index)
    return (series - series.groupby([frame[c] for c in GROUP]).transform("mean")).to_numpy()


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok] - x[ok].mean(), y[ok] - y[ok].mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator > 0 else float("nan")
