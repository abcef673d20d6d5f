"""The trie pass: the answer set's token trie read from each prompt's KV cache, one forward per
trie depth, pruned within a mass budget.

All kept nodes of a depth, of every prompt, are appended to the cache as extra tokens; a
tree-shaped attention mask lets each node see only its prompt and its own ancestors, and position
ids continue the prompt. Each node's next-token distribution gives its children's probabilities
and, for terminal nodes, the stop probability. Before each depth the least likely candidates are
dropped while the dropped mass stays within `epsilon` x (an upper bound of the valid mass: the
answers resolved so far plus all the mass still open at this depth), halved as a margin for the
mass that later leaves the answer set; the dropped mass over the valid mass is the result's
`error_bound`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from probekit.core.answers import ANSWER_KINDS, AnswerSet
from probekit.engines.base import ScoreResult, ScorerStats
from probekit.engines.hf.attention import additive_mask
from probekit.engines.hf.forward import body, clock
from probekit.engines.hf.head import HEAD_CHUNK, VocabularyColumns, lm_head, vocabulary_sums
from probekit.engines.hf.prompt_pass import PromptState
from probekit.engines.trie import AnswerTrie

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel


@dataclass
class TrieTables:
    """The trie as tensors for vectorised expansion."""

    n_nodes: int
    max_depth: int
    token: torch.Tensor  # [nodes]
    levels: list[torch.Tensor]  # node indices per depth
    ancestors: torch.Tensor  # [nodes, max_depth]: ancestors below the root, -1 padded
    child_token: torch.Tensor  # [nodes, max_children], -1 padded
    child_index: torch.Tensor
    terminal: list[torch.Tensor]  # per rule: float64 [nodes, answers] incidence

    @classmethod
    def build(cls, trie: AnswerTrie, device: torch.device) -> TrieTables:
        nodes = trie.nodes
        n, depth = len(nodes), trie.max_depth
        width = max(len(node.children) for node in nodes)
        ancestors = torch.full((n, max(depth, 1)), -1, dtype=torch.long)
        child_token = torch.full((n, width), -1, dtype=torch.long)
        child_index = torch.full((n, width), -1, dtype=torch.long)
        kinds = range(len(ANSWER_KINDS))
        terminal = [torch.zeros(n, len(trie.answers), dtype=torch.float64) for _ in kinds]
        for i, node in enumerate(nodes):
            j, k = node.parent, 0
            while j > 0:
                ancestors[i, k] = j
                j, k = nodes[j].parent, k + 1
            for c, (tok, child) in enumerate(node.children.items()):
                child_token[i, c], child_index[i, c] = tok, child
            for a in node.terminal_for:
                terminal[trie.rules[a]][i, a] = 1.0
        levels = [torch.tensor(trie.level(d), dtype=torch.long) for d in range(depth + 1)]
        return cls(
            n_nodes=n,
            max_depth=depth,
            token=torch.tensor([max(node.token, 0) for node in nodes]).to(device),
            levels=[lv.to(device) for lv in levels],
            ancestors=ancestors.to(device),
            child_token=child_token.to(device),
            child_index=child_index.to(device),
            terminal=[m.to(device) for m in terminal],
        )

    def answer_probs(self, logp_node: torch.Tensor, stop_logp: torch.Tensor) -> torch.Tensor:
        """Unnormalised P(answer) [n, answers] from node log-probs [n, nodes] and their stop
        log-probs [n, nodes, rule]: each answer's ending under its kind's stop rule."""
        node_p = (logp_node[..., None] + stop_logp).exp()
        probs = node_p[..., 0] @ self.terminal[0]
        for rule in range(1, len(self.terminal)):
            probs = probs + node_p[..., rule] @ self.terminal[rule]
        return probs


AnswerContext = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor], contextlib.AbstractContextManager
]
"""`context(rows, nodes, valid)` around one trie depth's forward (see `TriePass.run`)."""


