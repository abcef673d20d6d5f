"""Attribution patching on the exact behavioural readout, and its check against exact patching.

The first-order estimate of a patch's effect (Nanda 2023; AtP, Kramár et al. 2024): for a
component with corrupt activations a* and clean activations a at the patched positions,
`m(patched) - m(corrupt) ~ (a - a*) . dm/da*`, the gradient taken in the corrupt run. Every
component of a sweep (layer x site x span, and every head at `attn.hook_z`) is scored from one
clean forward, one corrupt forward and one backward pass per prompt batch.

The readout is the one exact patching reads, differentiated end to end: the normalised exact
answer distribution of `probekit.engines.hf.differentiable` (every surface form, stop probability,
no pruning, no first-token proxy), dotted with the readout's weight per answer. Every readout of
`probekit.mechanism.readouts` (expected, p:<answer>, p_correct, their differences) is linear in the
normalised distribution; `linear_weights` reads the weights and refuses a readout that is not.

Gradients flow through the TransformerLens bridge hooks: each hooked activation gets a zero
tensor added, and the gradient with respect to that zero is the gradient at the activation.
`verify` re-measures the top-k components by exact patching (`probekit.mechanism.patching.sweep`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy import stats

from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem, Item, Pair
from probekit.core.options import given
from probekit.core.progress import progress
from probekit.engines.base import HookedScorer, ScoreResult
from probekit.mechanism.components import (
    COMPONENT,
    MEASURED,
    NOT_RUN,
    Job,
    Patch,
    check,
    exact_effect,
    from_row,
    make_job,
    pair_columns,
    row,
)
from probekit.mechanism.interventions import bridge_hooks
from probekit.mechanism.pairs import PairSet, as_sets
from probekit.mechanism.patching import sweep
from probekit.mechanism.readouts import Readout
from probekit.mechanism.sites import bridged, hf_module, hook_order

METHODS = ("exact", "attribution", "attribution+verify")
Found = dict[str, dict[str, torch.Tensor]]
"""Per prompt id: {hook: values [prompt positions, ...]}."""


def linear_weights(readout: Readout, scorer: HookedScorer, item: Item) -> np.ndarray:
    """w with readout(result) = w . probs for every normalised answer distribution `probs`.

    Read by evaluating the readout on each answer's point mass, then checked on a random mixture;
    a readout that is not linear in the distribution cannot be differentiated this way."""
    answers = scorer.answers
    values = answers.values if answers.numeric else None

    def at(probs: np.ndarray) -> float:
        expected = float(probs @ values) if values is not None else None
        return readout(ScoreResult(probs, 1.0, 0.0, None, None, expected=expected), item)

    weights = np.array([at(point) for point in np.eye(len(answers))])
    mix = np.random.default_rng(0).dirichlet(np.ones(len(answers)))
    if not np.isclose(at(mix), mix @ weights, rtol=1e-9, atol=1e-9):
        raise ProbekitError(
            f"attribution needs a readout linear in the answer distribution; {readout.spec} is not"
        )
    return weights


def attribute(
    scorer: HookedScorer,
    pairs: Sequence[Pair] | Sequence[PairSet],
    patches: Sequence[Patch],
    readout: Readout,
    batch_size: int | None = None,
) -> pd.DataFrame:
    """The attribution estimate of every patch on every pair: the columns of `patching.sweep`
    with method `attribution`, `estimate` (of m_patched - m_corrupt) filled, `<m>_clean` and
    `<m>_corrupt` from the differentiable pass, `<m>_patched` and recovery NaN, ran False.
    Spans of unequal token counts (patched exactly as a block) have no estimate: refused."""
    pairs, about = pair_columns(as_sets(pairs))
    check(scorer.model, pairs, patches)
    check_gradients(scorer)
    size = batch_size or max(1, scorer.batch_size // 4)  # the pass keeps every node's graph
    # the estimate is the linear term of a patch of prompt positions (the gradient pass does not
    # reach the answer positions); `verify` measures the same patch exactly
    jobs = [make_job(i, pair, patch, False) for i, pair in enumerate(pairs) for patch in patches]
    if blocks := [job for job in jobs if job.block]:
        clean, corrupt = pairs[blocks[0].pair]
        raise ProbekitError(
            f"attribution estimates a patch position by position, and '{blocks[0].patch.span}' "
            f"has unequal token counts in {clean.id} and {corrupt.id}: patch it exactly "
            f"({given('method', 'exact')}) or give pairs of equal token counts"
        )
    hooks = sorted({patch.hook for patch in patches}, key=hook_order)
    prompts = {prompt.id: prompt for pair in pairs for prompt in pair}
    corrupt_ids = {corrupt.id for _, corrupt in pairs}
    value: dict[str, float] = {}
    acts: Found = {}
    grads: Found = {}
    with progress(len(prompts), "prompt", "attribution") as bar:
        for grad in (False, True):  # the clean prompts alone, then the corrupt ones' gradients
            keys = [key for key in prompts if (key in corrupt_ids) == grad]
            for start in range(0, len(keys), size):
                chunk = [prompts[key] for key in keys[start : start + size]]
                _pass(scorer, chunk, hooks, readout, value, acts, grads if grad else None)
                bar.update(len(chunk))
    rows = []
    for job in jobs:
        clean, corrupt = pairs[job.pair]
        noop = job.status == NOT_RUN
        estimate = 0.0 if noop else _estimate(job, acts, grads, clean.id, corrupt.id)
        found = (value[clean.id], value[corrupt.id], np.nan)
        rows.append(row(job, readout, *found, about[job.pair]))
        rows[-1] |= {"method": "attribution", "estimate": estimate}
    return pd.DataFrame(rows).astype({"head": "Int64"})


def check_gradients(scorer: HookedScorer) -> None:
    """One line when the model cannot give activation gradients (integer or quantised weights)."""
    # The stored weights' own type: a quantised model computes in `model.dtype` but cannot
    # give gradients of its integer weights.
    head = hf_module(scorer.model).get_output_embeddings().weight
    if not head.dtype.is_floating_point:
        raise ProbekitError(
            f"attribution needs gradients, and {scorer.model.name} has {head.dtype} weights; "
            f"load it in float32 or bfloat16, or use {given('method', 'exact')}"
        )


def _pass(
    scorer: HookedScorer,
    prompts: list[EncodedItem],
    hooks: list[str],
    readout: Readout,
    value: dict[str, float],
    acts: Found,
    grads: Found | None,
) -> None:
    """Into `value`, the readout of each prompt; into `acts`, its activations at `hooks` at
    every prompt position; into `grads` (unless None), the readout's gradient there. The
    gradient at a location is the gradient at a zero added there (`interventions.bridge_hooks`)."""
    batch = [p.input_ids for p in prompts]
    locs = [(at, k) for at, ids in enumerate(batch) for k in range(len(ids))]
    zeros: dict[str, torch.Tensor] = {}

    def add_zero(hook: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(old: torch.Tensor) -> torch.Tensor:
            zeros[hook] = torch.zeros_like(old, requires_grad=True)
            return old + zeros[hook]

        return fn

    edits = {hook: (locs, add_zero(hook)) for hook in hooks} if grads is not None else {}
    fwd, read = bridge_hooks(scorer.model, batch, {hook: locs for hook in hooks}, edits)
    weights = [linear_weights(readout, scorer, p.item) for p in prompts]
    weights = torch.tensor(np.stack(weights), device=scorer.model.device)
    with bridged(scorer.model) as bridge:  # the backward recomputes the head: bridge installed
        with torch.set_grad_enabled(grads is not None), bridge.hooks(fwd_hooks=fwd):
            mass = scorer.answer_mass(batch)
            values = (mass / mass.sum(-1, keepdim=True) * weights).sum(-1)
        seen = read()
        got = []
        if grads is not None:
            got = torch.autograd.grad(values.sum(), [zeros[h] for h in hooks], allow_unused=True)
    for hook, g in zip(hooks, got, strict=False):
        if g is None:
            raise ProbekitError(
                f"the readout has no gradient at {hook}; use {given('method', 'exact')}"
            )
    at = 0
    for prompt, v in zip(prompts, values.detach().cpu(), strict=True):
        rows = slice(at, at + len(prompt.input_ids))
        value[prompt.id], acts[prompt.id] = float(v), {h: seen[h][rows] for h in hooks}
        if grads is not None:
            grads[prompt.id] = {h: g[rows].cpu() for h, g in zip(hooks, got, strict=True)}
        at += len(prompt.input_ids)


def _estimate(job: Job, acts: Found, grads: Found, clean_id: str, corrupt_id: str) -> float:
    """(a_clean - a_corrupt) . grad at the job's aligned positions (its head only, if any)."""
    hook, corrupt = job.patch.hook, job.corrupt_positions
    clean = acts[clean_id][hook][job.clean_positions].double()
    term = (clean - acts[corrupt_id][hook][corrupt].double()) * grads[corrupt_id][hook][corrupt]
    if job.patch.head is not None:
        term = term[:, job.patch.head]
    return float(term.sum())


