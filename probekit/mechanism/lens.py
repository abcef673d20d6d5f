"""The logit lens on the exact readout: a prompt's answer distribution as each layer reads it.

The logit lens decodes the residual stream after layer l with the model's own final norm and LM
head, as if the layers above were not there. Its usual form (TransformerLens's
`accumulated_resid(apply_ln=True)` through the unembedding, nnterp's `logit_lens`) reads one
next token. probekit's readouts are distributions over answers of several tokens (0-100 through
an answer trie, A-E letters, emotion words), so here the lens reads the answer trie: at every
node the scorer reads (the prompt's last position, then one position per answer prefix) the
residual stream after layer l goes through the final norm and the LM head, and the answer
probabilities are multiplied along the trie exactly as the scorer multiplies them (each
surface form, the stop probability of the answer's kind, the valid mass, the expected value;
`probekit.engines.hf.differentiable.node_log_probs`, `TrieTables.answer_probs`).

It costs one scoring run: the scorer runs once (prompt pass and trie pass at epsilon 0) while
hooks read `blocks.{l}.hook_resid_post` at those positions only
(`probekit.mechanism.interventions.score_with`); the norm and the head then run per layer on
those rows only. After the last layer the lens is the scorer: the same hidden states through the
same norm and head (a test holds it to the scorer's own error).

Where it departs from a single-token lens. Every trie node after the first is the answer's
prefix fed to the whole model: its residual stream at layer l has attended, through the KV
cache, to the full model's earlier layers at the prompt and at the prefix's earlier tokens
(position for position, the lens changes the readout, not the forward). So the lens at layer l
is "what layer l believes at each answer token, given the answer so far", and for a one-token
answer it is the single-token lens at the prompt's last position times the stop probability that
layer l reads after the token. A node the full model gives probability 0 (pruned even at
epsilon 0) is never fed: a layer that puts mass on it cannot say how its answers end, and that
mass is the row's `error_bound` (pruned mass / valid mass), as in the scorer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from probekit.core.answers import AnswerSet
from probekit.core.items import PROMPT_ID
from probekit.core.kinds import int_list
from probekit.core.options import option
from probekit.core.progress import progress as track
from probekit.core.progress import silenced
from probekit.core.public import public
from probekit.core.shared_options import BatchSizeOption, LimitOption, OutOption, SeedOption
from probekit.engines.base import HookedScorer, ScoreResult
from probekit.engines.options import ModelOptions, ScoreOptions
from probekit.mechanism.api import encode_prompts, hookable
from probekit.mechanism.interventions import answer_nodes, score_with
from probekit.mechanism.sites import d_model, hook_library, layer_indices

SITE = "hook_resid_post"
"""The residual stream after each layer: what the lens decodes."""
READ_BUDGET = 1 << 30
"""Bytes of residual stream one batch may read (every layer, at every read position): the
batch is made smaller until it fits."""


@dataclass(frozen=True)
class LensOptions(LimitOption, BatchSizeOption, SeedOption, OutOption):
    """Lens options: the layers read."""

    layers: list[int] | None = option(
        None,
        help="comma-separated layers whose residual stream is read, -1 the last (default: every "
        "layer)",
        kind=int_list,
    )


@dataclass(frozen=True)
class LensResult:
    """One prompt read after each of `layers` (`results[k]`: its answer distribution after
    layer `layers[k]`), and `final`, the scorer's own result of the same forward passes."""

    layers: tuple[int, ...]
    results: tuple[ScoreResult, ...]
    final: ScoreResult


def layer_results(scorer: HookedScorer, hidden: torch.Tensor) -> list[ScoreResult]:
    """Each row's answer distribution from the residual stream at its trie nodes ([rows, nodes,
    d_model], node 0 the prompt's last position; NaN at a node the run did not feed)."""
    fed = ~torch.isnan(hidden).any(-1)
    hidden = torch.where(fed[..., None], hidden, 0)
    logp_node, stop_logp, top = scorer.read_nodes(hidden)
    unfed = ~fed.to(logp_node.device)
    tables = scorer.trie_pass.tables
    parent = tables.ancestors[:, 0].clamp(min=0)  # -1 (the root's children) -> the root, fed
    logp_node = logp_node.masked_fill(unfed & unfed[:, parent], -torch.inf)  # below a pruned node
    dropped = logp_node.masked_fill(~unfed, -torch.inf).exp().sum(-1)  # the pruned nodes' mass
    stop_logp = stop_logp.masked_fill(unfed[..., None], -torch.inf)
    probs = tables.answer_probs(logp_node, stop_logp).cpu().numpy()
    top = top.masked_fill(unfed, -1).cpu().numpy()
    return scorer.trie_pass.row_results(probs, dropped.cpu().numpy(), top)


