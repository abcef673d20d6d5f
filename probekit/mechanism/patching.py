"""Exact activation patching of counterfactual pairs, measured with the exact scoring engine.

A patch (layer, site, span[, head]; `mechanism.components`) copies the clean run's activation at
the TransformerLens hook `blocks.{layer}.{site}` into the corrupt run at the span's aligned
positions (`mechanism.pairs`). It acts during the engine's prompt pass only; the engine then
expands the answer trie from the patched KV cache, so the patch reaches every answer token
(`mechanism.interventions.score_with`). The effect is read on a per-prompt readout
(`probekit.mechanism.readouts`: expected value, P(answer), P(correct), a difference; TransformerLens
calls it the patching metric): `recovery = (m_patched - m_corrupt) / (m_clean - m_corrupt)` (NaN
when the denominator is 0).

Which positions a patch writes. A span writes its aligned prompt positions (`mechanism.pairs`).
A span that runs to the end of both prompts (`from_<span>`, `answer`, or a span that ends at the
last token) also writes every answer position (`through_answer=True`, the default with
`hooks="transformer_lens"`; nnsight's hooks reach the prompt pass only): the engine
reads a multi-token answer at positions after the prompt (its trie of answer tokens), and each
gets the clean run's activation at the same continuation. Patching `from_<span>` at
`hook_resid_pre` then gives the clean run exactly, at every layer (when the clean and corrupt
spans have the same number of tokens). With `through_answer=False` the answer positions are left
alone and read the patched prompt through the KV cache of layers >= l only, so at late layers
the answer's later tokens mix patched and corrupt values and recovery can leave [0, 1].

No-op patches (in the prefix both prompts share) are not run unless `run_noops=True`.

Reading a table (`annotate`, what `probekit.patch` returns): each row's `reading` says what a
recovery outside [0, 1] means (above 1: the patch overshoots; below 0: it moves the readout away
from the clean run), or that the pair's gap is within the run's numeric noise; over several
pairs each row also carries its component's recovery over the pairs with its bootstrap interval
(`summarise`), and one pair is said to have none.

Batching. Each row of a forward is the corrupt prompt of one (pair, patch); rows of one batch
carry different patches (any layer, site, span), so a sweep runs `batch_size` patches a forward.

Heads. The site `attn.hook_z` is the attention's per-head output before the output projection
([positions, heads, d_head], TransformerLens naming); a patch there with `head = h` copies head h
alone, with `head = None` every head (which is the same as patching `hook_attn_out`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from probekit.core.items import Pair
from probekit.core.public import public
from probekit.core.signal import is_weak, weak_under
from probekit.engines.base import HookedScorer, ScoreResult
from probekit.mechanism.components import (
    COMPONENT,
    Job,
    Patch,
    check,
    key_columns,
    make_job,
    row,
    table,
)
from probekit.mechanism.interventions import (
    AnswerNode,
    Edit,
    Loc,
    Position,
    answer_nodes,
    copy_values,
    score_with,
)
from probekit.mechanism.options import HookOptions
from probekit.mechanism.readouts import Readout
from probekit.mechanism.sites import hook_library, hook_order, library
from probekit.stats import bootstrap_units, mean_ratio


@public(HookOptions)
def sweep(
    scorer: HookedScorer,
    pairs: Sequence[Pair],
    patches: Sequence[Patch],
    readout: Readout,
    *,
    hooks: str = "transformer_lens",
    batch_size: int | None = None,
    run_noops: bool = False,
    remote: bool = False,
    through_answer: bool | None = None,
    progress: Any = True,
    distributions: bool = False,
) -> pd.DataFrame:
    """Run every patch on every pair; one row per (pair, patch), pair-major.

    `through_answer`: a span that runs to the end also patches the answer positions (see the
    module's docstring); None: yes with `transformer_lens`, no with `nnsight` (whose hooks reach
    the prompt pass only). `progress`: the progress of the runs (`probekit.core.progress`: a
    bar on a terminal, lines in a log; False for none). `distributions`: also
    `valid_mass_<run>` and `probs_<run>` (the answer probabilities normalised over the answer
    set, in `scorer.answers` order) of the clean, corrupt and patched runs.

    Columns: the items' key columns (a column on which clean and corrupt differ in some pair
    comes twice, as `clean_<col>` and `corrupt_<col>`), clean_prompt_id, corrupt_prompt_id,
    clean_prompt, corrupt_prompt (rendered text), layer, site (hook name), head (at
    `attn.hook_z`; else null), span, clean_positions, corrupt_positions (aligned, unpadded),
    `<m>_clean`, `<m>_corrupt`, `<m>_patched` (m = `readout.column`, e.g. expected), gap (clean -
    corrupt), recovery, ran, readout (the readout's spec), method (`exact` here) and estimate (the
    attribution estimate of m_patched - m_corrupt; NaN here, see `probekit.mechanism.attribution`),
    noise (the run's numeric noise on the readout, `numeric_noise`), small_gap (|gap| <=
    noise: the pair is left out of recovery over pairs, `summarise`) and valid_mass_patched
    (the patched run's valid mass; the corrupt run's where the patch did not run), whose mean
    per component below the weak-signal threshold is warned about (`weak_patches`).
    """
    check(scorer.model, pairs, patches)
    size = batch_size or scorer.batch_size
    if through_answer is None:
        through_answer = library(hooks) == "transformer_lens"
    jobs = [
        make_job(i, pair, patch, through_answer)
        for i, pair in enumerate(pairs)
        for patch in patches
    ]
    todo = [k for k, job in enumerate(jobs) if run_noops or not job.noop]
    runs = [jobs[k] for k in todo]
    read = sorted({job.patch.hook for job in runs}, key=hook_order)
    nodes = answer_nodes(scorer)
    bar = _bar(progress, len(todo) + 2 * len(pairs))
    # After the patched runs, each pair's prompts are scored again, unpatched, in another batch
    # shape than their baselines: the run's numeric noise (`numeric_noise`).
    again = [] if remote else list(dict.fromkeys(p.id for pair in pairs for p in pair))
    entries: list[int | str] = [*todo, *again]
    prompts = {prompt.id: prompt for pair in pairs for prompt in pair}
    with hook_library(scorer.model, hooks):  # every run on the same kernels; left as found
        baseline, clean_acts = _baselines(scorer, pairs, runs, read, size, hooks, remote, nodes)
        bar.update(2 * len(pairs))
        patched: dict[int, float] = {}  # job index -> readout of the patched run
        masses: dict[int, float] = {}  # job index -> valid mass of the patched run
        kept: dict[int, ScoreResult] = {}  # job index -> the patched run's result
        rescored: dict[str, ScoreResult] = {}  # prompt id -> its unpatched result, scored again
        for start in range(0, len(entries), size):
            chunk = entries[start : start + size]
            ks = [k for k in chunk if isinstance(k, int)]
            if not ks:  # no patched run to share a batch with: each prompt alone, unpadded
                for key in chunk:
                    (rescored[key],) = scorer.score_batch(
                        [prompts[key].input_ids], reuse_prefix=False
                    )
                continue
            edits = _edits(jobs, ks, pairs, clean_acts, nodes)
            batch = [pairs[jobs[k].pair][1] for k in ks] + [
                prompts[key] for key in chunk[len(ks) :]
            ]
            results, _ = score_with(
                scorer, [p.input_ids for p in batch], edits=edits, hooks=hooks, remote=remote
            )
            for k, prompt, result in zip(ks, batch, results, strict=False):
                patched[k] = readout(result, prompt.item, baseline[pairs[jobs[k].pair][0].id])
                masses[k] = result.valid_mass
                if distributions:
                    kept[k] = result
            for prompt, result in zip(batch[len(ks) :], results[len(ks) :], strict=True):
                rescored[prompt.id] = result
            bar.update(len(ks))
        bar.close()
    noise = numeric_noise(scorer.model, pairs if again else [], readout, baseline, rescored)
    keys = key_columns(pairs)
    rows = []
    for k, job in enumerate(jobs):
        clean, corrupt = pairs[job.pair]
        m_clean = readout(baseline[clean.id], clean.item, baseline[clean.id])
        m_corrupt = readout(baseline[corrupt.id], corrupt.item, baseline[clean.id])
        m_patched = patched.get(k, m_corrupt)
        rows.append(row(pairs[job.pair], keys, job, readout, m_clean, m_corrupt, m_patched))
        rows[-1]["ran"] = k in patched
        rows[-1]["noise"] = noise
        rows[-1]["small_gap"] = not abs(m_clean - m_corrupt) > noise
        rows[-1]["valid_mass_patched"] = masses.get(k, baseline[corrupt.id].valid_mass)
        if distributions:
            runs = {"clean": baseline[clean.id], "corrupt": baseline[corrupt.id]}
            runs["patched"] = kept.get(k, runs["corrupt"])
            for name, result in runs.items():
                rows[-1][f"valid_mass_{name}"] = result.valid_mass
                rows[-1][f"probs_{name}"] = np.asarray(result.probs, dtype=float)
    out = table(rows)
    out.attrs["answers"] = list(scorer.answers.answers)
    return out


NOISE_FACTOR = 10.0
"""A gap counts as numeric noise when it is at most this many times the largest change of the
readout between two scorings of the same prompt."""


def numeric_noise(
    model: Any,
    pairs: Sequence[Pair],
    readout: Readout,
    baseline: dict[str, ScoreResult],
    again: dict[str, ScoreResult],
) -> float:
    """The run's numeric noise on the readout: `NOISE_FACTOR` x the largest change of any
    pair's gap between its baselines and its prompts scored `again` in another batch shape (with
    the sweep's last patched runs, or alone), and at least `NOISE_FACTOR` x the dtype's
    resolution at the readouts' scale (the resolution alone without pairs, as for a remote
    model, which is not scored again)."""
    worst = 0.0
    values = []
    for clean, corrupt in pairs:
        c, k = again[clean.id], again[corrupt.id]
        before = readout(baseline[clean.id], clean.item, baseline[clean.id]) - readout(
            baseline[corrupt.id], corrupt.item, baseline[clean.id]
        )
        after = readout(c, clean.item, c) - readout(k, corrupt.item, c)
        if np.isfinite(before) and np.isfinite(after):
            worst = max(worst, abs(after - before))
            values.append(abs(readout(baseline[clean.id], clean.item, baseline[clean.id])))
    scale = max([1.0, *values])
    resolution = float(torch.finfo(model.dtype).eps) * scale
    return NOISE_FACTOR * max(worst, resolution)


def summarise(df: pd.DataFrame, n: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per component (layer, site, head, span), over the pairs: the mean exact effect
    (m_patched - m_corrupt, where measured) and the mean attribution estimate, each with its
    bootstrap interval over pairs (`<x>_low`, `<x>_high`); `recovery`, the mean effect over the
    mean gap (a ratio of means, so one pair with a tiny gap cannot blow it up) with its
    bootstrap interval over pairs, and `estimated_recovery` the same of the estimate; `pairs`,
    and `pairs_in_noise`, the pairs whose gap is within the run's numeric noise (`small_gap`),
    left out of both recoveries; `gap`, their mean gap; `reading`, a line reading a recovery
    outside [0, 1] beyond the run's noise (`reading`). Largest |effect| (else |estimate|) first."""
    patched = next(c for c in df.columns if c.endswith("_patched"))
    corrupt = patched.removesuffix("_patched") + "_corrupt"
    small = df["small_gap"] if "small_gap" in df else pd.Series(False, index=df.index)
    frame = df.assign(
        effect=(df[patched] - df[corrupt]).where(df["ran"] | (df["method"] == "exact")),
        small_gap=small.astype(bool),
    )
    rows = []
    for key, group in frame.groupby(COMPONENT, sort=False, dropna=False):
        entry: dict[str, Any] = dict(zip(COMPONENT, key, strict=True))
        for column in ("effect", "estimate"):
            values = group[column].dropna().to_numpy()
            if len(values) == 0:
                entry |= {column: np.nan, f"{column}_low": np.nan, f"{column}_high": np.nan}
                continue
            ci = bootstrap_units(
                len(values), lambda d, v=values: v[d].mean(-1), n, seed, level, batched=True
            )
            entry |= {column: ci.estimate, f"{column}_low": ci.low, f"{column}_high": ci.high}
        kept = group[~group["small_gap"]]
        for column, name in (("effect", "recovery"), ("estimate", "estimated_recovery")):
            effect, gap = kept[column].to_numpy(float), kept["gap"].to_numpy(float)
            entry |= _ratio(effect, gap, name, n, seed, level)
        gaps = kept["gap"].to_numpy(float)
        entry["gap"] = float(gaps[np.isfinite(gaps)].mean()) if np.isfinite(gaps).any() else np.nan
        entry["pairs"] = len(group)
        entry["pairs_in_noise"] = int(group["small_gap"].sum())
        if "valid_mass_patched" in group:
            entry["mean_valid_mass_patched"] = float(group["valid_mass_patched"].mean())
            entry["weak_signal"] = is_weak(entry["mean_valid_mass_patched"])
        rows.append(entry)
    out = pd.DataFrame(rows)
    out["head"] = out["head"].astype("Int64")
    slack = _tolerance(df, out["gap"])
    out["reading"] = [reading(r, tolerance=t) for r, t in zip(out["recovery"], slack, strict=True)]
    size = out["effect"].abs().fillna(out["estimate"].abs())
    return out.loc[size.sort_values(ascending=False, kind="stable").index].reset_index(drop=True)


