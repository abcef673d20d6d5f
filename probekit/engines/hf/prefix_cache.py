"""The KV caches of recently seen shared prompt prefixes (a persona's system prompt, a template's
head), computed once at batch size 1 and reused by the next batches that share them."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import torch

from probekit.engines.base import ScorerStats
from probekit.engines.hf.forward import body

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel

MIN_SHARED_PREFIX = 8  # tokens; shorter shared prefixes are not worth a separate forward
KEPT = 4  # prefixes kept, least recently used dropped first


class PrefixCache:
    """Least-recently-used KV caches of token prefixes; treat what `get` returns as read-only."""

    def __init__(self, model: HFModel) -> None:
        self.model = model
        self._kept: OrderedDict[tuple[int, ...], Any] = OrderedDict()

    def get(self, prefix: tuple[int, ...], stats: ScorerStats) -> Any:
        """The batch-1 KV cache of `prefix`, computed on a miss (counted in `prompt_tokens`)."""
        if prefix in self._kept:
            self._kept.move_to_end(prefix)
            return self._kept[prefix]
        ids = torch.tensor([prefix], device=self.model.device)
        stats.prompt_tokens += len(prefix)
        _, kv = body(self.model, ids)
        self._kept[prefix] = kv
        while len(self._kept) > KEPT:
            self._kept.popitem(last=False)
        return kv

    def clear(self) -> None:
        self._kept.clear()
