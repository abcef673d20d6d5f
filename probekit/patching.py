"""Activation patching of the intergroup empathy gap, measured with the exact scoring engine.

A pair is two prompts about the same event with the same perceiver g: clean = in-group (g, g),
corrupt = out-group (g, h). A patch (layer, site, span) copies the clean run's activation at the
TransformerLens hook `blocks.{layer}.{site}` into the corrupt run at the span's positions. It acts
during the engine's prompt pass only; the engine then expands the answer trie from the patched
KV cache, so the patch reaches every answer token. The effect is read on the exact expected
intensity: `recovery = (ev_patched - ev_corrupt) / (ev_clean - ev_corrupt)` (NaN when the
denominator is 0). A patch at layer l changes the keys and values of layers >= l only, so at
late layers the answer's later tokens read a mix of patched and corrupt cache, and recovery can
leave [0, 1] even when every position from the experiencer on is patched.

Spans: `experiencer` and `perceiver` as located by `probekit.spans`, and `from_experiencer`,
every token from the experiencer's first to the prompt's last (the answer position included).

Alignment. The clean and corrupt spans may differ in length ("a Buddhist" can be three tokens,
"a Jew" two). They are aligned right to left: the last k = min(len_clean, len_corrupt) positions
of each, last token to last token; the longer span's leading tokens are not patched. A name is
complete at its last token, and the text after the experiencer is the same in both prompts, so
for `from_experiencer` this pairs identical tokens counted from the end of the sequence.
The stored `clean_positions` / `corrupt_positions` are exactly the aligned positions patched.

No-op patches. The perceiver comes before the experiencer, so both prompts agree token for
token up to the experiencer. A patch lying entirely in that shared prefix, at the same positions,
writes values equal to the corrupt run's own (a causal model cannot see later tokens), so it is
not run: `ev_patched = ev_corrupt` and `ran = False`. `run_noops=True` runs them anyway.

Batching. Each row of a forward is the corrupt prompt of one (pair, patch); rows of one batch
carry different patches (any layer, site, span), so a sweep runs `batch_size` patches a forward.
Prompts are left-padded to the batch width W, so position p of a prompt of length n sits at
column W - n + p.

Backends. `transformer_lens`: hooks of `model.bridge`, which fire inside `model.hf`'s forward
(the bridge swaps its blocks in place). `nnsight`: a trace of `model.nnsight` whose traced
function is the engine's `score_batch`; its interventions ask for the first call of each module,
which is the prompt pass (the trie pass calls the modules again, untouched). `remote` is handed
to `trace` unchanged (`remote=True` ships the block and the pickled scoring call to NDIF, which
needs a hub model NDIF serves; untested offline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from probekit.errors import ProbekitError
from probekit.models import LoadedModel
from probekit.scoring.engine import Scorer, ScoreResult
from probekit.spans import LocatedPrompt, intergroup_spans, locate
from probekit.studies.intergroup import Category, Setting

SITES: tuple[str, ...] = ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "hook_resid_post")
SPANS: tuple[str, ...] = ("experiencer", "perceiver", "from_experiencer")
BACKENDS: tuple[str, ...] = ("transformer_lens", "nnsight")

Loc = tuple[int, int]  # (row in the batch, position in that row's unpadded prompt)
Edit = tuple[list[Loc], Callable[[torch.Tensor], torch.Tensor]]  # new values from the old ones


@dataclass(frozen=True)
class StudyPrompt:
    """One located intergroup prompt and who and what it is about."""

    prompt: LocatedPrompt
    perceiver: str
    experiencer: str
    event_id: str
    emotion: str

    @property
    def ids(self) -> list[int]:
        return self.prompt.input_ids


@dataclass(frozen=True)
class Pair:
    """Clean = in-group prompt (g, g), corrupt = out-group prompt (g, h), same event."""

    clean: StudyPrompt
    corrupt: StudyPrompt


@dataclass(frozen=True)
class Patch:
    """Copy the clean activation at hook `blocks.{layer}.{site}` over `span`."""

    layer: int
    site: str
    span: str

    @property
    def hook(self) -> str:
        return f"blocks.{self.layer}.{self.site}"


def study_prompts(
    model: LoadedModel, setting: Setting, category: Category, events: pd.DataFrame
) -> list[StudyPrompt]:
    """Every named perceiver x named experiencer prompt of each event (event, perceiver,
    experiencer order), rendered with the model's chat template and located."""
    prompts = []
    for event in events.itertuples(index=False):
        text = getattr(event, setting.text_column)
        for perceiver in category.named:
            for experiencer in category.named:
                messages, spans = intergroup_spans(
                    setting, perceiver, experiencer, event.emotion, text
                )
                located = locate(model.tokenizer, messages, spans, render=model.render)
                prompts.append(
                    StudyPrompt(located, perceiver, experiencer, event.event_id, event.emotion)
                )
    return prompts


