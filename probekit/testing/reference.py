"""Slow reference scorers: every answer scored as its own full continuation.

`brute_force` applies the same definition as the engine (every surface form, as written and
space-prefixed, times the stop probability) with one uncached forward per answer variant: it is the
ground truth the tests compare against. `shared_prefix` gives the same numbers the way serving
engines score a choice (SGLang's `select` on a RadixAttention prefix cache): the prompt once, every
candidate continuation batched against its KV cache — the strongest peer of the exact engine.
`candidate_loglik` is the lm-eval-harness style baseline (the log-likelihood of each answer as a
continuation, no stop probability). `generate_greedy` is transformers' own `generate`, the
reference for the scorer's decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from probekit.core.answers import AnswerSet
from probekit.core.padding import left_pad, positions
from probekit.engines.hf import cache as kv
from probekit.engines.hf.forward import body
from probekit.engines.hf.head import lm_head, vocabulary_size
from probekit.engines.hf.model import LoadedModel
from probekit.engines.trie import AnswerTrie, answer_variants, extension_masks

GREEDY = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
"""transformers' `generate` settings for plain greedy decoding, whatever sampling defaults the
model's generation config carries."""


@torch.inference_mode()
def brute_force(
    model: LoadedModel, prompt: Sequence[int], answers: AnswerSet, batch_size: int = 32
) -> np.ndarray:
    """Unnormalised P(answer) for every answer of the set (float64).

    Each (answer, tokenization) is its own right-padded sequence, read with no cache and no trie.
    """
    tok = model.tokenizer
    seqs, stops = _variants(model, answers)
    out = np.zeros(len(answers))
    start = len(prompt) - 1  # position whose logits predict the first answer token
    for first in range(0, len(seqs), batch_size):
        chunk = seqs[first : first + batch_size]
        rows = [torch.tensor([*prompt, *tokens]) for _, tokens in chunk]
        ids = pad_sequence(rows, batch_first=True, padding_value=tok.pad_token_id)
        mask = pad_sequence([torch.ones_like(row) for row in rows], batch_first=True)
        hidden, _ = body(model, ids.to(model.device), mask.to(model.device))
        for row, (a, tokens) in enumerate(chunk):
            k = len(tokens)
            needed = hidden[row, start : start + k + 1]  # the LM head only where it is read
            logp = lm_head(model, needed).double().log_softmax(-1).cpu()
            out[a] += _probability(logp, tokens, stops[a])
    return out


def _variants(
    model: LoadedModel, answers: AnswerSet
) -> tuple[list[tuple[int, list[int]]], list[torch.Tensor]]:
    """Every (answer, tokens of one of its surface forms), and each answer's stop mask: the
    tokens that would extend it (the trie's rule for it)."""
    tok = model.tokenizer
    rules = AnswerTrie.build(answers, tok).rules
    ext = extension_masks(tok, vocabulary_size(model))
    seqs = [(a, list(v)) for a in range(len(answers)) for v in answer_variants(answers, a, tok)]
    return seqs, [ext[rule] for rule in rules]


def _probability(logp: torch.Tensor, tokens: list[int], extends: torch.Tensor) -> float:
    """P(`tokens`, then a stop) from log-probabilities [k + 1, vocabulary]: row i predicts
    token i, row k the stop (every token but those that extend the answer, `extends`)."""
    k = len(tokens)
    total = logp[torch.arange(k), torch.tensor(tokens)].sum()
    stop = logp[k].masked_fill(extends, -torch.inf).logsumexp(-1)
    return float((total + stop).exp())


@torch.inference_mode()
def shared_prefix(
    model: LoadedModel, prompt: Sequence[int], answers: AnswerSet, batch_size: int = 64
) -> np.ndarray:
    """Unnormalised P(answer) as `brute_force` defines it (float64), with the prompt computed
    once: its KV cache is shared by every candidate (each surface form's tokens, right-padded),
    `batch_size` candidates per forward, and the LM head read only where a probability is."""
    tok = model.tokenizer
    seqs, stops = _variants(model, answers)
    device, n = model.device, len(prompt)
    hidden, prompt_kv = body(model, torch.tensor([list(prompt)], device=device))
    root = lm_head(model, hidden[0, -1:]).double().log_softmax(-1).cpu()
    out = np.zeros(len(answers))
    for start in range(0, len(seqs), batch_size):
        chunk = seqs[start : start + batch_size]
        rows = [torch.tensor(tokens) for _, tokens in chunk]
        ids = pad_sequence(rows, batch_first=True, padding_value=tok.pad_token_id)
        width = ids.shape[1]
        cache = kv.copy_of(prompt_kv)
        kv.repeat_rows(cache, len(chunk))
        hidden, _ = body(  # right padding: a candidate never attends to its padding
            model,
            ids.to(device),
            torch.ones((len(chunk), n + width), dtype=torch.long, device=device),
            torch.arange(n, n + width, device=device).expand(len(chunk), -1),
            cache,
        )
        read = torch.cat([hidden[row, : len(tokens)] for row, (_, tokens) in enumerate(chunk)])
        logps = lm_head(model, read).double().log_softmax(-1).cpu()
        at = 0
        for a, tokens in chunk:
            k = len(tokens)
            logp = torch.cat([root, logps[at : at + k]])  # predicts tokens 1..k, then the stop
            at += k
            out[a] += _probability(logp, tokens, stops[a])
    return out


@torch.inference_mode()
def candidate_loglik(
    model: LoadedModel, prompt: Sequence[int], answers: AnswerSet, batch_size: int = 16
) -> np.ndarray:
    """Log-likelihood of each answer's canonical tokens as a continuation, batched per answer."""
    tok = model.tokenizer
    conts = [tok.encode(a, add_special_tokens=False) for a in answers.answers]
    out = np.zeros(len(answers))
    for start in range(0, len(conts), batch_size):
        chunk = conts[start : start + batch_size]
        ids, mask = left_pad([list(prompt) + cont for cont in chunk], tok.pad_token_id)
        width = ids.shape[1]
        logits = model.hf(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            position_ids=positions(mask).to(model.device),
        ).logits
        logp = logits.float().log_softmax(-1).cpu()
        for row, cont in enumerate(chunk):
            cols = torch.arange(width - len(cont) - 1, width - 1)
            out[start + row] = float(logp[row, cols, torch.tensor(cont)].sum())
    return out


@torch.inference_mode()
def generate_greedy(
    model: LoadedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int = 16
) -> list[str]:
    """Greedy continuations of left-padded token-id prompts, decoded without special tokens."""
    tok = model.tokenizer
    ids, mask = left_pad(prompts, tok.pad_token_id, model.device)
    width = ids.shape[1]
    settings = {**GREEDY, "max_new_tokens": max_new_tokens, "pad_token_id": tok.pad_token_id}
    out = model.hf.generate(input_ids=ids, attention_mask=mask, **settings)
    return tok.batch_decode(out[:, width:], skip_special_tokens=True)
