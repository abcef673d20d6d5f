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

Nothing is read back from the device inside a batch's levels (a read makes the host wait for
the device, which then idles while the next forward is issued): each depth feeds a width known
on the host, and every index is built on the device. At epsilon 0 the width is the trie level's
size. With pruning it is the most candidates a row of the previous batch kept at that depth
(`TriePass.widths`, which each batch's one read at its end updates); a row that would keep more
is marked cut, and the scorer runs the cut rows again with the widths they keep, read from the
device once per depth (as a scorer's first pruned batch does), so that every row keeps what it
would keep alone: the results do not depend on the batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from probekit.core.answers import ANSWER_KINDS, AnswerSet
from probekit.engines.base import HookableModel, ScoreResult, ScorerStats
from probekit.engines.hf.attention import additive_mask
from probekit.engines.hf.forward import Stopwatch, body
from probekit.engines.hf.head import VocabularyColumns, head_rows, node_terms
from probekit.engines.hf.prompt_pass import PromptState
from probekit.engines.trie import AnswerTrie


@dataclass
class TrieTables:
    """The trie as tensors for vectorised expansion. The `slot_` tables have one more row, for
    `n_nodes` itself: the node of a padding column, which has no children and is no ancestor,
    so that a padding column's writes land in a column of their own instead of being masked."""

    n_nodes: int
    max_depth: int
    levels: list[torch.Tensor]  # node indices per depth
    ancestors: torch.Tensor  # [nodes, max_depth]: ancestors below the root, -1 padded
    terminal: list[torch.Tensor]  # per rule: float64 [nodes, answers] incidence
    slot_token: torch.Tensor  # [nodes + 1]: the token a node feeds (0 for padding)
    slot_child_token: torch.Tensor  # [nodes + 1, max_children]: child tokens, 0 padded
    slot_child: torch.Tensor  # [nodes + 1, max_children]: children, `n_nodes` padded
    is_ancestor: torch.Tensor  # bool [nodes + 1, nodes + 1]: column j is an ancestor of row i
    parent_slot: torch.Tensor  # [2, nodes]: each node's parent and its slot among the parent's

    @classmethod
    def build(cls, trie: AnswerTrie, device: torch.device) -> TrieTables:
        nodes = trie.nodes
        n, depth = len(nodes), trie.max_depth
        width = max(len(node.children) for node in nodes)
        ancestors = torch.full((n, max(depth, 1)), -1, dtype=torch.long)
        slot_child_token = torch.zeros((n + 1, width), dtype=torch.long)
        slot_child = torch.full((n + 1, width), n, dtype=torch.long)
        terminal = torch.zeros(len(ANSWER_KINDS), n, len(trie.answers), dtype=torch.float64)
        is_ancestor = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        parent_slot = torch.zeros(2, n, dtype=torch.long)  # the root's: 0, 0
        for i, node in enumerate(nodes):
            j, k = node.parent, 0
            while j > 0:
                ancestors[i, k] = j
                is_ancestor[i, j] = True
                j, k = nodes[j].parent, k + 1
            for c, (tok, child) in enumerate(node.children.items()):
                slot_child_token[i, c], slot_child[i, c] = tok, child
                parent_slot[:, child] = torch.tensor([i, c])
            for a in node.terminal_for:
                terminal[trie.rules[a]][i, a] = 1.0
        levels = [torch.tensor(trie.level(d), dtype=torch.long) for d in range(depth + 1)]
        slot_token = torch.tensor([max(node.token, 0) for node in nodes] + [0])
        return cls(
            n_nodes=n,
            max_depth=depth,
            levels=[lv.to(device) for lv in levels],
            ancestors=ancestors.to(device),
            terminal=list(terminal.to(device)),
            slot_token=slot_token.to(device),
            slot_child_token=slot_child_token.to(device),
            slot_child=slot_child.to(device),
            is_ancestor=is_ancestor.to(device),
            parent_slot=parent_slot.to(device),
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


class _Pass:
    """The device state of one trie pass over n rows: per node (and the padding node, the last
    column) its log-prob, stop log-probs and most likely next token; per row the dropped mass and
    whether a width cut its candidates; the node of each trie column; the counts."""

    def __init__(self, n: int, none: int, depth: int, device: torch.device) -> None:
        f64, long = torch.float64, torch.long
        self.logp_node = torch.full((n, none + 1), -torch.inf, dtype=f64, device=device)
        self.stop_logp = torch.full((n, none + 1, 2), -torch.inf, dtype=f64, device=device)
        self.top_token = torch.full((n, none + 1), -1, dtype=long, device=device)
        self.dropped = torch.zeros(n, dtype=f64, device=device)
        self.cut = torch.zeros(n, dtype=torch.bool, device=device)
        self.placed = torch.empty((n, 0), dtype=long, device=device)
        self.wanted = torch.zeros(depth + 1, dtype=long, device=device)  # most kept per depth
        self.fed = torch.zeros((), dtype=long, device=device)
        self.slots = 0  # columns fed, padding included (known on the host)


class TriePass:
    """The trie pass of one answer set on one model; `run` continues from a prompt pass."""

    def __init__(self, model: HookableModel, answers: AnswerSet) -> None:
        self.model = model
        self.answers = answers
        self.trie = AnswerTrie.build(answers, model.tokenizer)
        self.columns = VocabularyColumns.build(model)
        self.tables = TrieTables.build(self.trie, model.device)
        self.widths: dict[float, list[int]] = {}
        """Per epsilon > 0, the width each depth feeds (index: the depth): the most candidates a
        row of the last batch kept there (its cut rows' run included)."""
        self.on_host = model.device.type == "cpu"
        """Whether the device is the host (the CPU), where reading a count waits for nothing:
        each depth then feeds the width this batch's rows keep (not the widths learned from an
        earlier batch, whose extra columns the body would compute for nothing) and the LM head
        skips the padding columns. On an accelerator a read would stall the queue: learned widths
        and the head on every column instead."""

    def run(
        self,
        state: PromptState,
        epsilon: float,
        stats: ScorerStats,
        context: AnswerContext | None = None,
        rows: torch.Tensor | None = None,
        read_widths: bool = False,
    ) -> tuple[list[ScoreResult], list[int]]:
        """One result per row of `state`, whose cache is extended by the trie's columns, and the
        rows whose candidates the learned widths cut (`TriePass.widths`; their results are not
        final: run them again with `read_widths`, which feeds each depth the width its rows keep,
        read from the device).

        `context(rows, nodes, valid)` wraps each depth's forward (e.g. hooks that read or write
        activations at answer positions): column k of state row i holds trie node `nodes[i, k]`
        where `valid[i, k]`, and `rows[i]` is that row's index in the scored batch (`rows`
        defaults to 0..n-1)."""
        t, n, dev = self.tables, state.mask.shape[0], self.model.device
        none = t.n_nodes  # the node of a padding column
        pass_ = _Pass(n, none, t.max_depth, dev)
        pass_.top_token[:, 0] = state.root_logp.argmax(-1)
        level1 = t.levels[1]
        pass_.logp_node[:, level1] = state.root_logp[:, t.slot_token[level1]]
        reads = read_widths or self.on_host
        learned = self.widths.get(epsilon) if epsilon > 0 and not reads else None
        cache, head = state.cache, Stopwatch(dev)
        if rows is None:
            rows = torch.arange(n, device=dev)
        for depth in range(1, t.max_depth + 1):
            width = len(t.levels[depth])  # exact: every candidate
            if epsilon > 0:
                width = learned[depth] if learned else None  # None: read it
            valid, sel = self._choose(pass_, depth, epsilon, width)
            if sel.shape[1] == 0:
                break
            width = sel.shape[1]
            attend = torch.cat(
                [
                    state.mask[:, None, :].expand(n, width, -1),
                    t.is_ancestor[sel[:, :, None], pass_.placed[:, None, :]],
                    torch.eye(width, dtype=torch.bool, device=dev).expand(n, width, width),
                ],
                dim=-1,
            )[:, None]
            ids = torch.where(valid, t.slot_token[sel], self.model.tokenizer.pad_token_id)
            positions = (state.lengths[:, None] + depth - 1).expand(n, width)
            with context(rows, sel, valid) if context else contextlib.nullcontext():
                hidden, cache = body(
                    self.model, ids, additive_mask(attend, self.model.dtype), positions, cache
                )
            pass_.placed = torch.cat([pass_.placed, sel], dim=1)
            head.mark()
            at = torch.arange(n, device=dev)[:, None].expand(n, width)
            if self.on_host:
                self._expand(hidden[valid], at[valid], sel[valid], pass_)
            else:
                self._expand(hidden.flatten(0, 1), at.flatten(), sel.flatten(), pass_)
            head.mark()
        # The batch's reads, after its last level: the results and the counts, in two copies.
        probs = t.answer_probs(pass_.logp_node[:, :none], pass_.stop_logp[:, :none])
        floats = torch.cat([probs, pass_.dropped[:, None]], dim=1).cpu().numpy()
        counts = torch.cat([pass_.wanted, pass_.fed[None], pass_.cut.long()])
        ints = torch.cat([pass_.top_token[:, :none].flatten(), counts]).cpu().numpy()
        wanted, fed, cut = np.split(ints[n * none :], [t.max_depth + 1, t.max_depth + 2])
        if epsilon > 0:
            old = self.widths.get(epsilon) if read_widths else None
            self.widths[epsilon] = (wanted if old is None else np.maximum(old, wanted)).tolist()
        stats.trie_positions += int(fed[0])
        stats.padding += pass_.slots - int(fed[0])
        stats.head_seconds += head.seconds()
        top_token = ints[: n * none].reshape(n, none)
        results = self.row_results(floats[:, :-1], floats[:, -1], top_token)
        return results, np.flatnonzero(cut).tolist()

    def _choose(
        self, pass_: _Pass, depth: int, epsilon: float, width: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The columns of one depth, [n, width] each: which are fed (`valid`) and their nodes
        (the padding node where not), each row's most likely kept candidates. The mass of the
        rest joins the rows' dropped mass; a row that keeps more than `width` is marked cut.
        `width` None: the most any row keeps, read from the device."""
        t = self.tables
        cand = t.levels[depth]
        p = pass_.logp_node[:, cand].exp()
        budget = torch.zeros_like(pass_.dropped)
        if epsilon > 0:
            # Upper bound of the valid mass: answers already resolved + all mass still open.
            none = t.n_nodes
            upper = t.answer_probs(pass_.logp_node[:, :none], pass_.stop_logp[:, :none])
            budget = 0.5 * epsilon * (upper.sum(-1) + p.sum(-1)) - pass_.dropped
        order, keep = prune(p, budget)
        kept = keep.sum(-1)
        pass_.wanted[depth] = kept.max()
        if width is None:
            width = int(pass_.wanted[depth])  # read once per depth
        width = min(width, len(cand))
        pass_.cut |= kept > width
        gone = keep.logical_not()
        gone[:, : len(cand) - width] = True
        pass_.dropped += torch.where(gone, p.gather(1, order), 0).sum(-1)
        valid = keep[:, len(cand) - width :]
        pass_.fed += valid.sum()
        pass_.slots += valid.numel()
        return valid, torch.where(valid, cand[order[:, len(cand) - width :]], t.n_nodes)

    def _expand(self, hidden, rows, nodes, pass_: _Pass) -> None:
        """From each fed node's next-token distribution (`node_terms`): children, stop mass,
        greedy token. `nodes` may hold the padding node, whose writes land in its own column.
        The rows go through the LM head in chunks of `head_rows`."""
        t, logp_node = self.tables, pass_.logp_node
        step = head_rows(logp_node.shape[0])
        for start in range(0, hidden.shape[0], step):
            r, i = rows[start : start + step], nodes[start : start + step]
            chunk, child_token = hidden[start : start + step], t.slot_child_token[i]
            terms, pass_.top_token[r, i] = node_terms(self.model, self.columns, chunk, child_token)
            log_z = terms[:, :1]
            pass_.stop_logp[r, i] = terms[:, 1:3] - log_z
            logp_node[r[:, None], t.slot_child[i]] = logp_node[r, i][:, None] + terms[:, 3:] - log_z

    def row_results(
        self, probs: np.ndarray, dropped: np.ndarray, top_token: np.ndarray
    ) -> list[ScoreResult]:
        """Per row, from its unnormalised answer probabilities, dropped mass and nodes' most
        likely next tokens (on the host)."""
        answers, valid = self.answers, probs.sum(-1)
        results = []
        for row, greedy in enumerate(self._greedy(top_token)):
            mass = float(valid[row])
            norm = probs[row] / mass if mass > 0 else np.full(len(answers), np.nan)
            mode = answers.answers[int(np.argmax(norm))] if mass > 0 else None
            bound = float(dropped[row]) / mass if mass > 0 else float("inf")
            result = ScoreResult(norm, mass, bound, mode if greedy is None else greedy, mode)
            if answers.numeric and mass > 0:
                result.expected = expected = float(norm @ answers.values)
                result.std = float(np.sqrt(max(norm @ (answers.values - expected) ** 2, 0.0)))
            results.append(result)
        return results

    def _greedy(self, top_token: np.ndarray) -> list[str | None]:
        """Follow the most likely token from the root; the answer greedy decoding would give."""
        trie, extends = self.trie, self.columns.extends
        out: list[str | None] = []
        for row in top_token:
            node = 0
            while (child := trie.nodes[node].children.get(int(row[node]))) is not None:
                node = child
            token = int(row[node])  # the first that leaves the trie: ends an answer if it stops it
            ended = trie.nodes[node].terminal_for if token >= 0 else []  # -1: a node not fed
            ended = [a for a in ended if not bool(extends[trie.rules[a], token])]
            out.append(self.answers.answers[ended[-1]] if ended else None)
        return out


def prune(p: torch.Tensor, budget: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidates of each row from least to most likely (`order`, indices into `p`'s last
    dimension) and which of them are kept (`keep`, in that order): the smallest are dropped
    while their summed mass fits in the row's budget, and every candidate of probability 0."""
    sorted_p, order = p.sort(dim=-1)
    drop = (sorted_p.cumsum(-1) <= budget[:, None]) | (sorted_p == 0)
    return order, drop.logical_not()
