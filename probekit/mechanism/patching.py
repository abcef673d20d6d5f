"""Exact activation patching of counterfactual pairs, measured with the exact scoring engine.

A patch (layer, site, span[, head]; `mechanism.components`) copies the clean run's activation at
the TransformerLens hook `blocks.{layer}.{site}` into the corrupt run at the span's positions
(`mechanism.pairs`). It acts during the engine's prompt pass only; the engine then
expands the answer trie from the patched KV cache, so the patch reaches every answer token
(`mechanism.interventions.score_with`). The effect is read on a per-prompt readout
(`probekit.mechanism.readouts`: expected value, P(answer), P(correct), a difference; TransformerLens
calls it the patching metric): a pair's `recovery = (m_patched - m_corrupt) / (m_clean -
m_corrupt)` (NaN when the denominator is 0).

Which positions a patch writes. A span writes its prompt positions (`mechanism.pairs`).
A span that runs to the end of both prompts (`from_<span>`, `answer`, or a span that ends at the
last token) also writes every answer position (`through_answer=True`, the default with
`hooks="transformer_lens"`; nnsight's hooks reach the prompt pass only): the engine
reads a multi-token answer at positions after the prompt (its trie of answer tokens), and each
gets the clean run's activation at the same continuation. Patching `from_<span>` at
`hook_resid_pre` then gives the clean run exactly, at every layer: its status is `trivial`
(`mechanism.components`). With `through_answer=False` the answer positions are left
alone and read the patched prompt through the KV cache of layers >= l only, so at late layers
the answer's later tokens mix patched and corrupt values and recovery can leave [0, 1].

Patches known to change nothing (`not run`) are not run unless `run_noops=True`.

Over sets and units (`summarise`). The pairs come in sets (`mechanism.pairs.PairSet`: a pair
alone for a study's difference, the four pairs of a 2x2 interaction), each pair with a sign. A
component's effect on a set is the signed sum of its pairs' effects (m_patched - m_corrupt),
the set's gap the signed sum of their gaps; its recovery is the mean effect over the mean gap
across sets (a ratio of means, so one set with a tiny gap cannot blow it up). Intervals are
percentile bootstrap intervals that resample the study's units (events, items, samples: the
pairs' `Item.unit`), each drawn unit bringing all its sets, since the sets of one unit share
its content; with one unit there is none. Each measured component's p value is the two-sided
sign-flip test over units of its mean effect (`probekit.stats.sign_flip_test`), adjusted with
Holm's method over the family of components tested in the table (`p_adjusted`); a component
not run, trivial or whose patched runs are a weak signal is not tested.

Reading a table (`annotate`, what `probekit.patch` returns): each row's `reading` says what a
recovery outside [0, 1] means (above 1: the patch overshoots; below 0: it moves the readout away
from the clean run) where its interval lies outside (one pair's: its recovery give or take the
run's numeric noise), or that its set's gap is within that noise; each row also carries its
component's recovery over the sets with its interval over units (`summarise`).

Batching. Each row of a forward is the host prompt (the corrupt one; the clean one for a block)
of one (pair, patch); rows of one batch carry different patches (any layer, site, span), so a
sweep runs `batch_size` patches a forward.

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
from probekit.core.progress import Silent
from probekit.core.progress import progress as track
from probekit.core.public import public
from probekit.core.signal import is_weak, weak_under
from probekit.engines.base import HookedScorer, ScoreResult
from probekit.mechanism.components import (
    COMPONENT,
    MEASURED,
    NOT_RUN,
    TRIVIAL,
    Job,
    Patch,
    check,
    exact_effect,
    make_job,
    pair_columns,
    row,
)
from probekit.mechanism.interventions import (
    AnswerNode,
    Edit,
    LocationValues,
    Position,
    answer_nodes,
    score_with,
)
from probekit.mechanism.options import HookOptions
from probekit.mechanism.pairs import PairSet, as_sets
from probekit.mechanism.readouts import Readout
from probekit.mechanism.sites import hook_library, hook_order, library
from probekit.stats import bootstrap_units, holm, mean_ratio, sign_flip_test

SUMMARY = [*COMPONENT, "swapped"]
"""The columns naming one row of a summary: a component, and the identity its pairs swap."""
ADJUSTMENT = "holm"
"""How a table's p values are adjusted for the family of components tested (`p_adjusted`)."""
CHUNK_BATCHES = 2
"""Batches of patched runs in a chunk of a sweep (rounded up to whole pairs): the sweep measures
its rows chunk by chunk, each with its pairs' baselines and noise, so a sweep kept in parts
(`probekit.run.patch`), which measures the same chunks, writes the same table."""