def lens_batch_size(scorer: HookedScorer, layers: Sequence[int], asked: int | None) -> int:
    """Prompts per batch: `asked`, else the scorer's, at most what keeps one batch's reads
    (every layer at every read position) within `READ_BUDGET`."""
    size = asked or scorer.batch_size
    width = d_model(scorer.model) * torch.finfo(scorer.model.dtype).bits // 8
    per_prompt = len(layers) * len(scorer.trie.nodes) * width
    return max(1, min(size, READ_BUDGET // per_prompt))


def logit_lens(
    scorer: HookedScorer,
    prompts: Sequence[Sequence[int]],
    layers: Sequence[int],
    batch_size: int | None = None,
    bar: Any = None,
) -> list[LensResult]:
    """The lens of every prompt (token ids), in order, in batches (`lens_batch_size`); `bar`
    (a progress) is updated per batch."""
    size = lens_batch_size(scorer, layers, batch_size)
    nodes = len(scorer.trie.nodes)
    hooks = {layer: f"blocks.{layer}.{SITE}" for layer in layers}
    out: list[LensResult] = []
    for start in range(0, len(prompts), size):
        batch = [list(p) for p in prompts[start : start + size]]
        # one scoring run reading the residual stream at the prompt's last position and every
        # answer node
        ends = (len(prompt) - 1 for prompt in batch)
        locs = [(row, at) for row, end in enumerate(ends) for at in (end, *answer_nodes(scorer))]
        with hook_library(scorer.model, "transformer_lens"):
            finals, values = score_with(scorer, batch, reads={h: locs for h in hooks.values()})
            with torch.inference_mode():  # read in the bridge: its final norm, the run's own
                read = [
                    layer_results(scorer, values[hooks[layer]].view(len(batch), nodes, -1))
                    for layer in layers
                ]
        out += [
            LensResult(tuple(layers), tuple(per_layer[row] for per_layer in read), final)
            for row, final in enumerate(finals)
        ]
        if bar is not None:
            bar.update(len(batch))
    return out


@public(LensOptions, ScoreOptions, ModelOptions, command="lens", skip=("model",))
def lens(
    model: Any,
    prompts: Any,
    *,
    answers: AnswerSet | str,
    layers: Sequence[int] | None = None,
    batch_size: int | None = None,
    quiet: bool = False,
) -> pd.DataFrame:
    """The logit lens on the exact readout: each prompt's answer distribution as read after
    each layer.

    Args:
        model: a loaded model or a model spec (`"default"`, a Hugging Face id, ...).
        prompts: one string, a list of strings, chat-message lists, `Item`s or encoded prompts,
            or a prompts JSONL path (as `probekit.score` takes them).

    Returns one row per (prompt, layer): `prompt_id`, the item's key columns, `layer`, and the
    score columns of `probekit.score` (`valid_mass`, `greedy`, `most_probable`, `error_bound`,
    `expected`, `std`, `p::<answer>`) of the answer distribution read after that layer; after
    the last layer they are the scorer's.
    """
    model = hookable(model)
    chosen = layer_indices(model, layers if layers is not None else range(model.n_layers))
    encoded = encode_prompts(model, prompts, "read")
    answer_set = answers if isinstance(answers, AnswerSet) else AnswerSet.parse(answers)
    ids = [e.input_ids for e in encoded]
    model.settle_precision(answer_set, ids)
    scorer = model.scorer(answer_set, epsilon=0.0, batch_size=batch_size)
    with silenced(quiet), track(len(ids), "prompt", "lens", "fewer layers or prompts") as bar:
        found = logit_lens(scorer, ids, chosen, batch_size, bar)
    return pd.DataFrame(  # one row per (prompt, layer)
        {PROMPT_ID: prompt.id, **prompt.item.key, "layer": layer, **result.row(answer_set)}
        for prompt, read in zip(encoded, found, strict=True)
        for layer, result in zip(read.layers, read.results, strict=True)
    )
