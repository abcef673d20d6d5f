"""Models with random weights, for speed measurements at shapes no local checkpoint has."""

from __future__ import annotations

from typing import Any

import torch

from probekit.engines.hf.model import LoadedModel


def random_weights(
    config: Any,
    tokenizer: Any,
    name: str,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
) -> LoadedModel:
    """A causal LM of `config` (a transformers config) with random weights, built on `device`,
    with `tokenizer` (its ids must lie below `config.vocab_size`). It never stops at an end of
    sequence token, so generation always writes its whole budget."""
    from transformers import AutoModelForCausalLM

    dev = torch.device(device)
    with dev:
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    hf.to(dev).eval()
    hf.generation_config.pad_token_id = tokenizer.pad_token_id
    hf.generation_config.eos_token_id = None
    return LoadedModel(
        hf=hf, tokenizer=tokenizer, name=name, source="random", device=dev, dtype=dtype
    )
