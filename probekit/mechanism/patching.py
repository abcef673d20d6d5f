"""Activation patching of a study's counterfactual pairs, measured with the exact scoring engine.

A pair is two prompts on the same unit (event, question) that differ in one identity: the study
builds them (intergroup: clean = in-group (g, g), corrupt = out-group (g, h)). A patch
(layer, site, span) copies the clean run's activation at the TransformerLens hook
`blocks.{layer}.{site}` into the corrupt run at the span's positions. It acts during the engine's
prompt pass only; the engine then expands the answer trie from the patched KV cache, so the patch
reaches every answer token. The effect is read on a behavioural metric
(`probekit.scoring.metrics`: expected value, P(answer), P(correct), a difference):
`recovery = (m_patched - m_corrupt) / (m_clean - m_corrupt)` (NaN when the denominator is 0).
A patch at layer l changes the keys and values of layers >= l only, so at late layers the
answer's later tokens read a mix of patched and corrupt cache, and recovery can leave [0, 1]
even when every position from the span on is patched.

Spans: any span the items declare (intergroup: `experiencer`, `perceiver`, ...), and
`from_<span>`, every token from the span's first to the prompt's last (the answer position
included).

Alignment. The clean and corrupt spans may differ in length ("a Buddhist" can be three tokens,
"a Jew" two). They are aligned right to left: the last k = min(len_clean, len_corrupt) positions
of each, last token to last token; the longer span's leading tokens are not patched. A name is
complete at its last token, and the text after it is the same in both prompts, so for
`from_<span>` this pairs identical tokens counted from the end of the sequence.
The stored `clean_positions` / `corrupt_positions` are exactly the aligned positions patched.

No-op patches. A patch lying entirely in the prefix both prompts share, at the same positions,
writes values equal to the corrupt run's own (a causal model cannot see later tokens), so it is
not run: `m_patched = m_corrupt` and `ran = False`. `run_noops=True` runs them anyway.

Batching. Each row of a forward is the corrupt prompt of one (pair, patch); rows of one batch
carry different patches (any layer, site, span), so a sweep runs `batch_size` patches a forward.
Prompts are left-padded to the batch width W, so position p of a prompt of length n sits at
column W - n + p.

Heads. The site `attn.hook_z` is the attention's per-head output before the output projection
([positions, heads, d_head], TransformerLens naming); a patch there with `head = h` copies head h
alone, with `head = None` every head (which is the same as patching `hook_attn_out`).

Backends. `transformer_lens`: hooks of the model's TransformerBridge (`model.enable_bridge()`),
which fire inside `model.hf`'s forward (the bridge swaps its blocks in place). `nnsight`: a trace
of `model.nnsight` whose traced function is the engine's `score_batch`; its interventions ask for
the first call of each module, which is the prompt pass (the trie pass calls the modules again,
untouched); it reads `attn.hook_z` as the input of the attention's output projection, viewed
per head. `remote` is handed to `trace` unchanged (`remote=True` ships the block and the pickled
scoring call to NDIF, which needs a hub model NDIF serves; untested offline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from probekit.batching import left_pad
from probekit.engines.hf.model import LoadedModel
from probekit.engines.hf.scorer import Scorer, ScoreResult
from probekit.errors import ProbekitError
from probekit.items import EncodedItem, Pair
from probekit.scoring.metrics import Metric
from probekit.stats import bootstrap_units

SITES: tuple[str, ...] = ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "hook_resid_post")
HEAD_SITE = "attn.hook_z"  # per-head attention output before the output projection
RUN_ORDER: tuple[str, ...] = ("hook_resid_pre", HEAD_SITE, *SITES[1:])  # as a block runs them
BACKENDS: tuple[str, ...] = ("transformer_lens", "nnsight")
COMPONENT = ["layer", "site", "head", "span"]  # the columns naming one patched component
FROM = "from_"  # `from_<span>`: the span's first token to the prompt's end
AT = "@"  # `<span>@<i>`: the i-th of the span's aligned positions (negative: from its end)

Loc = tuple[int, int]  # (row in the batch, position in that row's unpadded prompt)
Edit = tuple[list[Loc], Callable[[torch.Tensor], torch.Tensor]]  # new values from the old ones


@dataclass(frozen=True)
class Patch:
    """Copy the clean activation at hook `blocks.{layer}.{site}` over `span` (at `attn.hook_z`,
    of one `head`, or of every head when it is None)."""

    layer: int
    site: str
    span: str
    head: int | None = None

    @property
    def hook(self) -> str:
        return f"blocks.{self.layer}.{self.site}"

    @property
    def name(self) -> str:
        """`L3 hook_attn_out experiencer`, `L3 H5 experiencer`: for reports."""
        where = self.site if self.head is None else f"H{self.head}"
        return f"L{self.layer} {where} {self.span}"


def grid(
    layers: Iterable[int],
    sites: Iterable[str],
    spans: Iterable[str],
    heads: Sequence[int] = (),
) -> list[Patch]:
    """All (layer, site, span) patches, layer-major; the site `attn.hook_z` gives one patch per
    head in `heads` (one patch of all heads when `heads` is empty)."""
    spans, sites = list(spans), list(sites)
    out = []
    for layer in layers:
        for site in sites:
            for head in (heads or [None]) if site == HEAD_SITE else [None]:
                out += [Patch(layer, site, span, head) for span in spans]
    return out


def n_heads(model: LoadedModel) -> int:
    """Attention heads per layer (query heads: `attn.hook_z` has one slot per query head)."""
    return int(model.hf.config.num_attention_heads)


def split_position(span: str) -> tuple[str, int | None]:
    """`experiencer@-1` -> ("experiencer", -1); a span without `@` -> (span, None)."""
    name, at, index = span.partition(AT)
    if not at:
        return span, None
    try:
        return name, int(index)
    except ValueError:
        raise ProbekitError(
            f"bad span {span!r}: after {AT} comes a position index (0, 1, ... or -1 for the last)"
        ) from None


def span_positions(prompt: EncodedItem, span: str) -> list[int]:
    """Token positions of `span` in the unpadded prompt (`from_<span>` runs to the end; a
    position index `@i` is applied after the clean and corrupt spans are aligned)."""
    name = split_position(span)[0].removeprefix(FROM)
    positions = prompt.positions.get(name)
    if not positions:
        raise ProbekitError(
            f"unknown span {span!r}: the prompts have the spans {', '.join(prompt.positions)} "
            f"(and {FROM}<span> for everything from a span to the end)"
        )
    if span.startswith(FROM):
        return list(range(positions[0], len(prompt.input_ids)))
    return list(positions)


def align(clean: Sequence[int], corrupt: Sequence[int]) -> tuple[list[int], list[int]]:
    """Right-to-left alignment: the last min(len) positions of each, last to last."""
    k = min(len(clean), len(corrupt))
    return list(clean[len(clean) - k :]), list(corrupt[len(corrupt) - k :])


def aligned_positions(pair: Pair, span: str) -> tuple[list[int], list[int]]:
    """The clean and corrupt positions a patch of `span` copies between, aligned (one of each
    with `@i`; an index beyond the aligned span is refused)."""
    clean, corrupt = pair
    clean_pos, corrupt_pos = align(span_positions(clean, span), span_positions(corrupt, span))
    index = split_position(span)[1]
    if index is None:
        return clean_pos, corrupt_pos
    if not -len(clean_pos) <= index < len(clean_pos):
        raise ProbekitError(
            f"{span}: the span has {len(clean_pos)} aligned positions in pair "
            f"{clean.id} / {corrupt.id}, so {AT}{index} is out of range"
        )
    return [clean_pos[index]], [corrupt_pos[index]]


def single_positions(spans: Iterable[str], pairs: Sequence[Pair]) -> list[str]:
    """Each span as its single positions `span@-k` ... `span@-1`, k the fewest aligned positions
    of any pair: the same index is the same place relative to the span's end in every pair."""
    out = []
    for span in spans:
        if split_position(span)[1] is not None:
            out.append(span)
            continue
        k = min(len(aligned_positions(pair, span)[0]) for pair in pairs)
        out += [f"{span}{AT}{i}" for i in range(-k, 0)]
    return out


