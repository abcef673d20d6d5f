"""Models with random weights: a tiny one on the default model's tokenizer for the unit tests,
and models of any shape for speed measurements at shapes no local checkpoint has."""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from probekit.engines.hf.attention import use_grouped_sdpa
from probekit.engines.hf.model import LoadedModel, load_model

TINY_SHAPE = {
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention, as the default model has (9 over 3)
    "head_dim": 16,
    "max_position_embeddings": 2048,
    # Weights ~15x wider than a trained model's initialisation: the answer distributions are
    # far from uniform (one answer can hold most of the mass), so an exactness check that
    # reads the wrong position or token shows, while float32 stays ~1e-7 from float64.
    "initializer_range": 0.3,
}
"""The tiny model's shape: Llama (the default model's architecture) with 4 layers of width 64."""

SMOL_DEPTH = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 8,
    "hidden_size": 72,
    # Narrower weights than the 4-layer model's: 30 random layers at 0.3 make the metric so
    # curved that a first-order estimate misses a 5 % step by 3 % (the attribution tests).
    "initializer_range": 0.2,
}
"""The default model's layer and head counts at width 72 (`tiny_model(**SMOL_DEPTH)`), for tests
that name its layers and heads; about 3x the 4-layer model's time per forward pass."""


@functools.cache
def _default_files() -> tuple[Any, Any, Any]:
    """The default model's tokenizer, config and generation config, read once per process
    without its weights (`load_model(weights=False)`)."""
    meta = load_model("default", weights=False)
    return meta.tokenizer, meta.hf.config, meta.hf.generation_config


def default_tokenizer() -> Any:
    """A copy of the default model's tokenizer (SmolLM2's vocabulary and chat template, left
    padding), so that a caller may change it without touching another's."""
    return copy.deepcopy(_default_files()[0])


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **shape: float) -> LoadedModel:
    """A random-weight causal LM on the default model's tokenizer, built on the CPU in about
    0.2 s (the tokenizer is read once per process, 0.5 s): SmolLM2's config with `TINY_SHAPE`
    (and `shape`'s overrides, e.g. `num_hidden_layers=6` or `**SMOL_DEPTH`), weights drawn from
    `seed` (the same seed gives the same weights), CPU attention as `load_model` sets it. The
    scorers, the TransformerLens bridge and nnsight run on it as on a loaded model; its numbers
    mean nothing, their agreement does."""
    tokenizer, config, generation = _default_files()
    config = copy.deepcopy(config)
    config.update({**TINY_SHAPE, **shape})
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    hf.eval()
    hf.generation_config = copy.deepcopy(generation)
    device = torch.device("cpu")
    use_grouped_sdpa(hf, device)
    spec = ",".join(f"{key}={value}" for key, value in sorted(shape.items()))
    return LoadedModel(
        hf=hf,
        tokenizer=copy.deepcopy(tokenizer),
        name="tiny-random",
        source="random",
        device=device,
        dtype=dtype,
        meta={"revision": f"random seed {seed}" + (f" ({spec})" if spec else "")},
    )


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
