"""The exact answer distribution with autograd: the engine's definition in one differentiable pass.

The quantity is the trie pass's (`probekit.engines.hf.trie_pass`): every surface form of every
answer, times its stop probability, with float64 normalisers and stop sums. Only the route
differs, so that gradients reach any activation of the prompt: the prompt and every node of the
answer trie go through the model in ONE forward, the nodes appended after the prompt with a
tree-shaped attention mask (a node sees its prompt, its ancestors and itself; position ids
continue the prompt), and no node is pruned. The trie tables and the "does not extend" sums are
the scorer's own. The LM head runs on every node under activation checkpointing, chunk by chunk,
so the float64 vocabulary-wide sums are recomputed in the backward pass instead of stored.

A patch in the engine acts on the prompt pass, and the trie pass reads the patched KV cache;
here an edit of a prompt column is seen by the node columns through attention in the same way,
so the two compute the same function of the prompt's activations.

`read_nodes` is the same head on any residual stream at the trie's nodes (the logit lens's, at
every layer). `HFScorer.answer_mass` and `HFScorer.read_nodes` are these, behind the engine
protocol's `HookedScorer`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch.utils.checkpoint import checkpoint

from probekit.core.padding import left_pad, positions
from probekit.engines.hf.attention import additive_mask
from probekit.engines.hf.forward import body
from probekit.engines.hf.head import HEAD_CHUNK, node_terms
from probekit.engines.hf.precision import final_norm
from probekit.engines.hf.trie_pass import TriePass


def answer_mass(trie_pass: TriePass, batch: Sequence[Sequence[int]]) -> torch.Tensor:
    """Unnormalised P(answer) [rows, answers] (float64, differentiable) of each prompt.

    Prompts are left-padded to the batch width W: position p of a prompt of length n sits at
    column W - n + p of every activation in the forward (the trie nodes follow from column W).
    """
    model, t = trie_pass.model, trie_pass.tables
    dev = model.device
    n = len(batch)
    ids, mask = left_pad(batch, model.tokenizer.pad_token_id, dev)
    width = ids.shape[1]
    depth = (t.ancestors >= 0).sum(-1) + 1  # below the root; the root's entry is unused
    lengths = mask.sum(-1)
    tokens = torch.cat([ids, t.slot_token[1:-1].expand(n, -1)], dim=1)
    position_ids = torch.cat([positions(mask), lengths[:, None] - 1 + depth[None, 1:]], dim=1)
    # causal over the real prompt tokens; a node sees them, its ancestors and itself
    total, real = width + t.n_nodes - 1, mask.bool()[:, None, :]
    attend = torch.zeros(n, total, total, dtype=torch.bool, device=dev)
    attend[:, :width, :width] = torch.ones(width, width, dtype=torch.bool, device=dev).tril() & real
    attend[:, width:, :width] = real
    attend[:, width:, width:] = t.is_ancestor[1:-1, 1:-1]
    attend |= torch.eye(total, dtype=torch.bool, device=dev)  # every query sees itself
    hidden, _ = body(model, tokens, additive_mask(attend[:, None], model.dtype), position_ids)
    node_hidden = hidden[:, width - 1 :]  # the root (the prompt's last position), then the nodes
    logp_node, stop_logp, _ = node_log_probs(trie_pass, node_hidden)
    return t.answer_probs(logp_node, stop_logp)


def read_nodes(
    trie_pass: TriePass, hidden: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`node_log_probs` of the residual stream at the trie's nodes ([rows, nodes, d_model]) after
    the model's final norm: the one `hf` runs now (the bridge's while it is installed)."""
    norm = final_norm(trie_pass.model.hf)
    if norm is not None:
        weight = next(norm.parameters(), None)  # a dispatched model's norm may sit elsewhere
        hidden = norm(hidden.to(weight.device if weight is not None else hidden.device))
    return node_log_probs(trie_pass, hidden.to(trie_pass.model.device))


def node_log_probs(
    trie_pass: TriePass, node_hidden: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the final hidden state at every trie node ([rows, nodes, d_model]; node 0, the root,
    is the prompt's last position): log P(node) [rows, nodes] and the stop log-probs [rows,
    nodes, rule] in float64, which `TrieTables.answer_probs` multiplies into the answers'
    probabilities, and each node's most likely next token [rows, nodes]. The LM head and the
    vocabulary sums are the engine's (`lm_head`, `vocabulary_sums`); differentiable in
    `node_hidden`. What `answer_mass` reads after its one forward, and what the logit lens
    reads from each layer (`read_nodes`)."""
    t = trie_pass.tables
    n, nodes = node_hidden.shape[:2]
    flat = node_hidden.reshape(n * nodes, -1)
    child = t.slot_child_token[:-1].repeat(n, 1)
    run = node_terms  # in chunks; under autograd each checkpointed (its float64 sums recomputed)
    if torch.is_grad_enabled():
        run = functools.partial(checkpoint, node_terms, use_reentrant=False)
    chunks = [
        run(trie_pass.model, trie_pass.columns, flat[i : i + HEAD_CHUNK], child[i : i + HEAD_CHUNK])
        for i in range(0, flat.shape[0], HEAD_CHUNK)
    ]
    terms, top = (torch.cat(parts) for parts in zip(*chunks, strict=True))
    terms = terms.view(n, nodes, -1)
    log_z = terms[..., :1]
    stop_logp = terms[..., 1:3] - log_z  # [n, nodes, rule]
    child_logp = terms[..., 3:] - log_z  # [n, nodes, children]
    parent, slot = t.parent_slot
    root = torch.zeros(n, 1, dtype=torch.float64, device=terms.device)
    edge = torch.cat([root, child_logp[:, parent[1:], slot[1:]]], dim=1)  # log P(node | parent)
    # log P(node) = its own edge + its ancestors' edges (ancestors below the root; -1 -> edge 0 = 0)
    logp_node = edge + edge[:, t.ancestors.clamp(min=0)].sum(-1)
    return logp_node, stop_logp, top.view(n, nodes)
