"""The prompt pass: a batch of token-id prompts through the model once, left-padded, the shared
prefix (if long enough) taken from the prefix cache; the LM head on the last position only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from probekit.core.padding import left_pad
from probekit.engines.base import ScorerStats
from probekit.engines.hf import cache as kv
from probekit.engines.hf.forward import body
from probekit.engines.hf.head import log_probs
from probekit.engines.hf.prefix_cache import MIN_SHARED_PREFIX, PrefixCache

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel


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
    model: HFModel,
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
    shared = common_prefix_length(batch) if reuse_prefix and n > 1 else 0
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


def common_prefix_length(batch: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt of `batch` starts with."""
    first = batch[0]
    length = min(len(p) for p in batch)
    for other in batch[1:]:
        k = 0
        while k < length and other[k] == first[k]:
            k += 1
        length = k
    return length
