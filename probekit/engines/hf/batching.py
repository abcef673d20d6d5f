"""Batches for the scorer: how many prompts a batch holds (on an accelerator, the largest the
memory plan says fits, counted in tokens), prompts that share prefixes and lengths go together,
and a batch that runs out of CUDA memory is retried at half the size."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from probekit.engines.devices import device_memory
from probekit.engines.hf.precision import dtype_name
from probekit.engines.plan import batch_for, shape_of

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel

CPU_BATCH = 16
"""Prompts a batch on a CPU or MPS, where the memory plan has no device size to fill (the
scorer's default there since its first version)."""
DISPATCHED_BATCH = 64
"""Prompts a batch of a model dispatched over several devices by a device map (the plan of one
device does not apply; the out-of-memory back-off still does)."""
PROMPT_HINT = 128
"""Prompt tokens a scorer plans its first batch for, before it has seen a prompt; each window of
prompts is planned again for its longest prompt."""


def planned_batch(model: HFModel, tokens: int) -> int:
    """Prompts a batch of `model` holds when each prompt takes `tokens` positions (prompt, answer
    trie and generated tokens): on a CUDA device holding the whole model, the largest the memory
    plan says fits beside its weights (`probekit.engines.memory.batch_for`, counted in tokens from
    the model's shape and the device's memory); `DISPATCHED_BATCH` for a dispatched model,
    `CPU_BATCH` elsewhere."""
    if model.device.type != "cuda":
        return CPU_BATCH
    if model.dispatched:
        return DISPATCHED_BATCH
    shape = shape_of(model.hf, model.name)
    return batch_for(shape, dtype_name(model.dtype), device_memory(model.device), tokens)


def batch_order(prompts: Sequence[Sequence[int]], batch_size: int) -> list[int]:
    """Lexicographic order puts prompts with shared prefixes together; within each block of a few
    batches, sorting by length then keeps left padding small."""
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    block = 4 * batch_size
    return [
        i
        for start in range(0, len(order), block)
        for i in sorted(order[start : start + block], key=lambda i: len(prompts[i]))
    ]


def run_batched(
    prompts: list[Sequence[int]],
    run: Callable[[list[Sequence[int]]], list[Any]],
    batch_size: int,
    progress: Any = None,
    shrink: Callable[[int], None] | None = None,
) -> Iterator[Any]:
    """`run` on `batch_order` batches of the prompts, its outputs in input order. On CUDA
    out-of-memory the batch size halves (`shrink(new_size)` is told, to keep it and free what it
    holds) and the same prompts are tried again; at batch size 1 the error is raised."""
    order = batch_order(prompts, batch_size)
    results: list[Any] = [None] * len(prompts)
    start = 0
    while start < len(order):
        idx = order[start : start + batch_size]
        try:
            batch_results = run([prompts[i] for i in idx])
        except torch.cuda.OutOfMemoryError:
            if batch_size == 1:
                raise
            batch_size //= 2
            if shrink is not None:
                shrink(batch_size)
            torch.cuda.empty_cache()
            continue
        for i, result in zip(idx, batch_results, strict=True):
            results[i] = result
        if progress is not None:
            progress.update(len(idx))
        start += len(idx)
    yield from results