OVERSHOOT = (
    "above 1: the patch overshoots: the patched component carries more than the gap, and "
    "other paths offset it in the corrupt run"
)
AWAY = "below 0: the patch moves the readout away from the clean run"
IN_NOISE = "the gap is within the run's numeric noise (small_gap): the recovery says nothing"


def reading(recovery: float, small_gap: bool = False, tolerance: float = 0.0) -> str:
    """One line reading a recovery outside [0, 1] by more than `tolerance` (the run's numeric
    noise over the gap: a recovery of 1.000002 is 1) — above 1: an overshoot; below 0: away
    from clean — or saying that its gap is within the run's noise; empty otherwise."""
    if small_gap:
        return IN_NOISE
    if np.isfinite(recovery) and recovery > 1 + tolerance:
        return OVERSHOOT
    if np.isfinite(recovery) and recovery < -tolerance:
        return AWAY
    return ""


def annotate(df: pd.DataFrame, n: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """The patching table with each row's `reading` (see `reading`) and, over several pairs,
    each component's recovery over the pairs with its bootstrap interval
    (`recovery_over_pairs`, `_low`, `_high`: `summarise`'s ratio of means; NaN with one pair,
    which has no interval). `attrs["note"]` says which, and names the pairs left out as
    numeric noise."""
    out = df.copy()
    small = out["small_gap"] if "small_gap" in out else pd.Series(False, index=out.index)
    slack = _tolerance(out, out["gap"])
    out["reading"] = [
        reading(r, bool(g), t) for r, g, t in zip(out["recovery"], small, slack, strict=True)
    ]
    ids = out[["clean_prompt_id", "corrupt_prompt_id"]].drop_duplicates()
    columns = ["recovery_over_pairs", "recovery_over_pairs_low", "recovery_over_pairs_high"]
    if len(ids) < 2:
        for column in columns:
            out[column] = np.nan
        note = (
            "one pair: each recovery is that pair's alone, with no interval over pairs (give "
            "several pairs for recovery_over_pairs and its interval)"
        )
    else:
        summary = summarise(out, n=n, seed=seed, level=level)
        names = dict(zip(["recovery", "recovery_low", "recovery_high"], columns, strict=True))
        summary = summary[[*COMPONENT, *names]].rename(columns=names)
        out = out.merge(summary, on=COMPONENT, how="left")
        note = (
            f"recovery_over_pairs: each component's mean effect over its mean gap across the "
            f"{len(ids)} pairs, with its {level:.0%} bootstrap interval over pairs "
            "(recovery_over_pairs_low, recovery_over_pairs_high)"
        )
    noise = noise_line(df)
    out.attrs = {**df.attrs, "note": f"{note}; {noise}" if noise else note}
    out.attrs["weak_signal"] = weak_patches(df)
    return out


def weak_patches(df: pd.DataFrame) -> str | None:
    """One line when patching drove a component's mean valid mass (`valid_mass_patched`, over
    its pairs) below the weak-signal threshold, naming those components; None otherwise (and
    for a table without the column: attribution estimates patch nothing)."""
    if "valid_mass_patched" not in df or df["valid_mass_patched"].isna().all():
        return None
    masses = df.groupby(COMPONENT, sort=False, dropna=False)["valid_mass_patched"].mean()
    weak = masses[[is_weak(m) for m in masses]]
    names = [
        f"L{layer} {site}{'' if pd.isna(head) else f' head {int(head)}'} at {span}"
        for layer, site, head, span in weak.index
    ]
    lowest = float(weak.min()) if len(weak) else 0.0
    return weak_under("the patches of", names, lowest)


def _tolerance(df: pd.DataFrame, gaps: pd.Series) -> np.ndarray:
    """The run's numeric noise in recovery units, for each gap (0 where the table has none)."""
    noise = float(df["noise"].max()) if "noise" in df and df["noise"].notna().any() else 0.0
    with np.errstate(divide="ignore"):
        return noise / np.abs(gaps.to_numpy(float))


def _ratio(
    effect: np.ndarray, gap: np.ndarray, name: str, n: int, seed: int, level: float
) -> dict[str, float]:
    """mean(effect) / mean(gap) over the pairs where both are finite, with its bootstrap
    interval over those pairs (NaN where a resample's mean gap is 0)."""
    ok = np.isfinite(effect) & np.isfinite(gap)
    effect, gap = effect[ok], gap[ok]
    nan = {name: np.nan, f"{name}_low": np.nan, f"{name}_high": np.nan}
    if len(effect) == 0 or gap.mean() == 0:
        return nan

    ci = bootstrap_units(len(effect), mean_ratio(effect, gap), n, seed, level, batched=True)
    return {name: ci.estimate, f"{name}_low": ci.low, f"{name}_high": ci.high}


def noise_line(df: pd.DataFrame) -> str | None:
    """One line naming the pairs left out of recovery because their gap is within the run's
    numeric noise (None when there are none)."""
    if "small_gap" not in df or not df["small_gap"].any():
        return None
    ids = df.loc[df["small_gap"], ["clean_prompt_id", "corrupt_prompt_id"]].drop_duplicates()
    total = df[["clean_prompt_id", "corrupt_prompt_id"]].drop_duplicates()
    return (
        f"{len(ids)} of {len(total)} pairs have a gap within the run's numeric noise "
        f"(|gap| <= {df['noise'].iloc[0]:.2g}) and are left out of recovery"
    )


def _edits(
    jobs: list[Job],
    ks: list[int],
    pairs: Sequence[Pair],
    clean_acts: dict,
    nodes: list[AnswerNode],
) -> dict[str, Edit]:
    """The edits of one batch whose first rows run the jobs `ks`: at each hook, the clean run's
    values at the aligned positions (answer positions too for a job through the answer)."""
    edits: dict[str, Edit] = {}
    for hook in {jobs[k].patch.hook for k in ks}:
        locs: list[Loc] = []
        values, heads = [], []
        for at, k in enumerate(ks):
            job = jobs[k]
            if job.patch.hook == hook:
                sources: list[Position] = list(job.clean_positions)
                targets: list[Position] = list(job.corrupt_positions)
                if job.answer:
                    sources, targets = sources + nodes, targets + nodes
                locs += [(at, p) for p in targets]
                acts, where = clean_acts[pairs[job.pair][0].id]
                values.append(acts[hook][[where[p] for p in sources]])
                heads += [job.patch.head] * len(targets)
        edits[hook] = (locs, copy_values(torch.cat(values), heads))
    return edits


def _bar(progress: Any, total: int) -> Any:
    """The progress of `total` patched runs (`progress`: True for `probekit.core.progress`'s,
    False for none, or a bar to reuse)."""
    from probekit.core.progress import Silent
    from probekit.core.progress import progress as track

    if progress is None or isinstance(progress, bool):
        return track(total, "run", "patching") if progress else Silent()
    return progress


def _baselines(
    scorer: HookedScorer,
    pairs: Sequence[Pair],
    todo: list[Job],
    read: list[str],
    size: int,
    hooks: str,
    remote: bool,
    nodes: list[AnswerNode],
) -> tuple[dict, dict]:
    """The exact result of every clean and corrupt prompt (by prompt id); for clean prompts with
    patches to run, their activations at the hooks `read` on the positions those patches copy,
    answer positions `nodes` included where a patch runs through the answer ({hook: [n, d]},
    position index)."""
    needed: dict[str, set[Position]] = {}
    for job in todo:
        needed.setdefault(pairs[job.pair][0].id, set()).update(job.clean_positions)
        if job.answer:
            needed[pairs[job.pair][0].id].update(nodes)
    prompts = {p.id: p for pair in pairs for p in pair}
    keys = list(prompts)
    baseline: dict[str, ScoreResult] = {}
    acts: dict[str, tuple[dict[str, torch.Tensor], dict[int, int]]] = {}
    for start in range(0, len(keys), size):
        chunk = keys[start : start + size]
        positions = {at: _ordered(needed.get(key, ())) for at, key in enumerate(chunk)}
        locs = [(at, p) for at, ps in positions.items() for p in ps]
        reads = {hook: locs for hook in read} if locs else None
        batch = [prompts[k].input_ids for k in chunk]
        results, values = score_with(scorer, batch, reads=reads, hooks=hooks, remote=remote)
        at = 0
        for i, (key, result) in enumerate(zip(chunk, results, strict=True)):
            baseline[key] = result
            n = len(positions[i])
            if n:
                block = {hook: values[hook][at : at + n] for hook in read}
                acts[key] = (block, {p: j for j, p in enumerate(positions[i])})
            at += n
    return baseline, acts


def _ordered(positions: set[Position]) -> list[Position]:
    """Prompt positions in order, then answer nodes in order."""
    return sorted(positions, key=lambda p: (1, p.node) if isinstance(p, AnswerNode) else (0, p))
