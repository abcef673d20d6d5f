"""The transformer body's forward (without the LM head) and the clock that times it.

Every pass of the scorer (prompt, shared prefix, trie depth, decoding step) is one call of
`body`: the hidden states of all positions and the KV cache, which the caller extends. The LM
head runs separately (`head.py`), only on the positions whose distribution is read. The body
runs in the model's precision tier (`precision.arithmetic`: TF32 matmuls in a TF32 tier).
`clock` times a phase of a batch (it waits for the device); `Stopwatch` times spans inside the
trie levels without waiting for it.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from probekit.engines.base import HookableModel
from probekit.engines.hf.precision import arithmetic


def body(
    model: HookableModel,
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


class Stopwatch:
    """Seconds of device work inside marked spans, read once when the batch is done (`seconds`).

    On CUDA each span is a pair of recorded events, which does not wait for the device (`clock`
    would, and the trie pass reads nothing from the device inside its levels); elsewhere the
    host's clock, since the work runs as it is issued."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[Any] = []  # each span's start and end, in turn

    def mark(self) -> None:
        """Start a span, or end the one started."""
        if not self.cuda:
            self._marks.append(time.perf_counter())
            return
        self._marks.append(torch.cuda.Event(enable_timing=True))
        self._marks[-1].record()

    def seconds(self) -> float:
        """The spans' total (on CUDA, after the last span's work is done)."""
        spans = list(zip(self._marks[::2], self._marks[1::2], strict=True))
        if not self.cuda:
            return sum(end - begin for begin, end in spans)
        if spans:
            spans[-1][1].synchronize()
        return sum(begin.elapsed_time(end) for begin, end in spans) / 1000