def chunk_rows(patches: int, batch_size: int) -> int:
    """The rows of a chunk of a sweep: `CHUNK_BATCHES` batches, rounded up to whole pairs."""
    return patches * -(-CHUNK_BATCHES * batch_size // patches)


@public(HookOptions)
def sweep(
    scorer: HookedScorer,
    pairs: Sequence[Pair] | Sequence[PairSet],
    patches: Sequence[Patch],
    readout: Readout,
    *,
    hooks: str = "transformer_lens",
    batch_size: int | None = None,
    run_noops: bool = False,
    through_answer: bool | None = None,
    progress: Any = True,
    distributions: bool = False,
    rows: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Run every patch on every pair; one row per (pair, patch), pair-major.

    `pairs`: (clean, corrupt) pairs, each a set of its own, or a study's `PairSet`s.
    `through_answer`: a span that runs to the end also patches the answer positions (see the
    module's docstring); None: yes with `transformer_lens`, no with `nnsight` (whose hooks reach
    the prompt pass only). `progress`: the progress of the runs (`probekit.core.progress`: a
    bar on a terminal, lines in a log; False for none). `distributions`: also
    `valid_mass_<run>` and `probs_<run>` (the answer probabilities normalised over the answer
    set, in `scorer.answers` order) of the clean, corrupt and patched runs. `rows`: only these
    rows of the table (their positions in it), as a sweep kept in parts measures them; their
    `noise` and `small_gap` are then their own pairs' (`in_noise` makes them the table's).

    Columns: the items' key columns (a column on which clean and corrupt differ in some pair
    comes twice, as `clean_<col>` and `corrupt_<col>`), unit, set, sign (the pair's sign in its
    set), swapped (the key column(s) the pair swaps), contrast (`difference`, `interaction`),
    clean_prompt_id, corrupt_prompt_id, clean_prompt, corrupt_prompt (rendered text), layer,
    site (hook name), head (at `attn.hook_z`; else null), span, clean_positions,
    corrupt_positions (the span's, unpadded), alignment (`position`, or `block` for spans of
    unequal token counts), status (`measured`, `not run`, `trivial`: `mechanism.components`),
    `<m>_clean`, `<m>_corrupt`, `<m>_patched` (m = `readout.column`, e.g. expected), gap (clean -
    corrupt), recovery, ran, readout (the readout's spec), method (`exact` here) and estimate (the
    attribution estimate of m_patched - m_corrupt; NaN here, see `probekit.mechanism.attribution`),
    noise (the run's numeric noise on the readout, `numeric_noise`), small_gap (the |signed gap|
    of the pair's set is within that noise, per pair: the set is left out of recovery,
    `summarise`) and valid_mass_patched (the patched run's valid mass; the corrupt run's where
    the patch did not run), whose mean per component below the weak-signal threshold is warned
    about (`weak_patches`).
    """
    pairs, about = pair_columns(as_sets(pairs))
    check(scorer.model, pairs, patches)
    size, n = batch_size or scorer.batch_size, len(patches)
    if through_answer is None:
        through_answer = library(hooks) == "transformer_lens"
    chosen = list(range(len(pairs) * n) if rows is None else rows)
    # row index (pair-major) -> its job
    jobs = {k: make_job(k // n, pairs[k // n], patches[k % n], through_answer) for k in chosen}
    todo = {k for k in chosen if run_noops or jobs[k].status != NOT_RUN}
    # chunk by chunk (whole pairs), as a sweep kept in parts measures them (`probekit.run.patch`)
    step = chunk_rows(n, size) if rows is None else len(chosen)
    parts = [chosen[start : start + step] for start in range(0, len(chosen), step)]
    bar = _bar(progress, len(todo) + 2 * sum(len({k // n for k in part}) for part in parts))
    nodes, found_rows = answer_nodes(scorer), []
    with hook_library(scorer.model, hooks):  # every run on the same kernels; left as found
        for part in parts:
            used = [pairs[i] for i in sorted({k // n for k in part})]
            prompts = {prompt.id: prompt for pair in used for prompt in pair}
            runs = [k for k in part if k in todo]
            baseline, acts = _baselines(
                scorer, pairs, prompts, [jobs[k] for k in runs], size, hooks, nodes
            )
            bar.update(2 * len(used))
            # After the patched runs, each pair's prompts are scored again, unpatched, in another
            # batch shape than their baselines: the run's numeric noise (`numeric_noise`).
            entries: list[int | str] = [*runs, *prompts]
            patched: dict[int, ScoreResult] = {}  # row index -> the patched run's result
            again: dict[str, ScoreResult] = {}  # prompt id -> its unpatched result, scored again
            for start in range(0, len(entries), size):
                batch_entries = entries[start : start + size]
                ks = [k for k in batch_entries if isinstance(k, int)]
                if not ks:  # no patched run to share a batch with: each prompt alone, unpadded
                    for key in batch_entries:
                        ids = [prompts[key].input_ids]
                        (again[key],) = scorer.score_batch(ids, reuse_prefix=False)
                    continue
                edits = _edits(jobs, ks, pairs, acts, nodes)
                batch = [pairs[jobs[k].pair][not jobs[k].block] for k in ks]  # the host
                batch += [prompts[key] for key in batch_entries[len(ks) :]]
                results, _ = score_with(
                    scorer, [p.input_ids for p in batch], edits=edits, hooks=hooks
                )
                patched |= dict(zip(ks, results, strict=False))
                again |= {
                    p.id: r for p, r in zip(batch[len(ks) :], results[len(ks) :], strict=True)
                }
                bar.update(len(ks))
            noise = numeric_noise(scorer.model, used, readout, baseline, again)
            for k in part:
                job = jobs[k]
                clean, corrupt = pairs[job.pair]
                found = {"clean": baseline[clean.id], "corrupt": baseline[corrupt.id]}
                found["patched"] = patched.get(k, found["corrupt"])
                values = [
                    readout(found[name], p.item, found["clean"])
                    for name, p in zip(found, (clean, corrupt, corrupt), strict=True)
                ]
                entry = row(job, readout, *values, about[job.pair])
                entry |= {"ran": k in patched, "noise": noise}
                entry["valid_mass_patched"] = found["patched"].valid_mass
                for name, result in found.items() if distributions else ():
                    entry[f"valid_mass_{name}"] = result.valid_mass
                    entry[f"probs_{name}"] = np.asarray(result.probs, dtype=float)
                found_rows.append(entry)
    bar.close()
    out = in_noise(pd.DataFrame(found_rows).astype({"head": "Int64"}))
    out.attrs["answers"] = list(scorer.answers.answers)
    return out


def _bar(progress: Any, total: int) -> Any:
    """The progress a sweep updates: `progress` itself, a new one (True) or none (False)."""
    if progress is True:
        return track(total, "run", "patching")
    return progress if hasattr(progress, "update") else Silent()


def in_noise(df: pd.DataFrame) -> pd.DataFrame:
    """The table with the run's numeric noise its rows' largest (`numeric_noise` over all its
    pairs) and `small_gap` per row: whether the |signed sum of gaps| of its set (per component)
    is within that noise times the set's pairs."""
    df = df.assign(noise=df["noise"].max())
    signed = (df["sign"] * df["gap"]).groupby(
        [df["set"], *(df[c] for c in COMPONENT)], dropna=False
    )
    return df.assign(
        small_gap=~(signed.transform("sum").abs() > df["noise"] * signed.transform("size"))
    )


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
    resolution at the readouts' scale (the resolution alone without pairs)."""
    worst, scale = 0.0, 1.0
    for clean, corrupt in pairs:
        first = readout(baseline[clean.id], clean.item, baseline[clean.id])
        before = first - readout(baseline[corrupt.id], corrupt.item, baseline[clean.id])
        c, k = again[clean.id], again[corrupt.id]
        after = readout(c, clean.item, c) - readout(k, corrupt.item, c)
        if np.isfinite(before) and np.isfinite(after):
            worst, scale = max(worst, abs(after - before)), max(scale, abs(first))
    return NOISE_FACTOR * max(worst, float(torch.finfo(model.dtype).eps) * scale)