def in_out_pairs(prompts: Iterable[StudyPrompt], category: Category) -> list[Pair]:
    """Each in-group prompt (g, g) paired with every out-group prompt (g, h) of its event."""
    label = dict(zip(category.identities, category.labels, strict=True))
    prompts = list(prompts)
    clean = {
        (p.event_id, p.perceiver): p for p in prompts if label[p.perceiver] == label[p.experiencer]
    }
    return [
        Pair(clean[(p.event_id, p.perceiver)], p)
        for p in prompts
        if label[p.perceiver] != label[p.experiencer] and (p.event_id, p.perceiver) in clean
    ]


def grid(
    layers: Iterable[int], sites: Iterable[str] = SITES, spans: Iterable[str] = SPANS
) -> list[Patch]:
    """All (layer, site, span) patches, layer-major."""
    return [Patch(layer, site, span) for layer in layers for site in sites for span in spans]


def span_positions(prompt: LocatedPrompt, span: str) -> list[int]:
    """Token positions of `span` in the unpadded prompt (`from_experiencer` runs to the end)."""
    if span not in SPANS:
        raise ProbekitError(f"unknown span {span!r}; choose from {', '.join(SPANS)}")
    name = "experiencer" if span == "from_experiencer" else span
    positions = prompt.positions.get(name)
    if not positions:
        raise ProbekitError(
            f"span {name!r} is absent from the prompt (it has {', '.join(prompt.positions)})"
        )
    if span == "from_experiencer":
        return list(range(positions[0], len(prompt.input_ids)))
    return list(positions)


def align(clean: Sequence[int], corrupt: Sequence[int]) -> tuple[list[int], list[int]]:
    """Right-to-left alignment: the last min(len) positions of each, last to last."""
    k = min(len(clean), len(corrupt))
    return list(clean[len(clean) - k :]), list(corrupt[len(corrupt) - k :])


def check(model: LoadedModel, pairs: Sequence[Pair], patches: Sequence[Patch]) -> None:
    """Raise a ProbekitError for an empty request, a layer out of range, an unknown site or
    span, a span missing from a prompt, or a pair whose two prompts are about different events."""
    if not pairs or not patches:
        raise ProbekitError("nothing to patch: give at least one pair and one patch")
    for patch in patches:
        if not isinstance(patch.layer, int) or not 0 <= patch.layer < model.n_layers:
            raise ProbekitError(
                f"layer {patch.layer!r} is out of range: the model has {model.n_layers} layers "
                f"(0 to {model.n_layers - 1})"
            )
        if patch.site not in SITES:
            raise ProbekitError(f"unknown site {patch.site!r}; choose from {', '.join(SITES)}")
    for i, pair in enumerate(pairs):
        a, b = pair.clean, pair.corrupt
        if (a.event_id, a.emotion) != (b.event_id, b.emotion):
            raise ProbekitError(
                f"pair {i}: the clean prompt is about event {a.event_id!r} ({a.emotion}) and the "
                f"corrupt one about {b.event_id!r} ({b.emotion}); a pair must share its event"
            )
        texts = {p.prompt.span_text("event") for p in (a, b) if "event" in p.prompt.positions}
        if len(texts) > 1:
            raise ProbekitError(
                f"pair {i}: both prompts say event {a.event_id!r} but quote different texts; "
                "a pair must share its event"
            )
        for span in dict.fromkeys(patch.span for patch in patches):
            for prompt in (pair.clean, pair.corrupt):
                span_positions(prompt.prompt, span)


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
    values at `locs` by `fn(old values)`. Hooks are TransformerLens names `blocks.{l}.{site}`.
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
    _, layer, site = hook.split(".")
    return int(layer), SITES.index(site)


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
    bridge = scorer.model.bridge
    results = scorer.score_batch(
        batch, reuse_prefix=False, prompt_context=lambda: bridge.hooks(fwd_hooks=hooks)
    )
    return results, out


