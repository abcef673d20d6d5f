"""Exact answer probabilities from logits: one prompt pass, then the answer trie from its KV cache.

For each batch of prompts:
1. The prompt pass. Prompts that share a token prefix (the same persona system prompt, the same
   template head) compute it once at batch size 1 and reuse its KV cache; the rest is left-padded.
   The LM head runs on the last position only.
2. The trie pass, one forward per trie depth. All kept nodes of that depth, of every prompt, are
   appended to the cache as extra tokens; a tree-shaped attention mask lets each node see only its
   prompt and its own ancestors, and position ids continue the prompt. Each node's next-token
   distribution gives its children's probabilities and, for terminal nodes, the stop probability.
3. Pruning: before each depth, the least likely candidate nodes are dropped while the total dropped
   prefix mass stays within `epsilon` x (an upper bound of the valid mass: the answers resolved so
   far plus all the mass still open at this depth), halved as a margin for the mass that later
   leaves the answer set. The dropped mass, relative to the valid mass, is reported as
   `error_bound`; a prompt whose bound still exceeds `epsilon` is re-expanded exactly, so every
   reported bound is at most `epsilon`.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from probekit.answers import AnswerSet
from probekit.batching import left_pad
from probekit.engines.base import DEFAULT_EPSILON, ScoreResult, ScorerStats
from probekit.engines.hf.model import LoadedModel
from probekit.scoring.trie import ALNUM, DIGIT, AnswerTrie, extension_masks

MIN_SHARED_PREFIX = 8  # tokens; shorter shared prefixes are not worth a separate forward
HEAD_CHUNK = 256  # rows of the LM head computed at once (bounds the logits' memory)
SUM_BLOCK = 128  # vocabulary entries per partial sum of `vocabulary_sums`


class Scorer:
    """Scores prompts (token id lists) against one answer set with one model."""

    def __init__(
        self,
        model: LoadedModel,
        answers: AnswerSet,
        epsilon: float = DEFAULT_EPSILON,
        batch_size: int | None = None,
        max_new_tokens: int = 0,
        settled: Callable[[str], bool] | None = None,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        """`max_new_tokens` > 0 also decodes a continuation of every prompt from the same prompt
        pass (the paper's generate mode): greedy, or sampled at `temperature` > 0 (seeded by
        `seed`). A row stops at end of sequence or as soon as `settled(text so far)` says that
        more text cannot change its parsed answer, so a large budget costs little on rows that
        answer early."""
        if epsilon < 0:
            raise ValueError("epsilon must be >= 0")
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.settled = settled
        self.temperature = temperature
        self._generator = torch.Generator(device=model.device).manual_seed(seed)
        self.answers = answers
        self.epsilon = epsilon
        self.batch_size = batch_size or (64 if model.device.type == "cuda" else 16)
        self.trie = AnswerTrie.build(answers, model.tokenizer)
        head = model.hf.get_output_embeddings()
        self._ext = extension_masks(model.tokenizer, head.weight.shape[0]).to(model.device)
        # [vocab, 1 + rule]: a column of ones (the normaliser), then per rule 1 where a token
        # does NOT extend an answer under that rule (the stop mass).
        stop = (~self._ext).T.float()
        self._sum_blocks = sum_blocks(torch.cat([torch.ones_like(stop[:, :1]), stop], dim=1))
        self._tables = _TrieTables.build(self.trie, model.device)
        self._prefix_cache: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.stats = ScorerStats()

    # ------------------------------------------------------------------ public API
    def score(
        self, prompts: Iterable[Sequence[int]], window: int = 4096, progress: Any = None
    ) -> Iterator[ScoreResult]:
        """Results in input order. Prompts are sorted within windows so that neighbours share
        prefixes and lengths; memory stays bounded by the window, whatever the number of prompts."""
        chunk: list[Sequence[int]] = []
        for prompt in prompts:
            chunk.append(prompt)
            if len(chunk) == window:
                yield from self._batched(chunk, self.score_batch, progress)
                chunk = []
        if chunk:
            yield from self._batched(chunk, self.score_batch, progress)

    def generate(self, prompts: Sequence[Sequence[int]], progress: Any = None) -> list[list[int]]:
        """The continuation `score` would decode for each prompt (the same prompt pass and
        decoding; `max_new_tokens` > 0), without the exact answer pass: for text after which
        the answer is scored (explain mode)."""
        if not self.max_new_tokens:
            raise ValueError("generate needs max_new_tokens > 0")
        return list(self._batched(list(prompts), self._generate_batch, progress))

    def _generate_batch(self, batch: Sequence[Sequence[int]]) -> list[list[int]]:
        with torch.inference_mode():
            return self._decode(self._prompt_pass(batch, reuse_prefix=True))

    def score_batch(
        self,
        batch: Sequence[Sequence[int]],
        reuse_prefix: bool = True,
        prompt_context: Callable[[], contextlib.AbstractContextManager] | None = None,
    ) -> list[ScoreResult]:
        """Score one batch. `prompt_context` wraps the prompt pass only (e.g. patching hooks);
        use it with `reuse_prefix=False`, so that every prompt is one left-padded row whose
        position p sits at padded column `max(len(b) for b in batch) - len(batch[row]) + p`."""
        with torch.inference_mode():
            start = self._clock()
            with prompt_context() if prompt_context else contextlib.nullcontext():
                state = self._prompt_pass(batch, reuse_prefix)
            prompt_columns = state.mask.shape[1]
            prompt_done = self._clock()
            results = self._trie_pass(state, self.epsilon)
            # The budget is set against an upper bound of the valid mass; where the valid mass
            # turned out much smaller and the bound exceeds epsilon, redo those rows exactly
            # (on a copy of their prompt cache: decoding below needs every row's).
            state.cache.crop(prompt_columns - state.cache.get_seq_length())  # back to the prompt
            redo = [i for i, r in enumerate(results) if r.error_bound > self.epsilon]
            if redo:
                index = torch.tensor(redo, device=self.model.device)
                cache = copy.deepcopy(state.cache)
                cache.batch_select_indices(index)
                sub = _State(cache, state.mask[index], state.lengths[index],
                             state.root_logp[index])  # fmt: skip
                for i, result in zip(redo, self._trie_pass(sub, 0.0), strict=True):
                    results[i] = result
                del cache, sub
            trie_done = self._clock()
            if self.max_new_tokens:
                for result, tokens in zip(results, self._decode(state), strict=True):
                    result.generated = tokens
            self.stats.prompts += len(batch)
            self.stats.prompt_seconds += prompt_done - start
            self.stats.trie_seconds += trie_done - prompt_done
            self.stats.decode_seconds += self._clock() - trie_done
            return results

    def _clock(self) -> float:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()  # so that each phase's seconds are its own
        return time.perf_counter()

    def _decode(self, state: _State) -> list[list[int]]:
        """Continue every prompt from its cache, as `generate()` does (greedy, or sampled at
        `temperature`), one token per step for the rows still running. A row leaves the batch
        (and its cache rows are dropped) at end of sequence, once `settled` holds for its text,
        or at `max_new_tokens`; its tokens end with the end-of-sequence token if it wrote one.
        The cache is consumed."""
        eos = self.model.hf.generation_config.eos_token_id
        stops = {eos} if isinstance(eos, int) else set(eos or [])
        decode = self.model.tokenizer.decode
        out: list[list[int]] = [[] for _ in range(state.mask.shape[0])]
        rows = list(range(len(out)))  # result row of each batch row still running
        mask, lengths, cache = state.mask.long(), state.lengths, state.cache
        token = self._next_token(state.root_logp)
        for step in range(1, self.max_new_tokens + 1):
            keep = []
            for k, (row, t) in enumerate(zip(rows, token.tolist(), strict=True)):
                out[row].append(t)
                finished = t in stops or step == self.max_new_tokens or (
                    self.settled is not None
                    and self.settled(decode(out[row], skip_special_tokens=True))
                )  # fmt: skip
                if not finished:
                    keep.append(k)
            if not keep:
                break
            if len(keep) < len(rows):
                index = torch.tensor(keep, device=mask.device)
                cache.batch_select_indices(index)
                rows = [rows[k] for k in keep]
                mask, lengths, token = mask[index], lengths[index], token[index]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            hidden = self.model.hf.model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=(lengths + step - 1)[:, None],
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state[:, -1]
            token = self._next_token(self._logits(hidden).double().log_softmax(-1))
        return out

    def _next_token(self, logp: torch.Tensor) -> torch.Tensor:
        """The greedy token of each row, or one sampled at the scorer's temperature."""
        if self.temperature == 0:
            return logp.argmax(-1)
        probs = (logp / self.temperature).softmax(-1)
        return torch.multinomial(probs, 1, generator=self._generator)[:, 0]

    # ------------------------------------------------------------------ batching
    def _batched(
        self, prompts: list[Sequence[int]], run: Callable[[list], list], progress: Any
    ) -> Iterator[Any]:
        """`run` on length-sorted batches of the prompts, its outputs in input order; on CUDA
        out-of-memory the batch size halves and the same prompts are tried again."""
        order = _batch_order(prompts, self.batch_size)
        results: list[Any] = [None] * len(prompts)
        start = 0
        while start < len(order):
            idx = order[start : start + self.batch_size]
            try:
                batch_results = run([prompts[i] for i in idx])
            except torch.cuda.OutOfMemoryError:
                if self.batch_size == 1:
                    raise
                self.batch_size //= 2  # back off and retry the same prompts
                self._prefix_cache.clear()
                torch.cuda.empty_cache()
                continue
            for i, result in zip(idx, batch_results, strict=True):
                results[i] = result
            if progress is not None:
                progress.update(len(idx))
            start += len(idx)
        yield from results  # type: ignore[misc]

    # ------------------------------------------------------------------ prompt pass
    def _prompt_pass(self, batch: Sequence[Sequence[int]], reuse_prefix: bool) -> _State:
        device = self.model.device
        n = len(batch)
        shared = _common_prefix_length(batch) if reuse_prefix and n > 1 else 0
        shared = min(shared, min(len(p) for p in batch) - 1)
        cache = None
        if shared >= MIN_SHARED_PREFIX:
            cache = copy.deepcopy(self._prefix_kv(tuple(batch[0][:shared])))
            cache.batch_repeat_interleave(n)
        else:
            shared = 0
        suffixes = [list(p[shared:]) for p in batch]
        ids, suffix_mask = left_pad(suffixes, self.model.tokenizer.pad_token_id)
        width = ids.shape[1]
        mask = torch.cat([torch.ones((n, shared), dtype=torch.bool), suffix_mask.bool()], dim=1)
        real = sum(len(s) for s in suffixes)
        self.stats.prompt_tokens += real
        self.stats.padding += n * width - real
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, shared:]
        out = self.model.hf.model(
            input_ids=ids,
            attention_mask=mask.long(),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        logp = self._log_softmax(out.last_hidden_state[:, -1])
        lengths = torch.tensor([len(p) for p in batch], device=device)
        return _State(out.past_key_values, mask, lengths, logp)

    def _prefix_kv(self, prefix: tuple[int, ...]) -> Any:
        """The KV cache of a shared prefix at batch size 1, kept for the next batches."""
        if prefix in self._prefix_cache:
            self._prefix_cache.move_to_end(prefix)
            return self._prefix_cache[prefix]
        ids = torch.tensor([prefix], device=self.model.device)
        self.stats.prompt_tokens += len(prefix)
        kv = self.model.hf.model(input_ids=ids, use_cache=True).past_key_values
        self._prefix_cache[prefix] = kv
        while len(self._prefix_cache) > 4:
            self._prefix_cache.popitem(last=False)
        return kv

    # ------------------------------------------------------------------ trie pass
    def _trie_pass(self, state: _State, epsilon: float) -> list[ScoreResult]:
        t = self._tables
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
        for depth in range(1, t.max_depth + 1):
            cand = t.levels[depth]
            p = logp_node[:, cand].exp()
            # Upper bound of the valid mass: answers already resolved + all mass still open.
            upper = self._answer_probs(logp_node, stop_logp).sum(-1) + p.sum(-1)
            keep = _prune(p, 0.5 * epsilon * upper - dropped)
            dropped += (p * ~keep).sum(-1)
            count = keep.sum(-1)
            width = int(count.max())
            if width == 0:
                break
            fed = int(count.sum())
            self.stats.trie_positions += fed
            self.stats.padding += n * width - fed
            # Compact kept candidates to the left: sel[b, k] = k-th kept node of row b.
            order = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[:, :width]
            sel = cand[order]
            valid = torch.arange(width, device=dev)[None, :] < count[:, None]
            past = visible.shape[1]
            rows = torch.arange(n, device=dev)[:, None].expand(n, width)
            column[rows[valid], sel[valid]] = (
                past + torch.arange(width, device=dev).expand(n, -1)[valid]
            )
            attend = self._tree_mask(visible, column, sel, valid, past)
            ids = torch.where(valid, t.token[sel], self.model.tokenizer.pad_token_id)
            positions = (state.lengths[:, None] + depth - 1).expand(n, width)
            out = self.model.hf.model(
                input_ids=ids,
                attention_mask=_additive(attend, self.model.dtype),
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            visible = torch.cat([visible, torch.zeros_like(valid)], dim=1)
            head_start = self._clock()
            self._expand(
                out.last_hidden_state[valid],
                rows[valid],
                sel[valid],
                logp_node,
                stop_logp,
                top_token,
            )
            self.stats.head_seconds += self._clock() - head_start
        return self._results(logp_node, stop_logp, top_token, dropped)

    def _tree_mask(self, visible, column, sel, valid, past) -> torch.Tensor:
        """Bool [n, 1, width, past + width]: prompt tokens, ancestors and the node itself."""
        n, width = sel.shape
        t = self._tables
        attend = visible[:, None, :].expand(n, width, past).clone()
        anc = t.ancestors[sel]  # [n, width, max_depth]
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
        t = self._tables
        for start in range(0, hidden.shape[0], HEAD_CHUNK):
            sl = slice(start, start + HEAD_CHUNK)
            logits = self._logits(hidden[sl])
            top, top_token[rows[sl], nodes[sl]] = logits.max(-1)
            child_tok = t.child_token[nodes[sl]]  # [k, max_children]
            child_logit = torch.gather(logits, 1, child_tok.clamp(min=0)).double()
            weights = logits.sub_(top[:, None]).exp_()  # in place: bounds the chunk's memory
            sums = vocabulary_sums(weights, self._sum_blocks).clamp(min=1e-300).log()
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
        probs = self._answer_probs(logp_node, stop_logp).cpu().numpy()
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
                argmax=greedy[row] if greedy[row] is not None else mode,
                mode=mode,
            )
            if self.answers.numeric and mass > 0:
                values = self.answers.values
                result.expected = float(norm @ values)
                result.std = float(np.sqrt(max(norm @ (values - result.expected) ** 2, 0.0)))
            results.append(result)
        return results

    def _answer_probs(self, logp_node, stop_logp) -> torch.Tensor:
        """Unnormalised P(answer) [n, answers] from the nodes resolved so far."""
        t = self._tables
        node_p = (logp_node[:, :, None] + stop_logp).exp()  # [n, nodes, rule]
        return node_p[:, :, DIGIT] @ t.terminal[DIGIT] + node_p[:, :, ALNUM] @ t.terminal[ALNUM]

    def _greedy(self, top_token: np.ndarray) -> list[str | None]:
        """Follow the most likely token from the root; the answer greedy decoding would give."""
        trie, ext = self.trie, self._ext
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
                    if token >= 0 and not bool(ext[trie.rules[a], token]):
                        answer = self.answers.answers[a]
                break
            out.append(answer)
        return out

    # ------------------------------------------------------------------ LM head
    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return lm_head(self.model, hidden)

    def _log_softmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float64 log-probs of the fp32 logits: the root normaliser is summed as the trie's is."""
        return self._logits(hidden).double().log_softmax(-1)


def lm_head(model: LoadedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head (and any final soft-capping) on the given positions only, in fp32 or wider
    (a float64 model keeps float64 logits, which the float64 references rely on)."""
    logits = model.hf.get_output_embeddings()(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    cap = getattr(model.hf.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def sum_blocks(columns: torch.Tensor) -> torch.Tensor:
    """Sum columns [vocab, c] as `vocabulary_sums` takes them: [blocks, SUM_BLOCK, c]."""
    vocab, c = columns.shape
    padded = columns.new_zeros(-(-vocab // SUM_BLOCK) * SUM_BLOCK, c)
    padded[:vocab] = columns
    return padded.view(-1, SUM_BLOCK, c)


def vocabulary_sums(weights: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Float64 [k, c]: `weights` [k, vocab] times the sum columns of `sum_blocks`.

    One fp32 matmul over the whole vocabulary loses its many tiny terms (the stop mass came out
    ~1e-4 relative too low, by an amount that depends on the BLAS kernel and the thread count);
    here the matmul sums only SUM_BLOCK terms at a time and the block sums are added in float64:
    within ~1e-6 of a float64 sum at about half the cost of computing one."""
    k, vocab = weights.shape
    n, size, _ = blocks.shape
    if n * size != vocab:
        weights = torch.nn.functional.pad(weights, (0, n * size - vocab))
    partial = torch.einsum("knb,nbc->knc", weights.view(k, n, size), blocks.to(weights.dtype))
    return partial.double().sum(1)


@dataclass
class _State:
    cache: Any
    mask: torch.Tensor  # bool [n, cached columns]: which cache columns are real prompt tokens
    lengths: torch.Tensor  # prompt lengths (the first trie token's position id)
    root_logp: torch.Tensor  # float64 [n, vocab] next-token log-probs after the prompt


@dataclass
class _TrieTables:
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
    def build(cls, trie: AnswerTrie, device: torch.device) -> _TrieTables:
        nodes = trie.nodes
        n, depth = len(nodes), trie.max_depth
        width = max(len(node.children) for node in nodes)
        ancestors = torch.full((n, max(depth, 1)), -1, dtype=torch.long)
        child_token = torch.full((n, width), -1, dtype=torch.long)
        child_index = torch.full((n, width), -1, dtype=torch.long)
        terminal = [torch.zeros(n, len(trie.answers), dtype=torch.float64) for _ in range(2)]
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


def _batch_order(prompts: Sequence[Sequence[int]], batch_size: int) -> list[int]:
    """Lexicographic order puts prompts with shared prefixes together; within each block of a few
    batches, sorting by length then keeps left padding small."""
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    block = 4 * batch_size
    return [
        i
        for start in range(0, len(order), block)
        for i in sorted(order[start : start + block], key=lambda i: len(prompts[i]))
    ]


def _prune(p: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """Keep mask: drop the smallest candidates while their summed mass fits in the budget."""
    sorted_p, order = p.sort(dim=-1)
    drop_sorted = (sorted_p.cumsum(-1) <= budget[:, None]) | (sorted_p == 0)
    keep = torch.ones_like(p, dtype=torch.bool)
    keep.scatter_(1, order, ~drop_sorted)
    return keep


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, torch.finfo(dtype).min)


def _common_prefix_length(batch: Sequence[Sequence[int]]) -> int:
    first = batch[0]
    length = min(len(p) for p in batch)
    for other in batch[1:]:
        k = 0
        while k < length and other[k] == first[k]:
            k += 1
        length = k
    return length