def set_sums(rows: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Per set of pairs, in order: its unit, its pairs and the signed sum of each of `columns`
    over them (NaN where a pair's value is)."""
    signed = rows[list(columns)].mul(rows["sign"], axis=0)
    by = rows["set"]
    sums = signed.groupby(by, sort=False).sum().where(~signed.isna().groupby(by, sort=False).any())
    first = rows.groupby(by, sort=False)
    return sums.assign(unit=first["unit"].first(), pairs=first.size())


def summarise(df: pd.DataFrame, n: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per component (layer, site, head, span) and swapped identity, over the sets of pairs (see
    the module): `status` (`measured`, `not run`, `trivial`); the mean exact effect on a set
    (the signed sum of m_patched - m_corrupt, where measured) and the mean attribution estimate,
    each with its bootstrap interval over units (`<x>_low`, `<x>_high`); `recovery`, the mean
    effect over the mean gap (a ratio of means) with its interval, and `estimated_recovery` the
    same of the estimate; `p_value`, the sign-flip test over units of the mean effect, and
    `p_adjusted`, Holm's over the components tested (measured, not a weak signal); `gap`, the
    mean set gap; `pairs`, `sets`, `units`, and `pairs_in_noise` (the pairs of sets whose gap is
    within the run's numeric noise, left out of both recoveries); `reading`, a line reading a
    recovery whose interval lies outside [0, 1]. Intervals are NaN with one unit. Measured
    components first, largest |effect| (else |estimate|) first."""
    frame = df.assign(small_gap=df.get("small_gap", False), effect=exact_effect(df))
    rows = []
    for key, group in frame.groupby(SUMMARY, sort=False, dropna=False):
        entry: dict[str, Any] = dict(zip(SUMMARY, key, strict=True))
        entry["status"] = next(
            (s for s in (MEASURED, TRIVIAL) if s in set(group["status"])), NOT_RUN
        )
        sets = set_sums(group, ["effect", "estimate", "gap"])
        small = group.groupby("set", sort=False)["small_gap"].any()
        for column in ("effect", "estimate"):
            entry |= over_units(sets, column, None, column, n, seed, level)
        kept = sets[~small]
        entry |= over_units(kept, "effect", "gap", "recovery", n, seed, level)
        entry |= over_units(kept, "estimate", "gap", "estimated_recovery", n, seed, level)
        entry["p_value"] = sign_flip_test(
            sets.groupby("unit", sort=False)["effect"].mean().to_numpy(), seed=seed
        )
        entry["gap"] = float(kept["gap"].mean()) if len(kept) else np.nan
        entry |= {"pairs": len(group), "sets": len(sets), "units": sets["unit"].nunique()}
        entry["pairs_in_noise"] = int(sets.loc[small, "pairs"].sum())
        if "valid_mass_patched" in group:
            entry["mean_valid_mass_patched"] = float(group["valid_mass_patched"].mean())
            entry["weak_signal"] = is_weak(entry["mean_valid_mass_patched"])
        rows.append(entry)
    out = pd.DataFrame(rows).astype({"head": "Int64"})
    untested = (out["status"] != MEASURED) | out.get("weak_signal", False)
    out["p_value"] = out["p_value"].mask(untested)
    out["p_adjusted"] = holm(out["p_value"].to_numpy())
    out["reading"] = [
        reading(r.recovery, False, slack, r.recovery_low, r.recovery_high)
        if r.status == MEASURED
        else ""
        for r, slack in zip(out.itertuples(), _tolerance(df, out["gap"]), strict=True)
    ]
    size = out["effect"].abs().fillna(out["estimate"].abs()).where(out["status"] == MEASURED, -1)
    out = out.loc[size.sort_values(ascending=False, kind="stable").index].reset_index(drop=True)
    out.attrs |= {"adjustment": ADJUSTMENT, "level": level, "bootstrap": n, "seed": seed}
    return out


def over_units(
    sets: pd.DataFrame,
    column: str,
    below: str | None,
    name: str,
    n: int,
    seed: int,
    level: float,
) -> dict[str, float]:
    """sum(sets[column]) / sum(sets[below]) (the mean over sets without `below`) over the sets
    where both are finite, with its percentile bootstrap interval over their units (each drawn
    unit brings all its sets; NaN with one unit, or where a resample's denominator is 0)."""
    top = sets[column].to_numpy(float)
    bottom = np.ones(len(sets)) if below is None else sets[below].to_numpy(float)
    ok = np.isfinite(top) & np.isfinite(bottom)
    out = {name: np.nan, f"{name}_low": np.nan, f"{name}_high": np.nan}
    if not ok.any() or bottom[ok].sum() == 0:
        return out
    units = sets["unit"].to_numpy()[ok]
    upper = pd.Series(top[ok]).groupby(units, sort=False).sum().to_numpy()
    lower = pd.Series(bottom[ok]).groupby(units, sort=False).sum().to_numpy()
    ci = bootstrap_units(len(upper), mean_ratio(upper, lower), n, seed, level, batched=True)
    if len(upper) < 2:
        return out | {name: ci.estimate}
    return {name: ci.estimate, f"{name}_low": ci.low, f"{name}_high": ci.high}


OVERSHOOT = (
    "above 1: the patch overshoots: the patched component carries more than the gap, and "
    "other paths offset it in the corrupt run"
)
AWAY = "below 0: the patch moves the readout away from the clean run"
IN_NOISE = "the gap is within the run's numeric noise (small_gap): the recovery says nothing"


def reading(
    recovery: float,
    small_gap: bool = False,
    tolerance: float = 0.0,
    low: float = np.nan,
    high: float = np.nan,
) -> str:
    """One line reading a recovery whose interval lies outside [0, 1] by more than `tolerance`
    (the run's numeric noise over the gap: a recovery of 1.000002 is 1) — above 1: an
    overshoot; below 0: away from clean — or saying that its gap is within the run's noise;
    empty otherwise. The interval is [`low`, `high`] where given (over units), else the
    recovery itself (one pair's, whose only uncertainty is the noise)."""
    if small_gap:
        return IN_NOISE
    if not np.isfinite(low) or not np.isfinite(high):
        low = high = recovery
    if np.isfinite(low) and low > 1 + tolerance:
        return OVERSHOOT
    if np.isfinite(high) and high < -tolerance:
        return AWAY
    return ""


def annotate(df: pd.DataFrame, n: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """The patching table with each row's `reading` of its own pair (see `reading`) and each
    component's recovery over the sets with its bootstrap interval over units
    (`recovery_over_pairs`, `_low`, `_high`: `summarise`'s ratio of means; the interval NaN
    with one unit, the recovery too with one pair). `attrs["note"]` says which, and names the
    pairs left out as numeric noise."""
    out = df.assign(small_gap=df.get("small_gap", False))
    slack = _tolerance(out, out["gap"])
    out["reading"] = [
        reading(r, bool(g), t)
        for r, g, t in zip(out["recovery"], out["small_gap"], slack, strict=True)
    ]
    pairs = len(out[["clean_prompt_id", "corrupt_prompt_id"]].drop_duplicates())
    units = out["unit"].nunique()
    names = {
        c: c.replace("recovery", "recovery_over_pairs")
        for c in ("recovery", "recovery_low", "recovery_high")
    }
    if pairs < 2:
        out = out.assign(**dict.fromkeys(names.values(), np.nan))
        note = (
            "one pair: each recovery is that pair's alone, with no interval over pairs (give "
            "several pairs for recovery_over_pairs and its interval)"
        )
    else:
        summary = summarise(out, n=n, seed=seed, level=level)[[*SUMMARY, *names]]
        out = out.merge(summary.rename(columns=names), on=SUMMARY, how="left")
        over = (
            f"its {level:.0%} bootstrap interval over the {units} units"
            if units > 1
            else "no interval: the pairs share one unit (give pairs on several)"
        )
        note = (
            f"recovery_over_pairs: each component's mean effect over its mean gap across the "
            f"{pairs} pairs, with {over} (recovery_over_pairs_low, recovery_over_pairs_high)"
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
    return weak_under("the patches of", names, float(weak.min()) if len(weak) else 0.0)


def _tolerance(df: pd.DataFrame, gaps: pd.Series) -> np.ndarray:
    """The run's numeric noise in recovery units, for each gap (0 where the table has none)."""
    noise = float(df["noise"].max()) if "noise" in df and df["noise"].notna().any() else 0.0
    with np.errstate(divide="ignore"):
        return noise / np.abs(gaps.to_numpy(float))


def noise_line(df: pd.DataFrame) -> str | None:
    """One line naming the pairs left out of recovery because their set's gap is within the
    run's numeric noise (None when there are none)."""
    if "small_gap" not in df or not df["small_gap"].any():
        return None
    ids = ["clean_prompt_id", "corrupt_prompt_id"]
    return (
        f"{len(df.loc[df['small_gap'], ids].drop_duplicates())} of "
        f"{len(df[ids].drop_duplicates())} pairs have a gap within the run's numeric noise "
        f"(|gap| <= {df['noise'].iloc[0]:.2g}) and are left out of recovery"
    )


def _edits(
    jobs: dict[int, Job],
    ks: list[int],
    pairs: Sequence[Pair],
    source_acts: dict,
    nodes: list[AnswerNode],
) -> dict[str, Edit]:
    """The edits of one batch whose first rows run the jobs `ks`: at each hook, the source
    run's values (the clean prompt's; the corrupt one's for a block) at the job's target
    positions (answer positions too where the job writes them)."""
    edits: dict[str, Edit] = {}
    for hook in {jobs[k].patch.hook for k in ks}:
        locs: list = []
        values, heads = [], []
        for at, job in ((at, jobs[k]) for at, k in enumerate(ks) if jobs[k].patch.hook == hook):
            extra: list[Position] = list(nodes) if job.nodes else []
            targets = [*job.target, *extra]
            locs += [(at, p) for p in targets]
            acts, where = source_acts[pairs[job.pair][job.block].id]
            values.append(acts[hook][[where[p] for p in [*job.source, *extra]]])
            heads += [job.patch.head] * len(targets)
        if locs:
            edits[hook] = (locs, LocationValues(torch.cat(values), heads))
    return edits


def _baselines(
    scorer: HookedScorer,
    pairs: Sequence[Pair],
    prompts: dict[str, Any],
    todo: list[Job],
    size: int,
    hooks: str,
    nodes: list[AnswerNode],
) -> tuple[dict, dict]:
    """The exact result of each of `prompts` (by prompt id); for the prompts whose values
    patches copy, their activations at the hooks the jobs `todo` patch, at every prompt position
    and, where a patch writes them, every answer position `nodes` ({hook: [n, d]}, position
    index)."""
    read = sorted({job.patch.hook for job in todo}, key=hook_order)
    sources = {pairs[job.pair][job.block].id for job in todo}
    extra = nodes if any(job.nodes for job in todo) else []
    keys = list(prompts)
    baseline: dict[str, ScoreResult] = {}
    acts: dict[str, tuple[dict[str, torch.Tensor], dict[Position, int]]] = {}
    for start in range(0, len(keys), size):
        chunk = keys[start : start + size]
        positions = [
            [*range(len(prompts[k].input_ids)), *extra] if k in sources else [] for k in chunk
        ]
        locs = [(at, p) for at, ps in enumerate(positions) for p in ps]
        batch = [prompts[k].input_ids for k in chunk]
        reads = {hook: locs for hook in read} if locs else None
        results, values = score_with(scorer, batch, reads=reads, hooks=hooks)
        at = 0
        for key, result, ps in zip(chunk, results, positions, strict=True):
            baseline[key] = result
            if ps:
                block = {hook: values[hook][at : at + len(ps)] for hook in read}
                acts[key] = (block, {p: j for j, p in enumerate(ps)})
            at += len(ps)
    return baseline, acts