def _run_nnsight(scorer: Scorer, batch: Any, ops: list, remote: bool) -> tuple[list, dict]:
    import nnsight

    from probekit.capture import block_module_names, site_value, walk_path

    model = scorer.model
    _ = model.bridge  # swap in the bridge blocks first: nnsight must wrap the modules that run
    lm = model.nnsight
    blocks_path, attn, mlp = block_module_names(model.hf)
    blocks = walk_path(lm, blocks_path)
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), model.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, prompt in enumerate(batch):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt))
        mask[row, width - len(prompt) :] = 1
    scored: dict[str, list[ScoreResult]] = {}

    def score(*args: Any, **kwargs: Any) -> None:
        scored["results"] = scorer.score_batch(batch, reuse_prefix=False)

    out: dict[str, torch.Tensor] = {}
    with lm.trace({"input_ids": ids, "attention_mask": mask}, fn=score, remote=remote):
        for hook, read, edit in ops:
            _, layer, site = hook.split(".")
            value = site_value(blocks[int(layer)], site.removeprefix("hook_"), attn, mlp)
            _apply(value, read, edit, out, hook)
        out = nnsight.save(out)
    return scored["results"], out


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
    backend: str = "transformer_lens",
    batch_size: int | None = None,
    run_noops: bool = False,
    remote: bool = False,
) -> pd.DataFrame:
    """Run every patch on every pair; one row per (pair, patch), pair-major.

    Columns: event_id, emotion, perceiver, clean_experiencer, corrupt_experiencer, clean_prompt,
    corrupt_prompt (rendered text), layer, site (hook name), span, clean_positions,
    corrupt_positions (aligned, unpadded), ev_clean, ev_corrupt, ev_patched, recovery, ran.
    """
    check(scorer.model, pairs, patches)
    size = batch_size or scorer.batch_size
    jobs = [_job(i, pair, patch) for i, pair in enumerate(pairs) for patch in patches]
    todo = [k for k, job in enumerate(jobs) if run_noops or not job.noop]
    runs = [jobs[k] for k in todo]
    hooks = sorted({job.patch.hook for job in runs}, key=_hook_order)
    ev, clean_acts = _baselines(scorer, pairs, runs, hooks, size, backend, remote)
    patched: dict[int, float] = {}  # job index -> ev_patched
    for start in range(0, len(todo), size):
        chunk = todo[start : start + size]
        edits: dict[str, Edit] = {}
        for hook in {jobs[k].patch.hook for k in chunk}:
            locs, values = [], []
            for row, k in enumerate(chunk):
                job = jobs[k]
                if job.patch.hook == hook:
                    locs += [(row, p) for p in job.corrupt_positions]
                    acts, where = clean_acts[_key(pairs[job.pair].clean)]
                    values.append(acts[hook][[where[p] for p in job.clean_positions]])
            edits[hook] = (locs, _constant(torch.cat(values)))
        batch = [pairs[jobs[k].pair].corrupt.ids for k in chunk]
        results, _ = score_with(scorer, batch, edits=edits, backend=backend, remote=remote)
        patched.update((k, _ev(result)) for k, result in zip(chunk, results, strict=True))
    rows = []
    for k, job in enumerate(jobs):
        pair = pairs[job.pair]
        ev_clean, ev_corrupt = ev[_key(pair.clean)], ev[_key(pair.corrupt)]
        ev_patched = patched.get(k, ev_corrupt)
        gap = ev_clean - ev_corrupt
        rows.append(
            {
                "event_id": pair.clean.event_id,
                "emotion": pair.clean.emotion,
                "perceiver": pair.corrupt.perceiver,
                "clean_experiencer": pair.clean.experiencer,
                "corrupt_experiencer": pair.corrupt.experiencer,
                "clean_prompt": pair.clean.prompt.text,
                "corrupt_prompt": pair.corrupt.prompt.text,
                "layer": job.patch.layer,
                "site": job.patch.hook,
                "span": job.patch.span,
                "clean_positions": job.clean_positions,
                "corrupt_positions": job.corrupt_positions,
                "ev_clean": ev_clean,
                "ev_corrupt": ev_corrupt,
                "ev_patched": ev_patched,
                "recovery": (ev_patched - ev_corrupt) / gap if gap != 0 else np.nan,
                "ran": k in patched,
            }
        )
    return pd.DataFrame(rows)


