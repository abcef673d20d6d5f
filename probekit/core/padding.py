"""The one left-padded batch builder: token-id lists -> ids and attention mask, right-aligned.

Left padding puts every prompt's last token in the last column, where the next token is read.
Position p of a prompt of length n sits at column `width - n + p`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [n, width] long, mask [n, width] long, 1 on real tokens) for the given sequences."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: 0 at each row's first real token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)
