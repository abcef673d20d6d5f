"""Memory arithmetic on a model's shape: the bytes of its weights, and per token of a batch its KV
cache (2 x layers x key/value heads x head width) and the forward's working activations (4 x
width + 2 x MLP width); per prompt the float32 logits and float64 log-probabilities of the
answer position. The batch is counted in tokens: the largest of `BATCH_SIZES` whose prompts
(prompt length plus answer positions) fit beside the weights. A capture's activations (one site
at every layer, float32, every position at most) are counted apart: they are copied to host
memory as each batch is read, so they do not count against the device."""

from __future__ import annotations

from collections.abc import Mapping

from probekit.core.errors import ProbekitError
from probekit.engines.shapes import Shape

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
USABLE_SHARE = 0.9
"""Share of a device's memory the plan fills (the rest: the CUDA context, allocator slack)."""
PROMPT_TOKENS = 512
"""Prompt length the load-time check plans a batch for (`probekit plan --prompt-tokens`)."""
MAX_BATCH = 2048
"""The largest batch the plan gives: beyond it a GPU's throughput no longer grows (benchmarks/gpu.py
sweeps it), and the scorer's window of prompts stays several batches long."""
BATCH_SIZES = tuple(MAX_BATCH >> k for k in range(MAX_BATCH.bit_length()))
"""Batch sizes the plan tries, largest first: the powers of two from `MAX_BATCH` down to 1 (the
scorer halves a batch that runs out of memory)."""
FP32_MEMORY_SHARE = 0.5
"""An accelerator runs a model in float32 by default when its float32 weights take at most this
share of its memory (the rest holds the KV caches of the prompt and trie passes)."""
LOGIT_BYTES = 12
"""Bytes per vocabulary entry of a prompt's answer position: float32 logits, float64
log-probabilities."""


def weight_bytes(shape: Shape, dtype: str) -> int:
    """The weights: parameters x the bytes of `dtype`."""
    return shape.parameters * DTYPE_BYTES[dtype]


def kv_bytes(shape: Shape, dtype: str) -> int:
    """KV cache of one token: 2 (key, value) x layers x key/value heads x head width."""
    return 2 * shape.layers * shape.kv_heads * shape.head_width * DTYPE_BYTES[dtype]


def work_bytes(shape: Shape, dtype: str) -> int:
    """The forward's working activations of one token: 4 x width + 2 x MLP width."""
    return (4 * shape.width + 2 * shape.mlp_width) * DTYPE_BYTES[dtype]


def token_bytes(shape: Shape, dtype: str) -> int:
    """Device memory of one token of a prompt in a batch: its KV cache and working activations."""
    return kv_bytes(shape, dtype) + work_bytes(shape, dtype)


def prompt_bytes(shape: Shape, dtype: str, tokens: int) -> int:
    """Device memory of one prompt of `tokens` tokens in a batch: its tokens', and its answer
    position's float32 logits and float64 log-probabilities."""
    return tokens * token_bytes(shape, dtype) + LOGIT_BYTES * shape.vocabulary


def capture_bytes(shape: Shape, tokens: int) -> int:
    """Host memory of one prompt's capture: one site at every layer, float32, every position."""
    return tokens * shape.layers * shape.width * 4


def longest_prompt(shape: Shape, dtype: str, room: float) -> int:
    """The most tokens one prompt may have in `room` bytes (0 or less: not even the logits fit)."""
    return int((room - LOGIT_BYTES * shape.vocabulary) // token_bytes(shape, dtype))


def largest_batch(room: float, per_prompt: int, batch_size: int | None = None) -> int:
    """The largest of `BATCH_SIZES` (or just `batch_size`) whose prompts of `per_prompt` bytes
    each fit in `room` bytes; 0 when none does."""
    tried = (batch_size,) if batch_size else BATCH_SIZES
    return next((b for b in tried if b * per_prompt <= room), 0)


def batch_for(shape: Shape, dtype: str, memory: int, tokens: int) -> int:
    """The batch the exact scorer starts from on one accelerator of `memory` bytes holding the
    whole model: the largest of `BATCH_SIZES` whose prompts of `tokens` tokens (prompt, answer
    positions and any generated tokens) fit beside the weights in `USABLE_SHARE` of it (at
    least 1: the scorer halves it again on out-of-memory)."""
    room = memory * USABLE_SHARE - weight_bytes(shape, dtype)
    return max(1, largest_batch(room, prompt_bytes(shape, dtype, tokens)))


def plan_dtype(shape: Shape, sizes: Mapping[str, int], dtype: str | None) -> str:
    """`dtype` by its name, else the policy's pick: float32 on the CPU and where its weights
    take at most `FP32_MEMORY_SHARE` of the first accelerator, else bfloat16."""
    if dtype is None:
        first = next((b for d, b in sizes.items() if d != "cpu"), None)
        fits = first is None or 4 * shape.parameters <= FP32_MEMORY_SHARE * first
        dtype = "float32" if fits else "bfloat16"
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(
        dtype, dtype
    )
    if dtype not in DTYPE_BYTES:
        raise ProbekitError(f"unknown dtype '{dtype}'; use {', '.join(DTYPE_BYTES)}")
    return dtype
