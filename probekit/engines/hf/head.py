"""The LM head on the positions that are read, in its tier's arithmetic, and float64-accurate
sums over the vocabulary.

Every trie node's distribution needs two numbers from the whole vocabulary: its normaliser and,
per answer rule, the stop mass (the probability of a token that does not extend the answer).
`VocabularyColumns` holds both as columns of one matrix, and `vocabulary_sums` computes them in
fp32 blocks added in float64.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from probekit.engines.base import HookableModel
from probekit.engines.hf.precision import NARROW, tf32_matmuls
from probekit.engines.options import dtype_name
from probekit.engines.trie import extension_masks

HEAD_CHUNK = 256  # the fewest rows of the LM head computed at once
SUM_BLOCK = 128  # vocabulary entries per partial sum of `vocabulary_sums`


def head_rows(batch: int) -> int:
    """Rows of the LM head the trie pass computes at once for a batch of `batch` prompts: half
    of them, at least HEAD_CHUNK. The memory plan (`engines/plan.py`) keeps 12 bytes a
    vocabulary entry for each prompt; the root's float64 log-probs hold 8 of them through the
    trie pass, and a chunk's float32 logits (4 bytes an entry) are copied once by
    `vocabulary_sums`."""
    return max(HEAD_CHUNK, batch // 2)


def vocabulary_size(model: HookableModel) -> int:
    """Rows of the LM head (can exceed the tokenizer's vocabulary: padded embeddings)."""
    return int(model.hf.get_output_embeddings().weight.shape[0])


def parameter_split(model: HookableModel) -> tuple[int, int]:
    """Weights of the transformer body (embeddings excluded) and of the LM head: the
    multiply-adds per position of a prompt token (body) and of a trie node (body + head)."""
    embedding = model.hf.get_input_embeddings().weight
    head = model.hf.get_output_embeddings().weight
    body = sum(p.numel() for p in model.hf.parameters() if p is not embedding and p is not head)
    return int(body), int(head.numel())


def lm_head(model: HookableModel, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head (and any final soft-capping) on the given positions only, as float32 logits
    (float64 for a float64 model, which the float64 references rely on) on `model.device` (a
    dispatched model's head may sit on another device), in the head arithmetic of the model's
    precision tier (`meta["head"]`, set by `precision.apply_tier`; float32 when not set):

    - `float32`: the head's weights as loaded; a hidden state in a narrower dtype than them (a
      bfloat16 body under the TransformerLens bridge, whose final norm is its own) is widened;
    - `tf32`: the same float32 weights, the product's inputs in TF32;
    - `float16` or `bfloat16`: the hidden state rounded to the head's 16-bit weights, the products
      summed and returned in float32 (`narrow_linear`); weights widened since (the noise
      figure's reference, `precision.as_dtype`) are used as the first case."""
    head = model.hf.get_output_embeddings()
    arithmetic = model.meta.get("head", "float32")
    if arithmetic in NARROW and dtype_name(head.weight.dtype) == arithmetic:  # not widened
        logits = narrow_linear(hidden, head.weight, head.bias)
    else:
        wide = torch.promote_types(hidden.dtype, head.weight.dtype)  # a float32 head, bf16 body
        tf32 = tf32_matmuls(model.device) if arithmetic == "tf32" else contextlib.nullcontext()
        with tf32:
            logits = head(hidden.to(wide))
    logits = logits.to(model.device)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    cap = getattr(model.hf.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def node_terms(
    model: HookableModel,
    columns: VocabularyColumns,
    hidden: torch.Tensor,
    child_token: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The LM head on hidden states [k, d_model] read as trie nodes: float64 [k, 3 + children],
    log Z, the log stop sums of both rules and the logits of the `child_token` columns, each less
    the row's largest logit; and each row's most likely token.

    One pass over the vocabulary per row: exp(logits - max) times a matrix whose columns are all
    ones and the "does not extend" masks gives the normaliser and the stop mass of both rules at
    once (`vocabulary_sums`, accurate to a float64 sum). The max is a constant shift (no
    gradient); outside autograd the exponentials overwrite the logits, bounding the memory."""
    logits = lm_head(model, hidden)
    top, token = logits.max(-1)
    top = top.detach()[:, None]
    children = torch.gather(logits, 1, child_token).double() - top.double()
    weights = (logits - top).exp() if torch.is_grad_enabled() else logits.sub_(top).exp_()
    sums = vocabulary_sums(weights, columns.blocks).clamp(min=1e-300).log()
    return torch.cat([sums, children], dim=1), token


def narrow_linear(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`hidden @ weight.T (+ bias)` in float32 from `hidden` rounded to the 16-bit dtype of
    `weight`: the products of two 16-bit values are exact in float32 and summed there, as a
    tensor core does. On CUDA one 16-bit GEMM with a float32 output (`torch.mm(out_dtype=)`);
    elsewhere the same arithmetic emulated in float32, so the CPU measures what a GPU computes
    (up to the order of the sums)."""
    flat = hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype)
    if flat.device.type == "cuda":
        logits = torch.mm(flat, weight.T, out_dtype=torch.float32)
    else:
        logits = flat.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    return logits.view(*hidden.shape[:-1], -1)


def log_probs(model: HookableModel, hidden: torch.Tensor) -> torch.Tensor:
    """Float64 next-token log-probs of the fp32 logits (normalised as the trie's nodes are)."""
    return lm_head(model, hidden).double().log_softmax(-1)


@dataclass
class VocabularyColumns:
    """Which tokens extend an answer, and the columns `vocabulary_sums` multiplies by."""

    extends: torch.Tensor  # bool [rules, vocab]: the token extends an answer under that rule
    blocks: torch.Tensor  # [blocks, SUM_BLOCK, 1 + rules]: ones, then "does not extend"

    @classmethod
    def build(cls, model: HookableModel) -> VocabularyColumns:
        extends = extension_masks(model.tokenizer, vocabulary_size(model)).to(model.device)
        stop = (~extends).T.float()
        columns = torch.cat([torch.ones_like(stop[:, :1]), stop], dim=1)
        padded = torch.nn.functional.pad(columns, (0, 0, 0, -columns.shape[0] % SUM_BLOCK))
        return cls(extends, padded.view(-1, SUM_BLOCK, columns.shape[1]))


def vocabulary_sums(weights: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Float64 [k, c]: `weights` [k, vocab] times the blocked sum columns `blocks`
    (`VocabularyColumns.blocks`).

    One fp32 matmul over the whole vocabulary loses its many tiny terms (the stop mass came out
    ~1e-4 relative too low, by an amount that depends on the BLAS kernel and the thread count);
    here the matmul sums only SUM_BLOCK terms at a time and the block sums are added in float64:
    within ~1e-6 of a float64 sum at about half the cost of computing one."""
    k, vocab = weights.shape
    n, size, _ = blocks.shape
    if n * size != vocab:
        weights = torch.nn.functional.pad(weights, (0, n * size - vocab))
    partial = torch.einsum("knb,nbc->knc", weights.view(k, n, size), blocks.to(weights.dtype))
    return partial.double().sum(1)