def mean_recovery(df: pd.DataFrame, min_gap: float = 0.0) -> pd.DataFrame:
    """Mean recovery per (layer, site, span) over pairs with |ev_clean - ev_corrupt| >= min_gap,
    largest first; `pairs` counts the pairs averaged."""
    kept = df[(df["ev_clean"] - df["ev_corrupt"]).abs() >= min_gap].dropna(subset=["recovery"])
    if kept.empty:
        raise ProbekitError(
            f"no pair has an intensity gap of at least {min_gap}; lower the minimum gap"
        )
    summary = (
        kept.groupby(["layer", "site", "span"], sort=False)["recovery"]
        .agg(recovery="mean", pairs="size")
        .reset_index()
    )
    return summary.sort_values("recovery", ascending=False, kind="stable").reset_index(drop=True)


def _job(i: int, pair: Pair, patch: Patch) -> _Job:
    clean, corrupt = align(
        span_positions(pair.clean.prompt, patch.span),
        span_positions(pair.corrupt.prompt, patch.span),
    )
    last = max(corrupt) + 1
    noop = clean == corrupt and pair.clean.ids[:last] == pair.corrupt.ids[:last]
    return _Job(i, patch, clean, corrupt, noop)


def _baselines(
    scorer: Scorer,
    pairs: Sequence[Pair],
    todo: list[_Job],
    hooks: list[str],
    size: int,
    backend: str,
    remote: bool,
) -> tuple[dict, dict]:
    """ev of every clean and corrupt prompt; for clean prompts with patches to run, their
    activations at `hooks` on the positions those patches copy ({hook: [n, d]}, position index)."""
    needed: dict[tuple[int, ...], set[int]] = {}
    for job in todo:
        needed.setdefault(_key(pairs[job.pair].clean), set()).update(job.clean_positions)
    prompts = {_key(p): p.ids for pair in pairs for p in (pair.clean, pair.corrupt)}
    keys = list(prompts)
    ev: dict[tuple[int, ...], float] = {}
    acts: dict[tuple[int, ...], tuple[dict[str, torch.Tensor], dict[int, int]]] = {}
    for start in range(0, len(keys), size):
        chunk = keys[start : start + size]
        positions = {row: sorted(needed.get(key, ())) for row, key in enumerate(chunk)}
        locs = [(row, p) for row, ps in positions.items() for p in ps]
        reads = {hook: locs for hook in hooks} if locs else None
        results, values = score_with(
            scorer, [prompts[k] for k in chunk], reads=reads, backend=backend, remote=remote
        )
        at = 0
        for row, (key, result) in enumerate(zip(chunk, results, strict=True)):
            ev[key] = _ev(result)
            n = len(positions[row])
            if n:
                block = {hook: values[hook][at : at + n] for hook in hooks}
                acts[key] = (block, {p: i for i, p in enumerate(positions[row])})
            at += n
    return ev, acts


def _key(p: StudyPrompt) -> tuple[int, ...]:
    return tuple(p.ids)


def _constant(values: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda old: values


def _ev(result: ScoreResult) -> float:
    return float("nan") if result.expected is None else float(result.expected)
