"""Decoding: continue every prompt from its prompt pass, greedy or sampled, until the row's stop
rule holds. The same continuation `transformers`' `generate` gives, without its padding of
finished rows: a finished row leaves the batch and its cache rows are dropped."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from probekit.engines.hf import cache as kv
from probekit.engines.hf.forward import body
from probekit.engines.hf.head import log_probs
from probekit.engines.hf.prompt_pass import PromptState

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel


def decode(
    model: HFModel,
    state: PromptState,
    max_new_tokens: int,
    settled: Callable[[str], bool] | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """The continuation of every row of `state` (token ids; consumes its cache), one token per
    step for the rows still running: greedy, or sampled at `temperature` > 0 from `generator`.
    A row stops at end of sequence (its tokens end with that token), once `settled(its text so
    far)` holds, or at `max_new_tokens`."""
    eos = model.hf.generation_config.eos_token_id
    stops = {eos} if isinstance(eos, int) else set(eos or [])
    text = model.tokenizer.decode
    out: list[list[int]] = [[] for _ in range(state.mask.shape[0])]
    rows = list(range(len(out)))  # result row of each batch row still running
    mask, lengths, cache = state.mask.long(), state.lengths, state.cache
    token = next_token(state.root_logp, temperature, generator)
    for step in range(1, max_new_tokens + 1):
        keep = []
        for k, (row, t) in enumerate(zip(rows, token.tolist(), strict=True)):
            out[row].append(t)
            finished = (
                t in stops
                or step == max_new_tokens
                or (settled is not None and settled(text(out[row], skip_special_tokens=True)))
            )
            if not finished:
                keep.append(k)
        if not keep:
            break
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=mask.device)
            kv.select_rows(cache, index)
            rows = [rows[k] for k in keep]
            mask, lengths, token = mask[index], lengths[index], token[index]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        position = (lengths + step - 1)[:, None]
        hidden, cache = body(model, token[:, None], mask, position, cache)
        token = next_token(log_probs(model, hidden[:, -1]), temperature, generator)
    return out


def next_token(
    logp: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The greedy token of each row, or one sampled at `temperature` from `generator`."""
    if temperature == 0:
        return logp.argmax(-1)
    probs = (logp / temperature).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
