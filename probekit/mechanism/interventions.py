"""Reading and writing activations at sites during a forward pass, with either hook library.

Locations are (row in the batch, position in that row's unpadded prompt); batches are
left-padded to their widest prompt, so position p of a prompt of length n sits at column
W - n + p. Hooks are full TransformerLens names (`blocks.{layer}.{site}`, see
`probekit.mechanism.sites`); values at `attn.hook_z` are [locations, heads, d_head], elsewhere
[locations, d_model]. At each hook the values asked for are read first, then edited.

`score_with` does this in the scoring engine's prompt pass: the engine then expands the answer
trie from the edited KV cache, so an edit reaches every answer token. Its `answer_edits` also
rewrite the values at the answer tokens themselves (every position of the trie passes), with the
`transformer_lens` hooks. `read_forward` does it in a
plain forward that stops after the last layer read (for capture).

`transformer_lens`: hooks of the model's TransformerBridge, which fire inside `model.hf`'s
forward (the bridge swaps its blocks in place). `nnsight`: a trace of `model.nnsight`; in
`score_with` the traced function is the engine's `score_batch` and the interventions ask for the
first call of each module, which is the prompt pass (the trie pass calls the modules again,
untouched). `remote` is handed to nnsight's `trace` unchanged (`remote=True` ships the block and
the pickled scoring call to NDIF, which needs a hub model NDIF serves; untested offline).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from probekit.core.errors import ProbekitError
from probekit.core.padding import left_pad, positions
from probekit.mechanism.sites import (
    enable_bridge,
    hf_module,
    hook_order,
    layout,
    library,
    n_heads,
    parse_hook,
    walk,
)

Loc = tuple[int, int]
"""(row in the batch, position in that row's unpadded prompt)"""
Edit = tuple[list[Loc], Callable[[torch.Tensor], torch.Tensor]]
"""Locations and the function giving their new values from the old ones."""
Index = tuple[torch.Tensor, torch.Tensor]
Op = tuple[str, Index | None, tuple[Index, Callable] | None]  # (hook, read, edit)


def score_with(
    scorer: Any,
    batch: Sequence[Sequence[int]],
    reads: dict[str, list[Loc]] | None = None,
    edits: dict[str, Edit] | None = None,
    hooks: str = "transformer_lens",
    remote: bool = False,
    answer_edits: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None,
) -> tuple[list[Any], dict[str, torch.Tensor]]:
    """Score one batch with the engine while reading and editing activations in its prompt pass.

    `reads[hook]` lists the locations whose values come back as one [locs, ...] CPU tensor per
    hook (in the model's dtype); `edits[hook] = (locs, fn)` replaces the values at `locs` by
    `fn(old values)`; `answer_edits[hook] = fn` replaces every value of the trie passes (all
    answer-token positions, [rows, nodes, ...]) by `fn(old values)`. Returns the engine's
    results and the values read."""
    chosen = library(hooks)
    ops = _ops(batch, reads, edits, scorer.model.device)
    answer = [(hook, _answer_hook(fn)) for hook, fn in (answer_edits or {}).items()]
    for hook, _ in answer:
        parse_hook(hook)
    if answer and chosen == "nnsight":
        raise ProbekitError("answer-token edits need hooks='transformer_lens'")
    if chosen == "nnsight":
        return _score_nnsight(scorer, batch, ops, remote)
    if remote:
        raise ProbekitError("remote execution goes through nnsight; use hooks='nnsight'")
    out: dict[str, torch.Tensor] = {}
    fwd = [(hook, _lens_hook(hook, read, edit, out)) for hook, read, edit in ops]
    bridge = enable_bridge(scorer.model)
    results = scorer.score_batch(
        batch,
        reuse_prefix=False,
        prompt_context=lambda: bridge.hooks(fwd_hooks=fwd),
        answer_context=(lambda: bridge.hooks(fwd_hooks=answer)) if answer else None,
    )
    return results, out


def read_forward(
    model: Any,
    batch: Sequence[Sequence[int]],
    reads: dict[str, list[Loc]],
    hooks: str = "transformer_lens",
) -> dict[str, torch.Tensor]:
    """The values at `reads` (as in `score_with`) from a plain forward of the left-padded batch
    that stops after the last layer read; with nnsight the Hugging Face modules are traced as
    they are (the bridge is not built)."""
    chosen = library(hooks)
    ids, mask = left_pad(list(batch), model.tokenizer.pad_token_id)
    inputs = {
        "input_ids": ids.to(model.device),
        "attention_mask": mask.to(model.device),
        "position_ids": positions(mask).to(model.device),
    }
    ops = _ops(batch, reads, None, model.device)
    last = max(parse_hook(hook)[0] for hook, _, _ in ops)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        if chosen == "nnsight":
            out = _trace(model, model.nnsight, inputs, ops, stop=True)
        else:
            enable_bridge(model).run_with_hooks(
                inputs["input_ids"],
                fwd_hooks=[(hook, _lens_hook(hook, read, None, out)) for hook, read, _ in ops],
                stop_at_layer=last + 1 if last + 1 < model.n_layers else None,
                return_type=None,
                attention_mask=inputs["attention_mask"],
                position_ids=inputs["position_ids"],
            )
    missing = [hook for hook in reads if hook not in out]
    if missing:
        raise ProbekitError(f"the {chosen} hooks did not reach {', '.join(missing)}")
    return out


def copy_values(
    values: torch.Tensor, heads: Sequence[int | None]
) -> Callable[[torch.Tensor], torch.Tensor]:
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


def _ops(
    batch: Sequence[Sequence[int]],
    reads: dict[str, list[Loc]] | None,
    edits: dict[str, Edit] | None,
    device: Any,
) -> list[Op]:
    """Each hook's read and edit as padded (rows, columns) indices, in the order the model runs."""
    width = max(len(p) for p in batch)
    offsets = [width - len(p) for p in batch]

    def index(locs: list[Loc]) -> Index:
        rows = torch.tensor([r for r, _ in locs], dtype=torch.long, device=device)
        cols = torch.tensor([offsets[r] + p for r, p in locs], dtype=torch.long, device=device)
        return rows, cols

    ops = []
    for hook in sorted(set(reads or {}) | set(edits or {}), key=hook_order):
        read = index(reads[hook]) if reads and hook in reads else None
        edit = (index(edits[hook][0]), edits[hook][1]) if edits and hook in edits else None
        ops.append((hook, read, edit))
    return ops


def _apply(tensor: torch.Tensor, read: Any, edit: Any, out: dict, hook: str) -> None:
    """Read, then edit in place, the values of `tensor` at the given (rows, cols)."""
    if read is not None:
        out[hook] = tensor[read].detach().cpu()
    if edit is not None:
        (rows, cols), fn = edit
        tensor[rows, cols] = fn(tensor[rows, cols]).to(tensor.device, tensor.dtype)


def _lens_hook(name: str, read: Any, edit: Any, out: dict) -> Callable:
    def fn(value: Any, hook: Any) -> Any:
        tensor = value[0] if isinstance(value, tuple) else value
        if edit is not None:
            tensor = tensor.clone()
        _apply(tensor, read, edit, out, name)
        if edit is None:
            return None
        return (tensor, *value[1:]) if isinstance(value, tuple) else tensor

    return fn


def _answer_hook(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """A hook replacing its whole value (every position of a trie pass) by `fn(value)`."""

    def hook_fn(value: Any, hook: Any) -> Any:
        tensor = value[0] if isinstance(value, tuple) else value
        new = fn(tensor).to(tensor.device, tensor.dtype)
        return (new, *value[1:]) if isinstance(value, tuple) else new

    return hook_fn


def _score_nnsight(scorer: Any, batch: Any, ops: list[Op], remote: bool) -> tuple[list, dict]:
    model = scorer.model
    enable_bridge(model)  # swap in the bridge blocks first: nnsight must wrap the modules that run
    ids, mask = left_pad(list(batch), model.tokenizer.pad_token_id)
    scored: dict[str, list] = {}

    def score(*args: Any, **kwargs: Any) -> None:
        scored["results"] = scorer.score_batch(batch, reuse_prefix=False)

    out = _trace(
        model,
        model.nnsight,
        {"input_ids": ids, "attention_mask": mask},
        ops,
        fn=score,
        remote=remote,
    )
    return scored["results"], out


def _trace(
    model: Any, lm: Any, inputs: dict, ops: list[Op], stop: bool = False, **trace: Any
) -> dict[str, torch.Tensor]:
    """Apply `ops` to the site values of an nnsight trace; the values read (`stop`: end the
    forward after the last op)."""
    import nnsight

    where = layout(hf_module(model))
    blocks = walk(lm, where.blocks)
    heads = n_heads(model)
    with lm.trace(inputs, **trace) as tracer:
        out: dict[str, torch.Tensor] = {}
        for hook, read, edit in ops:
            layer, found = parse_hook(hook)
            value = found.nnsight(blocks[layer], where, heads)
            _apply(value, read, edit, out, hook)
        out = nnsight.save(out)
        if stop:
            tracer.stop()
    return out
