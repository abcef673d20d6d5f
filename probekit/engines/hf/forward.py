"""The transformer body's forward (without the LM head) and the clock that times it.

Every pass of the scorer (prompt, shared prefix, trie depth, decoding step) is one call of
`body`: the hidden states of all positions and the KV cache, which the caller extends. The LM
head runs separately (`head.py`), only on the positions whose distribution is read. The body
runs in the model's precision tier (`tiers.arithmetic`: TF32 matmuls when that tier was chosen).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from probekit.engines.hf.tiers import arithmetic

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel


def body(
    model: HFModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
) -> tuple[torch.Tensor, Any]:
    """Last-layer hidden states [rows, positions, d_model] on `model.device` and the cache, with
    `cache` (if given) extended by these positions. `attention_mask` is either a 0/1 mask over
    the cached and new columns, or an additive 4-D mask (`attention.additive_mask`). On a model
    dispatched over several devices each layer runs (and keeps its cache) where it was put, and
    the last layer's output comes back to the first layer's device."""
    with arithmetic(model):
        out = model.hf.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
    return out.last_hidden_state.to(model.device), out.past_key_values


def clock(device: torch.device) -> float:
    """Wall seconds, after the device's queued work is done (so each phase times its own)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()