# ---------------------------------------------------------------------- ranking and checking
def effects(df: pd.DataFrame) -> pd.DataFrame:
    """Per component (layer, site, head, span): the mean over pairs of the estimate and of the
    exact effect (m_patched - m_corrupt, where measured), and the pairs counted."""
    frame = df[COMPONENT].assign(estimate=df["estimate"], exact=exact_effect(df))
    out = frame.groupby(COMPONENT, sort=False, dropna=False).agg(
        estimate=("estimate", "mean"), exact=("exact", "mean"), pairs=("estimate", "size")
    )
    return out.reset_index()


def top_components(df: pd.DataFrame, k: int) -> list[Patch]:
    """The k components with the largest |mean estimate| over pairs, largest first, among
    those measured (not those known by construction: `mechanism.components`)."""
    per = effects(df[df["status"] == MEASURED])
    if not 1 <= k <= len(per):
        raise ProbekitError(
            f"top-k must lie between 1 and the number of components ({len(per)}), got {k}"
        )
    order = per["estimate"].abs().sort_values(ascending=False, kind="stable").index[:k]
    return [from_row(per.loc[i]) for i in order]


def verify(
    scorer: HookedScorer,
    pairs: Sequence[Pair] | Sequence[PairSet],
    estimated: pd.DataFrame,
    k: int,
    readout: Readout,
    hooks: str = "transformer_lens",
    batch_size: int | None = None,
) -> pd.DataFrame:
    """The attribution table with its top-k components re-measured by exact patching of the
    same prompt positions (`through_answer=False`, what the estimate linearises): their rows get
    `<m>_patched`, recovery and ran from `patching.sweep`; method `attribution+verify`."""
    top = top_components(estimated, k)
    exact = sweep(
        scorer, pairs, top, readout, hooks=hooks, batch_size=batch_size, through_answer=False
    )
    m = readout.column
    join = ["clean_prompt_id", "corrupt_prompt_id", *COMPONENT]
    measured = [f"{m}_clean", f"{m}_corrupt", f"{m}_patched", "recovery", "ran"]
    merged = estimated.drop(columns=measured[2:]).merge(
        exact[[*join, *measured]], on=join, how="left", suffixes=("", "_exact")
    )
    hit = merged["ran"].notna()  # the verified components' rows
    # exact baselines replace the differentiable pass's (equal to ~1e-5) where verified
    for side in ("clean", "corrupt"):
        merged[f"{m}_{side}"] = merged.pop(f"{m}_{side}_exact").where(hit, merged[f"{m}_{side}"])
    merged["ran"] = merged["ran"].fillna(False).astype(bool)
    merged["method"] = "attribution+verify"
    return merged[estimated.columns]


def agreement(per: pd.DataFrame, k: int = 10) -> dict[str, float]:
    """How well the estimate ranks components by |mean effect|, over those with an exact mean:
    Spearman rho of |estimate| vs |exact|, and recall of the exact top k in the estimated top k
    (NaN unless every component was measured exactly: the top k of a partial set is not it)."""
    measured = per.dropna(subset=["exact"])
    out = {"spearman": float("nan"), f"recall@{k}": float("nan"), "components": len(measured)}
    if len(measured) >= 2:
        rho = stats.spearmanr(measured["estimate"].abs(), measured["exact"].abs()).statistic
        out["spearman"] = float(rho)
    if len(measured) == len(per) and len(per) >= k:
        est = set(per["estimate"].abs().nlargest(k).index)
        true = set(per["exact"].abs().nlargest(k).index)
        out[f"recall@{k}"] = len(est & true) / k
    return out