class TriePass:
    """The trie pass of one answer set on one model; `run` continues from a prompt pass."""

    def __init__(self, model: HFModel, answers: AnswerSet) -> None:
        self.model = model
        self.answers = answers
        self.trie = AnswerTrie.build(answers, model.tokenizer)
        self.columns = VocabularyColumns.build(model)
        self.tables = TrieTables.build(self.trie, model.device)

    def run(
        self,
        state: PromptState,
        epsilon: float,
        stats: ScorerStats,
        context: AnswerContext | None = None,
        rows: torch.Tensor | None = None,
    ) -> list[ScoreResult]:
        """One result per row of `state`; its cache is extended by the trie's columns.

        `context(rows, nodes, valid)` wraps each depth's forward (e.g. hooks that read or write
        activations at answer positions): column k of state row i holds trie node `nodes[i, k]`
        where `valid[i, k]`, and `rows[i]` is that row's index in the scored batch (`rows`
        defaults to 0..n-1)."""
        t = self.tables
        n = state.mask.shape[0]
        dev = self.model.device
        logp_node = torch.full((n, t.n_nodes), -torch.inf, dtype=torch.float64, device=dev)
        stop_logp = torch.full((n, t.n_nodes, 2), -torch.inf, dtype=torch.float64, device=dev)
        top_token = torch.full((n, t.n_nodes), -1, dtype=torch.long, device=dev)
        column = torch.full((n, t.n_nodes), -1, dtype=torch.long, device=dev)
        top_token[:, 0] = state.root_logp.argmax(-1)
        level1 = t.levels[1]
        logp_node[:, level1] = state.root_logp[:, t.token[level1]]
        dropped = torch.zeros(n, dtype=torch.float64, device=dev)
        visible = state.mask
        cache = state.cache
        if rows is None:
            rows = torch.arange(n, device=dev)
        for depth in range(1, t.max_depth + 1):
            cand = t.levels[depth]
            p = logp_node[:, cand].exp()
            # Upper bound of the valid mass: answers already resolved + all mass still open.
            upper = t.answer_probs(logp_node, stop_logp).sum(-1) + p.sum(-1)
            keep = prune(p, 0.5 * epsilon * upper - dropped)
            dropped += (p * ~keep).sum(-1)
            count = keep.sum(-1)
            width = int(count.max())
            if width == 0:
                break
            fed = int(count.sum())
            stats.trie_positions += fed
            stats.padding += n * width - fed
            # Compact kept candidates to the left: sel[b, k] = k-th kept node of row b.
            order = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[:, :width]
            sel = cand[order]
            valid = torch.arange(width, device=dev)[None, :] < count[:, None]
            past = visible.shape[1]
            at = torch.arange(n, device=dev)[:, None].expand(n, width)
            offsets = torch.arange(width, device=dev).expand(n, -1)
            column[at[valid], sel[valid]] = past + offsets[valid]
            attend = self._tree_mask(visible, column, sel, valid, past)
            ids = torch.where(valid, t.token[sel], self.model.tokenizer.pad_token_id)
            positions = (state.lengths[:, None] + depth - 1).expand(n, width)
            with context(rows, sel, valid) if context else contextlib.nullcontext():
                hidden, cache = body(
                    self.model, ids, additive_mask(attend, self.model.dtype), positions, cache
                )
            visible = torch.cat([visible, torch.zeros_like(valid)], dim=1)
            head_start = clock(dev)
            self._expand(hidden[valid], at[valid], sel[valid], logp_node, stop_logp, top_token)
            stats.head_seconds += clock(dev) - head_start
        return self._results(logp_node, stop_logp, top_token, dropped)

    def _tree_mask(self, visible, column, sel, valid, past) -> torch.Tensor:
        """Bool [n, 1, width, past + width]: prompt tokens, ancestors and the node itself."""
        n, width = sel.shape
        attend = visible[:, None, :].expand(n, width, past).clone()
        anc = self.tables.ancestors[sel]  # [n, width, max_depth]
        anc_col = torch.gather(column, 1, anc.clamp(min=0).view(n, -1)).view_as(anc)
        anc_col = torch.where((anc >= 0) & valid[..., None], anc_col, -1)
        hit = anc_col >= 0
        b, k, _ = torch.nonzero(hit, as_tuple=True)
        attend[b, k, anc_col[hit]] = True
        own = torch.eye(width, dtype=torch.bool, device=sel.device).expand(n, width, width)
        return torch.cat([attend, own], dim=-1)[:, None]

    def _expand(self, hidden, rows, nodes, logp_node, stop_logp, top_token) -> None:
        """From each fed node's next-token distribution: children, stop mass, greedy token.

        One pass over the vocabulary per row: exp(logits - max) times a matrix whose columns are
        all ones and the "does not extend" masks gives the normaliser and the stop mass of both
        rules at once (`vocabulary_sums`, accurate to a float64 sum)."""
        t = self.tables
        for start in range(0, hidden.shape[0], HEAD_CHUNK):
            sl = slice(start, start + HEAD_CHUNK)
            logits = lm_head(self.model, hidden[sl])
            top, top_token[rows[sl], nodes[sl]] = logits.max(-1)
            child_tok = t.child_token[nodes[sl]]  # [k, max_children]
            child_logit = torch.gather(logits, 1, child_tok.clamp(min=0)).double()
            weights = logits.sub_(top[:, None]).exp_()  # in place: bounds the chunk's memory
            sums = vocabulary_sums(weights, self.columns.blocks).clamp(min=1e-300).log()
            del logits, weights
            top = top.double()
            log_z = sums[:, :1]
            r, i = rows[sl], nodes[sl]
            stop_logp[r, i] = sums[:, 1:] - log_z
            child_idx = t.child_index[i]
            has = child_idx >= 0
            child_lp = child_logit - top[:, None] - log_z
            rr = r[:, None].expand_as(child_idx)
            logp_node[rr[has], child_idx[has]] = (logp_node[r, i][:, None] + child_lp)[has]

    def _results(self, logp_node, stop_logp, top_token, dropped) -> list[ScoreResult]:
        probs = self.tables.answer_probs(logp_node, stop_logp).cpu().numpy()
        valid = probs.sum(-1)
        greedy = self._greedy(top_token.cpu().numpy())
        results = []
        for row in range(probs.shape[0]):
            mass = float(valid[row])
            norm = probs[row] / mass if mass > 0 else np.full(len(self.answers), np.nan)
            mode = self.answers.answers[int(np.argmax(norm))] if mass > 0 else None
            result = ScoreResult(
                probs=norm,
                valid_mass=mass,
                error_bound=float(dropped[row]) / mass if mass > 0 else float("inf"),
                greedy=greedy[row] if greedy[row] is not None else mode,
                most_probable=mode,
            )
            if self.answers.numeric and mass > 0:
                values = self.answers.values
                result.expected = float(norm @ values)
                result.std = float(np.sqrt(max(norm @ (values - result.expected) ** 2, 0.0)))
            results.append(result)
        return results

    def _greedy(self, top_token: np.ndarray) -> list[str | None]:
        """Follow the most likely token from the root; the answer greedy decoding would give."""
        trie, extends = self.trie, self.columns.extends
        out: list[str | None] = []
        for row in top_token:
            node, answer = 0, None
            while True:
                token = int(row[node])
                child = trie.nodes[node].children.get(token)
                if child is not None:
                    node = child
                    continue
                for a in trie.nodes[node].terminal_for:
                    if token >= 0 and not bool(extends[trie.rules[a], token]):
                        answer = self.answers.answers[a]
                break
            out.append(answer)
        return out


def prune(p: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """Keep mask: drop the smallest candidates while their summed mass fits in the budget."""
    sorted_p, order = p.sort(dim=-1)
    drop_sorted = (sorted_p.cumsum(-1) <= budget[:, None]) | (sorted_p == 0)
    keep = torch.ones_like(p, dtype=torch.bool)
    keep.scatter_(1, order, ~drop_sorted)
    return keep
