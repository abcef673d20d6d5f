"""Reading and writing activations at sites during a forward pass, with either hook library.

A location is (row in the batch, position): a position is an int, a token of that row's
unpadded prompt, or an `AnswerNode`, an answer position of the engine's trie pass (the
continuation ending in that trie node, fed after the prompt). Batches are left-padded to their
widest prompt, so prompt position p of a prompt of length n sits at column W - n + p. Hooks are
full TransformerLens names (`blocks.{layer}.{site}`, see `probekit.mechanism.sites`); values at
`attn.hook_z` are [locations, heads, d_head], elsewhere [locations, d_model]. At each hook the
values asked for are read first, then edited.

`score_with` does this while the scoring engine scores the batch: prompt positions in its
prompt pass, answer positions in each forward of its trie pass (a node the pass prunes is not
fed: a read there is NaN, a write does nothing). An edit of prompt positions alone reaches the
answer only through the KV cache. This is the one intervention layer of the mechanism:
patching writes the clean run's values, steering adds a vector, directions project one out
(`score_edited`: one edit at each prompt's positions, batch by batch). `read_forward` reads
prompt positions in a plain forward that stops after the last layer read (for capture);
`bridge_hooks` gives the same hooks for any other forward on the bridge (attribution's
differentiable pass).

`transformer_lens`: hooks of the model's TransformerBridge, which fire inside `model.hf`'s
forward while the bridge's blocks are installed in place, for the call only
(`sites.hook_library`: the model is left as it was found). `nnsight`: a trace of
`model.nnsight`, on the model's own Hugging Face modules (the bridge removed meanwhile); in
`score_with` the traced function is the engine's `score_batch` and the interventions ask for the
first call of each module, which is the prompt pass (the trie pass calls the modules again,
untouched), so answer positions need `transformer_lens`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from probekit.core.errors import ProbekitError
from probekit.core.padding import left_pad, positions
from probekit.mechanism.sites import (
    hf_module,
    hook_library,
    hook_order,
    layout,
    library,
    n_heads,
    parse_hook,
    walk,
)


@dataclass(frozen=True)
class AnswerNode:
    """An answer position: the trie pass's token for the answer prefix ending in trie node
    `node` (`scorer.trie.nodes[node]`; node 0, the root, is the prompt's last token)."""

    node: int


NNSIGHT_ANSWERS = (
    "answer positions are read and written with hooks='transformer_lens' only (with "
    "nnsight, patch the prompt only: through_answer=False)"
)
"""The refusal of answer locations with nnsight, whose hooks reach the prompt pass only."""
PLAIN_ANSWERS = "a plain forward has no answer positions; use score_with"
Position = int | AnswerNode
Loc = tuple[int, Position]
"""(row in the batch, position: a prompt token's index, or an `AnswerNode`)"""
EditFn = Callable[[torch.Tensor], torch.Tensor]
"""New values from the old ones, location by location (e.g. `lambda old: old + v`);
`LocationValues` for values that differ by location."""
Edit = tuple[list[Loc], EditFn]
"""Locations and the function giving their new values from the old ones."""
Index = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (which locations, rows, columns)
Op = tuple[str, Index | None, tuple[Index, Callable] | None]  # (hook, read, edit)


class LocationValues:
    """An edit writing one value per location (`values[i]` at the edit's i-th location; where
    `heads[i]` is set, only that head's slice of [locs, heads, d_head] values, the other heads
    keeping theirs; a NaN value, e.g. read at an answer node the clean run pruned, keeps the
    old value). Called on the locations written now (`at`: their indices in the edit's list)."""

    def __init__(self, values: torch.Tensor, heads: Sequence[int | None] = ()) -> None:
        self.values = values
        self.own = None
        if any(head is not None for head in heads):
            self.own = torch.zeros(values.shape[:2], dtype=torch.bool)
            for i, head in enumerate(heads):
                self.own[i, slice(None) if head is None else head] = True

    def __call__(self, old: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        at = at.cpu()
        new = self.values[at].to(old.device, old.dtype)
        keep = torch.isnan(new)
        if self.own is not None:
            keep = keep | ~self.own[at].to(old.device)[..., None]
        return torch.where(keep, old, new) if bool(keep.any()) else new


def answer_nodes(scorer: Any) -> list[AnswerNode]:
    """Every answer position the scorer's trie can feed (all nodes below the root)."""
    return [AnswerNode(i) for i in range(1, len(scorer.trie.nodes))]


def score_with(
    scorer: Any,
    batch: Sequence[Sequence[int]],
    reads: dict[str, list[Loc]] | None = None,
    edits: dict[str, Edit] | None = None,
    hooks: str = "transformer_lens",
) -> tuple[list[Any], dict[str, torch.Tensor]]:
    """Score one batch with the engine while reading and editing activations at prompt and
    answer positions.

    `reads[hook]` lists the locations whose values come back as one [locs, ...] CPU tensor per
    hook (in the model's dtype; NaN at answer nodes the trie pass did not feed);
    `edits[hook] = (locs, fn)` replaces the values at `locs` by `fn(old values)`. Returns the
    engine's results and the values read."""
    chosen = library(hooks)
    refused = None if chosen == "transformer_lens" else NNSIGHT_ANSWERS
    split = _Split(batch, reads or {}, edits or {}, scorer.model.device, refused)
    sink: dict[str, list] = {}
    if chosen == "nnsight":
        ids, mask = left_pad(list(batch), scorer.model.tokenizer.pad_token_id)
        scored: list[list[Any]] = []

        def score(*args: Any, **kwargs: Any) -> None:
            scored.append(scorer.score_batch(batch, reuse_prefix=False))

        inputs = {"input_ids": ids, "attention_mask": mask}
        with hook_library(scorer.model, chosen):
            sink = _trace(scorer.model, inputs, split.ops(split.prompt), fn=score)
        return scored[0], split.gather(sink)
    with hook_library(scorer.model, chosen) as bridge:
        fwd = _hooks(split.ops(split.prompt), sink)

        def at_depth(rows: torch.Tensor, nodes: torch.Tensor, valid: torch.Tensor) -> Any:
            found = _hooks(split.answer_ops(rows, nodes, valid), sink)
            return bridge.hooks(fwd_hooks=found) if found else contextlib.nullcontext()

        results = scorer.score_batch(
            batch,
            reuse_prefix=False,
            prompt_context=lambda: bridge.hooks(fwd_hooks=fwd),
            answer_context=at_depth if split.answers else None,
        )
    return results, split.gather(sink)


def score_edited(
    scorer: Any,
    prompts: Sequence[Any],
    hook: str,
    where: Callable[[Any], Sequence[Position]],
    fn: EditFn,
    hooks: str = "transformer_lens",
    batch_size: int | None = None,
    progress: Any = None,
) -> list[Any]:
    """Every encoded prompt's result with `fn` applied at `hook` to its positions `where(prompt)`
    (answer nodes included), `batch_size` prompts a batch (`progress`, if given, updated per
    batch)."""
    size = batch_size or scorer.batch_size
    out: list[Any] = []
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        locs = [(row, pos) for row, prompt in enumerate(chunk) for pos in where(prompt)]
        ids = [p.input_ids for p in chunk]
        out += score_with(scorer, ids, edits={hook: (locs, fn)}, hooks=hooks)[0]
        if progress is not None:
            progress.update(len(chunk))
    return out


class _Split:
    """The reads and edits of one batch by hook: prompt locations (padded columns) and answer
    locations (looked up at each trie depth)."""

    def __init__(
        self,
        batch: Sequence[Sequence[int]],
        reads: dict[str, list[Loc]],
        edits: dict[str, Edit],
        device: Any,
        no_answers: str | None = None,
    ) -> None:
        """`no_answers`: the line refusing answer locations where the forward has none."""
        width = max(len(p) for p in batch)
        self.device, self.edits = device, edits
        self.sizes = {hook: len(locs) for hook, locs in reads.items()}
        self.hooks = sorted(set(reads) | set(edits), key=hook_order)
        self.prompt: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
        self.answers: dict[tuple[str, str], dict[tuple[int, int], list[int]]] = {}
        wanted = [((h, "read"), locs) for h, locs in reads.items()]
        for key, locs in wanted + [((h, "edit"), locs) for h, (locs, _) in edits.items()]:
            for i, (row, pos) in enumerate(locs):
                if isinstance(pos, AnswerNode):
                    self.answers.setdefault(key, {}).setdefault((row, pos.node), []).append(i)
                else:
                    column = width - len(batch[row]) + pos
                    self.prompt.setdefault(key, []).append((i, row, column))
        if no_answers and self.answers:
            raise ProbekitError(no_answers)

    def ops(self, entries: dict[tuple[str, str], list[tuple[int, int, int]]]) -> list[Op]:
        """Each hook's read and edit of `entries` (location index, row, column), in the order a
        forward reaches the hooks."""
        out: list[Op] = []
        for hook in self.hooks:
            read, edit = entries.get((hook, "read")), entries.get((hook, "edit"))
            if read or edit:
                edited = (self._index(edit), self.edits[hook][1]) if edit else None
                out.append((hook, self._index(read) if read else None, edited))
        return out

    def _index(self, entries: list[tuple[int, int, int]]) -> Index:
        at, rows, cols = (torch.tensor(v, dtype=torch.long) for v in zip(*entries, strict=True))
        return at, rows.to(self.device), cols.to(self.device)

    def answer_ops(self, rows: torch.Tensor, nodes: torch.Tensor, valid: torch.Tensor) -> list:
        """Each hook's read and edit at the answer nodes one trie depth feeds (`TriePass.run`)."""
        at_row, at_col = valid.nonzero(as_tuple=True)
        slots = zip(
            rows[at_row].tolist(),
            nodes[at_row, at_col].tolist(),
            at_row.tolist(),
            at_col.tolist(),
            strict=True,
        )
        where = {(row, node): (r, c) for row, node, r, c in slots}
        found = {
            key: [
                (i, *where[loc]) for loc, indices in wanted.items() if loc in where for i in indices
            ]
            for key, wanted in self.answers.items()
        }
        return self.ops(found)

    def gather(self, sink: dict[str, Any], library: str | None = None) -> dict[str, torch.Tensor]:
        """The values read, one [locs, ...] tensor per hook in the order of its locations; with
        `library`, one line for a hook read that never fired."""
        out = {}
        for hook, size in self.sizes.items():
            pieces = sink.get(hook, [])
            if pieces:
                first = pieces[0][1]
                out[hook] = torch.full((size, *first.shape[1:]), torch.nan, dtype=first.dtype)
                for at, values in pieces:
                    out[hook][at] = values
        missing = [hook for hook in self.sizes if hook not in out]
        if library and missing:
            raise ProbekitError(f"the {library} hooks did not reach {', '.join(missing)}")
        return out


def bridge_hooks(
    model: Any,
    batch: Sequence[Sequence[int]],
    reads: dict[str, list[Loc]],
    edits: dict[str, Edit] | None = None,
) -> tuple[list, Callable[[], dict[str, torch.Tensor]]]:
    """TransformerLens hooks reading and editing prompt positions of the left-padded `batch` (as
    `score_with`) in whatever forward they are attached to, and the function giving the values
    read afterwards."""
    split = _Split(batch, reads, edits or {}, model.device, PLAIN_ANSWERS)
    sink: dict[str, list] = {}
    return _hooks(split.ops(split.prompt), sink), lambda: split.gather(sink, "transformer_lens")


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
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions(mask)}
    inputs = {name: value.to(model.device) for name, value in inputs.items()}
    last = max(parse_hook(hook)[0] for hook in reads) + 1
    with torch.no_grad(), hook_library(model, chosen) as bridge:
        if chosen == "transformer_lens":
            fwd, values = bridge_hooks(model, batch, reads)
            stop = last if last < model.n_layers else None
            ids = inputs.pop("input_ids")
            bridge.run_with_hooks(
                ids, fwd_hooks=fwd, stop_at_layer=stop, return_type=None, **inputs
            )
            return values()
        split = _Split(batch, reads, {}, model.device, PLAIN_ANSWERS)
        return split.gather(_trace(model, inputs, split.ops(split.prompt), stop=True), chosen)


def _apply(tensor: torch.Tensor, read: Any, edit: Any, sink: dict, hook: str) -> None:
    """Read, then edit in place, the values of `tensor` at the given locations; the values read
    go to `sink[hook]` as (their indices in the hook's read list, values)."""
    if read is not None:
        at, rows, cols = read
        sink.setdefault(hook, []).append((at, tensor[rows, cols].detach().cpu()))
    if edit is not None:
        (at, rows, cols), fn = edit
        old = tensor[rows, cols]
        new = fn(old, at) if isinstance(fn, LocationValues) else fn(old)
        tensor[rows, cols] = new.to(tensor.device, tensor.dtype)


def _hooks(ops: list[Op], sink: dict) -> list[tuple[str, Callable]]:
    """A TransformerLens hook per op, applying it (`_apply`) to a copy where it edits."""

    def hook_of(name: str, read: Any, edit: Any) -> Callable:
        def fn(value: Any, hook: Any) -> Any:
            tensor = value[0] if isinstance(value, tuple) else value
            if edit is not None:
                tensor = tensor.clone()
            _apply(tensor, read, edit, sink, name)
            if edit is None:
                return None
            return (tensor, *value[1:]) if isinstance(value, tuple) else tensor

        return fn

    return [(hook, hook_of(hook, read, edit)) for hook, read, edit in ops]


def _trace(
    model: Any, inputs: dict, ops: list[Op], stop: bool = False, **trace: Any
) -> dict[str, list]:
    """Apply `ops` to the site values of an nnsight trace of `model.nnsight`; the values read,
    as `_apply`'s sink (`stop`: end the forward after the last op)."""
    import nnsight

    lm = model.nnsight
    where = layout(hf_module(model))
    blocks = walk(lm, where.blocks)
    heads = n_heads(model)
    with lm.trace(inputs, **trace) as tracer:
        sink: dict[str, list] = {}
        for hook, read, edit in ops:
            layer, found = parse_hook(hook)
            _apply(found.nnsight(blocks[layer], where, heads), read, edit, sink, hook)
        sink = nnsight.save(sink)
        if stop:
            tracer.stop()
    return sink
