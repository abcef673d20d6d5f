"""The prompt pass and what continues from it: a batch of token-id prompts through the model
once, left-padded, the shared prefix (if long enough) taken from the prefix cache, the LM head on
the last position only; then, in generate mode, the decoding of every row.

`PrefixCache` keeps the KV caches of recently seen shared prompt prefixes (a persona's system
prompt, a template's head), computed once at batch size 1 and reused by the next batches that
share them. `decode` continues every prompt greedy or sampled until the row's stop rule holds:
the same continuation `transformers`' `generate` gives, without its padding of finished rows (a
finished row leaves the batch and its cache rows are dropped)."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from probekit.core.padding import left_pad
from probekit.engines.base import HookableModel, ScorerStats
from probekit.engines.hf import cache as kv
from probekit.engines.hf.forward import body
from probekit.engines.hf.head import log_probs

MIN_SHARED_PREFIX = 8  # tokens; shorter shared prefixes are not worth a separate forward
KEPT = 4  # prefixes kept, least recently used dropped first


class PrefixCache:
    """Least-recently-used KV caches of token prefixes; treat what `get` returns as read-only."""

    def __init__(self, model: HookableModel) -> None:
        self.model = model
        self._kept: OrderedDict[tuple[int, ...], Any] = OrderedDict()

    def get(self, prefix: tuple[int, ...], stats: ScorerStats) -> Any:
        """The batch-1 KV cache of `prefix`, computed on a miss (counted in `prompt_tokens`)."""
        if prefix in self._kept:
            self._kept.move_to_end(prefix)
            return self._kept[prefix]
        ids = torch.tensor([prefix], device=self.model.device)
        stats.prompt_tokens += len(prefix)
        _, self._kept[prefix] = body(self.model, ids)
        while len(self._kept) > KEPT:
            self._kept.popitem(last=False)
        return self._kept[prefix]

    def clear(self) -> None:
        self._kept.clear()


@dataclass
class PromptState:
    """What the trie pass and decoding continue from, one row per prompt."""

    cache: Any  # the KV cache of the prompt columns
    mask: torch.Tensor  # bool [n, cached columns]: which cache columns are real prompt tokens
    lengths: torch.Tensor  # prompt lengths (the first trie token's position id)
    root_logp: torch.Tensor  # float64 [n, vocab] next-token log-probs after the prompt

    def rows(self, index: torch.Tensor) -> PromptState:
        """The rows `index` of this state, on a copy of the cache (this state stays whole)."""
        cache = kv.copy_of(self.cache)
        kv.select_rows(cache, index)
        return PromptState(cache, self.mask[index], self.lengths[index], self.root_logp[index])


def prompt_pass(
    model: HookableModel,
    batch: Sequence[Sequence[int]],
    prefixes: PrefixCache,
    stats: ScorerStats,
    reuse_prefix: bool = True,
) -> PromptState:
    """Run `batch`, reusing a shared prefix of at least MIN_SHARED_PREFIX tokens when
    `reuse_prefix`; without reuse, row r's position p sits at column
    `width - len(batch[r]) + p` of the cache."""
    device = model.device
    n = len(batch)
    shared = len(os.path.commonprefix([list(p) for p in batch])) if reuse_prefix and n > 1 else 0
    shared = min(shared, min(len(p) for p in batch) - 1)
    cache = None
    if shared >= MIN_SHARED_PREFIX:
        cache = kv.copy_of(prefixes.get(tuple(batch[0][:shared]), stats))
        kv.repeat_rows(cache, n)
    else:
        shared = 0
    suffixes = [list(p[shared:]) for p in batch]
    ids, suffix_mask = left_pad(suffixes, model.tokenizer.pad_token_id)
    width = ids.shape[1]
    mask = torch.cat([torch.ones((n, shared), dtype=torch.bool), suffix_mask.bool()], dim=1)
    real = sum(len(s) for s in suffixes)
    stats.prompt_tokens += real
    stats.padding += n * width - real
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, shared:]
    hidden, cache = body(model, ids, mask.long(), positions, cache)
    logp = log_probs(model, hidden[:, -1])
    lengths = torch.tensor([len(p) for p in batch], device=device)
    return PromptState(cache, mask, lengths, logp)


def stop_ids(model: HookableModel) -> set[int]:
    """The end-of-sequence ids a continuation stops at (the model's generation config)."""
    eos = model.hf.generation_config.eos_token_id
    return {eos} if isinstance(eos, int) else set(eos or [])


def decode(
    model: HookableModel,
    state: PromptState,
    max_new_tokens: int,
    settled: Callable[[str], bool] | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """The continuation of every row of `state` (token ids; consumes its cache), one token per
    step for the rows still running: greedy, or sampled at `temperature` > 0 from `generator`.
    A row stops at end of sequence (its tokens end with that token), once `settled(its text so
    far)` holds, or at `max_new_tokens`."""
    stops, text = stop_ids(model), model.tokenizer.decode
    out: list[list[int]] = [[] for _ in range(state.mask.shape[0])]
    rows = list(range(len(out)))  # result row of each batch row still running
    mask, lengths, cache = state.mask.long(), state.lengths, state.cache
    token = next_token(state.root_logp, temperature, generator)
    for step in range(1, max_new_tokens + 1):
        for row, t in zip(rows, token.tolist(), strict=True):
            out[row].append(t)
        keep = [
            k
            for k, row in enumerate(rows)
            if step < max_new_tokens
            and out[row][-1] not in stops
            and not (settled is not None and settled(text(out[row], skip_special_tokens=True)))
        ]
        if not keep:
            break
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=mask.device)
            kv.select_rows(cache, index)
            rows = [rows[k] for k in keep]
            mask, lengths, token = mask[index], lengths[index], token[index]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        position = (lengths + step - 1)[:, None]
        hidden, cache = body(model, token[:, None], mask, position, cache)
        token = next_token(log_probs(model, hidden[:, -1]), temperature, generator)
    return out


def next_token(
    logp: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The greedy token of each row, or one sampled at `temperature` from `generator`."""
    if temperature == 0:
        return logp.argmax(-1)
    probs = (logp / temperature).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
