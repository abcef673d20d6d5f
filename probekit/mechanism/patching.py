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
last token) also writes every answer position (`through_answer=True`, the default): the engine
reads a multi-token answer at positions after the prompt (its trie of answer tokens), and each
gets the clean run's activation at the same continuation. Patching `from_<span>` at
`hook_resid_pre` then gives the clean run exactly, at every layer (when the clean and corrupt
spans have the same number of tokens). With `through_answer=False` the answer positions are left
alone and read the patched prompt through the KV cache of layers >= l only, so at late layers
the answer's later tokens mix patched and corrupt values and recovery can leave [0, 1].

No-op patches (in the prefix both prompts share) are not run unless `run_noops=True`.

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
from probekit.engines.base import ScoreResult
from probekit.engines.hf.scorer import HFScorer
from probekit.mechanism.components import (
    COMPONENT,
    Job,
    Patch,
    check,
    key_columns,
    plan,
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
from probekit.mechanism.readouts import Readout
from probekit.mechanism.sites import hook_order
from probekit.stats import bootstrap_units


def sweep(
    scorer: HFScorer,
    pairs: Sequence[Pair],
    patches: Sequence[Patch],
    readout: Readout,
    hooks: str = "transformer_lens",
    batch_size: int | None = None,
    run_noops: bool = False,
    remote: bool = False,
    through_answer: bool = True,
    progress: Any = None,
) -> pd.DataFrame:
    """Run every patch on every pair; one row per (pair, patch), pair-major.

    `through_answer`: a span that runs to the end also patches the answer positions (see the
    module's docstring). `progress`: a tqdm-like bar (`update(n)`), advanced by the patched
    runs done.

    Columns: the items' key columns (a column on which clean and corrupt differ in some pair
    comes twice, as `clean_<col>` and `corrupt_<col>`), clean_prompt_id, corrupt_prompt_id,
    clean_prompt, corrupt_prompt (rendered text), layer, site (hook name), head (at
    `attn.hook_z`; else null), span, clean_positions, corrupt_positions (aligned, unpadded),
    `<m>_clean`, `<m>_corrupt`, `<m>_patched` (m = `readout.column`, e.g. ev), gap (clean -
    corrupt), recovery, ran, metric (the readout's spec), method (`exact` here) and estimate (the
    attribution estimate of m_patched - m_corrupt; NaN here, see `probekit.mechanism.attribution`).
    """
    check(scorer.model, pairs, patches)
    size = batch_size or scorer.batch_size
    jobs = [
        plan(i, pair, patch, through_answer) for i, pair in enumerate(pairs) for patch in patches
    ]
    todo = [k for k, job in enumerate(jobs) if run_noops or not job.noop]
    runs = [jobs[k] for k in todo]
    read = sorted({job.patch.hook for job in runs}, key=hook_order)
    nodes = answer_nodes(scorer)
    baseline, clean_acts = _baselines(scorer, pairs, runs, read, size, hooks, remote, nodes)
    patched: dict[int, float] = {}  # job index -> readout of the patched run
    for start in range(0, len(todo), size):
        chunk = todo[start : start + size]
        edits: dict[str, Edit] = {}
        for hook in {jobs[k].patch.hook for k in chunk}:
            locs: list[Loc] = []
            values, heads = [], []
            for at, k in enumerate(chunk):
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
        corrupt = [pairs[jobs[k].pair][1] for k in chunk]
        results, _ = score_with(
            scorer, [c.input_ids for c in corrupt], edits=edits, hooks=hooks, remote=remote
        )
        for k, prompt, result in zip(chunk, corrupt, results, strict=True):
            patched[k] = readout(result, prompt.item, baseline[pairs[jobs[k].pair][0].id])
        if progress is not None:
            progress.update(len(chunk))
    keys = key_columns(pairs)
    rows = []
    for k, job in enumerate(jobs):
        clean, corrupt = pairs[job.pair]
        m_clean = readout(baseline[clean.id], clean.item, baseline[clean.id])
        m_corrupt = readout(baseline[corrupt.id], corrupt.item, baseline[clean.id])
        m_patched = patched.get(k, m_corrupt)
        rows.append(row(pairs[job.pair], keys, job, readout, m_clean, m_corrupt, m_patched))
        rows[-1]["ran"] = k in patched
    return table(rows)


def summarise(df: pd.DataFrame, n: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per component (layer, site, head, span): the mean over pairs of the exact effect
    (m_patched - m_corrupt, where measured) and of the attribution estimate, each with its
    bootstrap interval over pairs (`<x>_low`, `<x>_high`), the mean recovery and the mean
    estimate as a share of the gap (`estimated_recovery`); largest |effect| (else |estimate|)
    first."""
    patched = next(c for c in df.columns if c.endswith("_patched"))
    corrupt = patched.removesuffix("_patched") + "_corrupt"
    frame = df.assign(
        effect=(df[patched] - df[corrupt]).where(df["ran"] | (df["method"] == "exact")),
        estimated_recovery=df["estimate"] / df["gap"].where(df["gap"] != 0),
    )
    rows = []
    for key, group in frame.groupby(COMPONENT, sort=False, dropna=False):
        entry: dict[str, Any] = dict(zip(COMPONENT, key, strict=True))
        for column in ("effect", "estimate"):
            values = group[column].dropna().to_numpy()
            if len(values) == 0:
                entry |= {column: np.nan, f"{column}_low": np.nan, f"{column}_high": np.nan}
                continue
            ci = bootstrap_units(len(values), lambda d, v=values: v[d].mean(), n, seed, level)
            entry |= {column: ci.estimate, f"{column}_low": ci.low, f"{column}_high": ci.high}
        entry["recovery"] = group["recovery"].mean()
        entry["estimated_recovery"] = group["estimated_recovery"].mean()
        entry["pairs"] = len(group)
        rows.append(entry)
    out = pd.DataFrame(rows)
    out["head"] = out["head"].astype("Int64")
    size = out["effect"].abs().fillna(out["estimate"].abs())
    return out.loc[size.sort_values(ascending=False, kind="stable").index].reset_index(drop=True)


def _baselines(
    scorer: HFScorer,
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
