"""The few operations the scorer needs on a transformers KV cache, in one place.

Their names and semantics move between transformers releases (`crop` took an absolute length,
then a negative count of tokens to remove); nothing outside this module calls a cache method.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


def truncate(cache: Any, length: int) -> None:
    """Keep the first `length` cached columns (drop what later forwards appended)."""
    cache.crop(length - cache.get_seq_length())


def select_rows(cache: Any, index: torch.Tensor) -> None:
    """Keep only the batch rows `index`, in that order (in place). The cache of a model
    dispatched over several GPUs lives on each layer's device, so the index goes by the CPU,
    from which every device can read it."""
    layers = getattr(cache, "layers", [])
    devices = {layer.keys.device for layer in layers if getattr(layer, "keys", None) is not None}
    cache.batch_select_indices(index.cpu() if len(devices) > 1 else index)


def repeat_rows(cache: Any, times: int) -> None:
    """Repeat every batch row `times` times (a batch-1 cache becomes a batch of `times`)."""
    cache.batch_repeat_interleave(times)


def copy_of(cache: Any) -> Any:
    """An independent copy, so that in-place operations leave `cache` as it is."""
    return copy.deepcopy(cache)
