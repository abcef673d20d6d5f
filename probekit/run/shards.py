"""Shards of a run: which prompt indices one process scores (`--shard i/n`, or one rank of a
`torchrun` / `accelerate launch`, which subdivides it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Shard:
    """This process's share of the prompts: those with `index % count == index_`."""

    index: int = 0
    count: int = 1

    def split(self, rank: int, world: int) -> Shard:
        """Subdivide this shard among the `world` processes of a distributed launch."""
        return Shard(self.index * world + rank, self.count * world)

    def owns(self, prompt_index: int) -> bool:
        return prompt_index % self.count == self.index

    def mask(self, total: int) -> np.ndarray:
        """A boolean per prompt index of a probe of `total` prompts: True for this shard's."""
        return np.arange(total) % self.count == self.index

    def owns_all(self, indices: np.ndarray) -> bool:
        return bool(np.all(indices % self.count == self.index))


WHOLE = Shard()
"""The whole run: one process scores every prompt."""