def check(model: LoadedModel, pairs: Sequence[Pair], patches: Sequence[Patch]) -> None:
    """Raise a ProbekitError for an empty request, a layer out of range, an unknown site or
    span, or a pair whose two prompts are about different units."""
    if not pairs or not patches:
        raise ProbekitError("nothing to patch: give at least one pair and one patch")
    model.check_layers([patch.layer for patch in patches])
    heads = n_heads(model)
    for patch in patches:
        if patch.site not in RUN_ORDER:
            raise ProbekitError(
                f"unknown site {patch.site!r}; choose from {', '.join(SITES)}, {HEAD_SITE}"
            )
        if patch.head is not None and patch.site != HEAD_SITE:
            raise ProbekitError(f"a head index needs the site {HEAD_SITE}, not {patch.site}")
        if patch.head is not None and not 0 <= patch.head < heads:
            raise ProbekitError(
                f"head {patch.head} is out of range: the model has {heads} heads per layer "
                f"(0 to {heads - 1})"
            )
    for i, (clean, corrupt) in enumerate(pairs):
        if clean.item.unit != corrupt.item.unit:
            raise ProbekitError(
                f"pair {i}: the clean prompt is about {clean.item.unit!r} and the corrupt one "
                f"about {corrupt.item.unit!r}; a pair must share its unit"
            )
        for span in dict.fromkeys(patch.span for patch in patches):
            aligned_positions((clean, corrupt), span)


# ---------------------------------------------------------------------- scoring with hooks
def score_with(
    scorer: Scorer,
    batch: Sequence[Sequence[int]],
    reads: dict[str, list[Loc]] | None = None,
    edits: dict[str, Edit] | None = None,
    backend: str = "transformer_lens",
    remote: bool = False,
) -> tuple[list[ScoreResult], dict[str, torch.Tensor]]:
    """Score one batch with the engine while reading and editing activations in its prompt pass.

    `reads[hook]` lists (row, position) locations whose values come back as one [locs, d] CPU
    tensor per hook, read before any edit at that hook; `edits[hook] = (locs, fn)` replaces the
    values at `locs` by `fn(old values)`. Hooks are TransformerLens names `blocks.{l}.{site}`;
    values at `attn.hook_z` are [locs, heads, d_head].
    """
    if backend not in BACKENDS:
        raise ProbekitError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    width = max(len(p) for p in batch)
    offsets = [width - len(p) for p in batch]
    device = scorer.model.device

    def index(locs: list[Loc]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.tensor([r for r, _ in locs], dtype=torch.long, device=device)
        cols = torch.tensor([offsets[r] + p for r, p in locs], dtype=torch.long, device=device)
        return rows, cols

    ops = []  # (hook, read index or None, (index, fn) or None), in the order the model runs
    for hook in sorted(set(reads or {}) | set(edits or {}), key=_hook_order):
        read = index(reads[hook]) if reads and hook in reads else None
        edit = (index(edits[hook][0]), edits[hook][1]) if edits and hook in edits else None
        ops.append((hook, read, edit))
    if backend == "nnsight":
        return _run_nnsight(scorer, batch, ops, remote)
    if remote:
        raise ProbekitError("remote execution goes through nnsight; use backend='nnsight'")
    return _run_lens(scorer, batch, ops)


def _hook_order(hook: str) -> tuple[int, int]:
    _, layer, site = hook.split(".", 2)
    return int(layer), RUN_ORDER.index(site)


def _apply(tensor: torch.Tensor, read: Any, edit: Any, out: dict, hook: str) -> None:
    """Read, then edit in place, the values of `tensor` at the given (rows, cols)."""
    if read is not None:
        out[hook] = tensor[read].detach().cpu()
    if edit is not None:
        (rows, cols), fn = edit
        tensor[rows, cols] = fn(tensor[rows, cols]).to(tensor.device, tensor.dtype)


def _run_lens(scorer: Scorer, batch: Any, ops: list) -> tuple[list, dict]:
    out: dict[str, torch.Tensor] = {}

    def hook_fn(name: str, read: Any, edit: Any) -> Callable:
        def fn(value: Any, hook: Any) -> Any:
            tensor = value[0] if isinstance(value, tuple) else value
            if edit is not None:
                tensor = tensor.clone()
            _apply(tensor, read, edit, out, name)
            if edit is None:
                return None
            return (tensor, *value[1:]) if isinstance(value, tuple) else tensor

        return fn

    hooks = [(hook, hook_fn(hook, read, edit)) for hook, read, edit in ops]
    bridge = scorer.model.enable_bridge()
    results = scorer.score_batch(
        batch, reuse_prefix=False, prompt_context=lambda: bridge.hooks(fwd_hooks=hooks)
    )
    return results, out


def _run_nnsight(scorer: Scorer, batch: Any, ops: list, remote: bool) -> tuple[list, dict]:
    import nnsight

    from probekit.mechanism.capture import block_module_names, site_value, walk_path

    model = scorer.model
    model.enable_bridge()  # swap in the bridge blocks first: nnsight must wrap the modules that run
    lm = model.nnsight
    blocks_path, attn, mlp = block_module_names(model.hf)
    blocks = walk_path(lm, blocks_path)
    out_proj = _output_projection(getattr(walk_path(model.hf, blocks_path)[0], attn))
    heads = n_heads(model)
    ids, mask = left_pad(batch, model.tokenizer.pad_token_id)
    scored: dict[str, list[ScoreResult]] = {}

    def score(*args: Any, **kwargs: Any) -> None:
        scored["results"] = scorer.score_batch(batch, reuse_prefix=False)

    out: dict[str, torch.Tensor] = {}
    with lm.trace({"input_ids": ids, "attention_mask": mask}, fn=score, remote=remote):
        for hook, read, edit in ops:
            _, layer, site = hook.split(".", 2)
            block = blocks[int(layer)]
            if site == HEAD_SITE:  # the output projection's input, viewed per head
                flat = getattr(getattr(block, attn), out_proj).input
                value = flat.view(*flat.shape[:2], heads, -1)
            else:
                value = site_value(block, site.removeprefix("hook_"), attn, mlp)
            _apply(value, read, edit, out, hook)
        out = nnsight.save(out)
    return scored["results"], out


def _output_projection(attn: Any) -> str:
    """The name of an attention module's output projection (a child module)."""
    children = {name for name, _ in attn.named_children()}
    for name in ("o", "o_proj", "out_proj", "dense", "c_proj"):
        if name in children:
            return name
    raise ProbekitError(
        f"the nnsight backend does not know the output projection of {type(attn).__name__}; "
        "use backend='transformer_lens' for head patching"
    )


# ---------------------------------------------------------------------- sweeps
@dataclass(frozen=True)
class _Job:
    pair: int
    patch: Patch
    clean_positions: list[int]
    corrupt_positions: list[int]
    noop: bool


def sweep(
    scorer: Scorer,
    pairs: Sequence[Pair],
    patches: Sequence[Patch],
    metric: Metric,
    backend: str = "transformer_lens",
    batch_size: int | None = None,
    run_noops: bool = False,
    remote: bool = False,
) -> pd.DataFrame:
    """Run every patch on every pair; one row per (pair, patch), pair-major.

    Columns: the items' key columns (a column on which clean and corrupt differ in some pair
    comes twice, as `clean_<col>` and `corrupt_<col>`), clean_prompt_id, corrupt_prompt_id,
    clean_prompt, corrupt_prompt (rendered text), layer, site (hook name), head (at
    `attn.hook_z`; else null), span, clean_positions, corrupt_positions (aligned, unpadded),
    `<m>_clean`, `<m>_corrupt`, `<m>_patched` (m = `metric.column`, e.g. ev), gap (clean -
    corrupt), recovery, ran, metric (its spec), method (`exact` here) and estimate (the
    attribution estimate of m_patched - m_corrupt; NaN here, see `probekit.mechanism.attribution`).
    """
    check(scorer.model, pairs, patches)
    size = batch_size or scorer.batch_size
    jobs = [_job(i, pair, patch) for i, pair in enumerate(pairs) for patch in patches]
    todo = [k for k, job in enumerate(jobs) if run_noops or not job.noop]
    runs = [jobs[k] for k in todo]
    hooks = sorted({job.patch.hook for job in runs}, key=_hook_order)
    baseline, clean_acts = _baselines(scorer, pairs, runs, hooks, size, backend, remote)
    patched: dict[int, float] = {}  # job index -> metric of the patched run
    for start in range(0, len(todo), size):
        chunk = todo[start : start + size]
        edits: dict[str, Edit] = {}
        for hook in {jobs[k].patch.hook for k in chunk}:
            locs, values, heads = [], [], []
            for row, k in enumerate(chunk):
                job = jobs[k]
                if job.patch.hook == hook:
                    locs += [(row, p) for p in job.corrupt_positions]
                    acts, where = clean_acts[pairs[job.pair][0].id]
                    values.append(acts[hook][[where[p] for p in job.clean_positions]])
                    heads += [job.patch.head] * len(job.corrupt_positions)
            edits[hook] = (locs, _copy(torch.cat(values), heads))
        corrupt = [pairs[jobs[k].pair][1] for k in chunk]
        results, _ = score_with(
            scorer, [c.input_ids for c in corrupt], edits=edits, backend=backend, remote=remote
        )
        for k, prompt, result in zip(chunk, corrupt, results, strict=True):
            patched[k] = metric(result, prompt.item, baseline[pairs[jobs[k].pair][0].id])
    keys = _key_columns(pairs)
    rows = []
    for k, job in enumerate(jobs):
        clean, corrupt = pairs[job.pair]
        m_clean = metric(baseline[clean.id], clean.item, baseline[clean.id])
        m_corrupt = metric(baseline[corrupt.id], corrupt.item, baseline[clean.id])
        m_patched = patched.get(k, m_corrupt)
        rows.append(_row(pairs[job.pair], keys, job, metric, m_clean, m_corrupt, m_patched))
        rows[-1]["ran"] = k in patched
    return table(rows)


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The patching table from its rows (`head` as a nullable integer column)."""
    df = pd.DataFrame(rows)
    df["head"] = df["head"].astype("Int64")
    return df


def _row(
    pair: Pair,
    keys: dict[str, bool],
    job: _Job,
    metric: Metric,
    m_clean: float,
    m_corrupt: float,
    m_patched: float,
    method: str = "exact",
    estimate: float = np.nan,
) -> dict[str, Any]:
    """One row of the patching table (see `sweep`); `ran` is False until the caller sets it."""
    clean, corrupt = pair
    row: dict[str, Any] = {}
    for column, differs in keys.items():
        if differs:
            row[f"clean_{column}"] = clean.item.key[column]
            row[f"corrupt_{column}"] = corrupt.item.key[column]
        else:
            row[column] = clean.item.key[column]
    gap = m_clean - m_corrupt
    m = metric.column
    return {
        **row,
        "clean_prompt_id": clean.id,
        "corrupt_prompt_id": corrupt.id,
        "clean_prompt": clean.text,
        "corrupt_prompt": corrupt.text,
        "layer": job.patch.layer,
        "site": job.patch.hook,
        "head": job.patch.head,
        "span": job.patch.span,
        "clean_positions": job.clean_positions,
        "corrupt_positions": job.corrupt_positions,
        f"{m}_clean": m_clean,
        f"{m}_corrupt": m_corrupt,
        f"{m}_patched": m_patched,
        "gap": gap,
        "recovery": (m_patched - m_corrupt) / gap if gap != 0 else np.nan,
        "ran": False,
        "metric": metric.spec,
        "method": method,
        "estimate": estimate,
    }


def mean_recovery(df: pd.DataFrame, min_gap: float = 0.0) -> pd.DataFrame:
    """Mean recovery per (layer, site, head, span) over pairs whose |clean - corrupt| metric gap
    is at least `min_gap`, largest first; `pairs` counts the pairs averaged."""
    kept = df[df["gap"].abs() >= min_gap].dropna(subset=["recovery"])
    if kept.empty:
        raise ProbekitError(f"no pair has a gap of at least {min_gap}; lower the minimum gap")
    summary = (
        kept.groupby(COMPONENT, sort=False, dropna=False)["recovery"]
        .agg(recovery="mean", pairs="size")
        .reset_index()
    )
    return summary.sort_values("recovery", ascending=False, kind="stable").reset_index(drop=True)


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
        row: dict[str, Any] = dict(zip(COMPONENT, key, strict=True))
        for column in ("effect", "estimate"):
            values = group[column].dropna().to_numpy()
            if len(values) == 0:
                row |= {column: np.nan, f"{column}_low": np.nan, f"{column}_high": np.nan}
                continue
            ci = bootstrap_units(len(values), lambda d, v=values: v[d].mean(), n, seed, level)
            row |= {column: ci.estimate, f"{column}_low": ci.low, f"{column}_high": ci.high}
        row["recovery"] = group["recovery"].mean()
        row["estimated_recovery"] = group["estimated_recovery"].mean()
        row["pairs"] = len(group)
        rows.append(row)
    out = pd.DataFrame(rows)
    out["head"] = out["head"].astype("Int64")
    size = out["effect"].abs().fillna(out["estimate"].abs())
    return out.loc[size.sort_values(ascending=False, kind="stable").index].reset_index(drop=True)


def _key_columns(pairs: Sequence[Pair]) -> dict[str, bool]:
    """Each key column of the pairs' items, and whether clean and corrupt differ on it in any."""
    columns: dict[str, bool] = {}
    for clean, corrupt in pairs:
        for column in clean.item.key:
            differs = clean.item.key[column] != corrupt.item.key.get(column)
            columns[column] = columns.get(column, False) or differs
    return columns


def _job(i: int, pair: Pair, patch: Patch) -> _Job:
    clean, corrupt = pair
    clean_pos, corrupt_pos = aligned_positions(pair, patch.span)
    last = max(corrupt_pos) + 1
    noop = clean_pos == corrupt_pos and clean.input_ids[:last] == corrupt.input_ids[:last]
    return _Job(i, patch, clean_pos, corrupt_pos, noop)


def _baselines(
    scorer: Scorer,
    pairs: Sequence[Pair],
    todo: list[_Job],
    hooks: list[str],
    size: int,
    backend: str,
    remote: bool,
) -> tuple[dict, dict]:
    """The exact result of every clean and corrupt prompt (by prompt id); for clean prompts with
    patches to run, their activations at `hooks` on the positions those patches copy
    ({hook: [n, d]}, position index)."""
    needed: dict[str, set[int]] = {}
    for job in todo:
        needed.setdefault(pairs[job.pair][0].id, set()).update(job.clean_positions)
    prompts = {p.id: p for pair in pairs for p in pair}
    keys = list(prompts)
    baseline: dict[str, ScoreResult] = {}
    acts: dict[str, tuple[dict[str, torch.Tensor], dict[int, int]]] = {}
    for start in range(0, len(keys), size):
        chunk = keys[start : start + size]
        positions = {row: sorted(needed.get(key, ())) for row, key in enumerate(chunk)}
        locs = [(row, p) for row, ps in positions.items() for p in ps]
        reads = {hook: locs for hook in hooks} if locs else None
        results, values = score_with(
            scorer, [prompts[k].input_ids for k in chunk], reads=reads, backend=backend,
            remote=remote,
        )  # fmt: skip
        at = 0
        for row, (key, result) in enumerate(zip(chunk, results, strict=True)):
            baseline[key] = result
            n = len(positions[row])
            if n:
                block = {hook: values[hook][at : at + n] for hook in hooks}
                acts[key] = (block, {p: i for i, p in enumerate(positions[row])})
            at += n
    return baseline, acts


def _copy(values: torch.Tensor, heads: list[int | None]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The edit writing `values` (one row per location); where a location's head is set, only
    that head's slice ([locs, heads, d_head] values) is written, the others keep their value."""
    if all(head is None for head in heads):
        return lambda old: values
    own = torch.zeros(values.shape[:2], dtype=torch.bool)
    for i, head in enumerate(heads):
        own[i, slice(None) if head is None else head] = True

    def fn(old: torch.Tensor) -> torch.Tensor:
        keep = own.to(old.device)[..., None]
        return torch.where(keep, values.to(old.device, old.dtype), old)

    return fn
