"""Models with random weights, built by one pair of functions: `llama_config` (a Llama config of a
given depth, width, heads and vocabulary, padded or not) and `random_weights` (a seeded model of a
config, with a tokenizer, as `load_model` would give it). `tiny_model` is the unit tests' model
(`TINY_SHAPE`, or `SMOL_DEPTH`, on the default model's tokenizer); `LLAMA_8B` is the shape of
speed measurements at a size no local checkpoint has."""

from __future__ import annotations

import copy
import functools
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from probekit.core.paths import user_cache_dir
from probekit.engines.hf.attention import use_grouped_sdpa
from probekit.engines.hf.gguf import default_gguf_path, gguf_sha256
from probekit.engines.hf.model import LoadedModel

TINY_SHAPE = {
    "layers": 4,
    "width": 64,
    "mlp_width": 128,
    "heads": 4,
    "kv_heads": 2,  # grouped-query attention, as the default model has (9 over 3)
    "head_width": 16,
    "context": 2048,
    # Weights ~15x wider than a trained model's initialisation: the answer distributions are
    # far from uniform (one answer can hold most of the mass), so an exactness check that
    # reads the wrong position or token shows, while float32 stays ~1e-7 from float64.
    "initializer_range": 0.3,
}
"""The tiny model's shape: Llama (the default model's architecture) with 4 layers of width 64."""

SMOL_DEPTH = {
    "layers": 30,
    "heads": 9,
    "kv_heads": 3,
    "head_width": 8,
    "width": 72,
    # Narrower weights than the 4-layer model's: 30 random layers at 0.3 make the metric so
    # curved that a first-order estimate misses a 5 % step by 3 % (the attribution tests).
    "initializer_range": 0.2,
}
"""The default model's layer and head counts at width 72 (`tiny_model(**SMOL_DEPTH)`), for tests
that name its layers and heads; about 3x the 4-layer model's time per forward pass."""

LLAMA_8B = {
    "layers": 32,
    "width": 4096,
    "mlp_width": 14336,
    "heads": 32,
    "kv_heads": 8,
    "head_width": 128,
    "context": 131072,
    "vocab_rows": 128256,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}
"""Llama-3.1-8B's shape (`llama_config(len(tokenizer), **LLAMA_8B)`): its 128,256-row vocabulary
padded beyond a smaller tokenizer's, its norm and rotary constants (not its rotary scaling)."""

SHAPE_FIELDS = {
    "layers": "num_hidden_layers",
    "width": "hidden_size",
    "mlp_width": "intermediate_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_width": "head_dim",
    "context": "max_position_embeddings",
    "tie": "tie_word_embeddings",
}
"""`llama_config`'s names of a shape -> the transformers config's."""


def llama_config(
    vocabulary: int,
    *,
    layers: int,
    width: int,
    mlp_width: int,
    heads: int,
    kv_heads: int | None = None,
    head_width: int | None = None,
    context: int | None = None,
    tie: bool | None = None,
    vocab_rows: int | None = None,
    base: Any = None,
    **fields: Any,
) -> Any:
    """A Llama config of `layers` blocks of `width` (MLP `mlp_width`), `heads` attention heads
    over `kv_heads` key/value heads (default `heads`) of `head_width` (default width / heads),
    and `vocabulary` tokens (the tokenizer's length), padded to `vocab_rows` rows of the
    embeddings and the LM head when given (a padded vocabulary, as Llama-3.1's). `context`
    (the longest input) and `tie` (the LM head shares the embeddings), when given, and `fields`
    (other config fields by their transformers names: `initializer_range`, `rope_parameters`,
    ...) set the rest; what they leave is `base`'s (a config, copied: e.g. the default model's)
    or transformers' `LlamaConfig` defaults."""
    from transformers import LlamaConfig

    rows = vocab_rows or vocabulary
    if rows < vocabulary:
        raise ValueError(f"vocab_rows ({rows}) is fewer than the vocabulary ({vocabulary})")
    shape = {
        "layers": layers,
        "width": width,
        "mlp_width": mlp_width,
        "heads": heads,
        "kv_heads": kv_heads or heads,
        "head_width": head_width or width // heads,
        "context": context,
        "tie": tie,
    }
    given = {SHAPE_FIELDS[k]: v for k, v in shape.items() if v is not None}
    given |= {"vocab_size": rows, **fields}
    if base is None:
        return LlamaConfig(**given)
    config = copy.deepcopy(base)
    config.update(given)
    return config


def random_weights(
    config: Any,
    tokenizer: Any,
    name: str = "tiny-random",
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    generation: Any = None,
) -> LoadedModel:
    """A causal LM of `config` (a transformers config) with weights drawn from `seed` (the same
    seed gives the same weights), built on `device` in `dtype`, with `tokenizer` (its ids must
    lie below `config.vocab_size`) and CPU attention as `load_model` sets it. `generation`: the
    generation config to copy; without one the model never stops at an end of sequence token,
    so generation always writes its whole budget."""
    from transformers import AutoModelForCausalLM

    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        with dev:
            hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    hf.to(dev).eval()
    if generation is None:
        hf.generation_config.pad_token_id = tokenizer.pad_token_id
        hf.generation_config.eos_token_id = None
    else:
        hf.generation_config = copy.deepcopy(generation)
    use_grouped_sdpa(hf, dev)
    return LoadedModel(
        hf=hf,
        tokenizer=tokenizer,
        name=name,
        source="random",
        device=dev,
        dtype=dtype,
        meta={"revision": f"random seed {seed}"},
    )


@functools.cache
def _default_files() -> tuple[Any, Any, Any]:
    """The default model's tokenizer (left padding, as `load_model` sets it), config and
    generation config, read from its GGUF's metadata: no weights are read or converted, so the
    unit tests need no model cache. Reading the metadata costs ~7 s of CPU, so its result is kept
    in the user cache (a complete folder or none: written aside, then renamed) and read from there
    in ~0.4 s by every later process, keyed by the GGUF's SHA-256 (its kept digest); a damaged
    copy is read again from the GGUF."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    gguf = default_gguf_path()
    kept = user_cache_dir() / "metadata" / f"{gguf.stem}-{gguf_sha256(gguf)[:12]}"
    try:
        tokenizer, config = AutoTokenizer.from_pretrained(kept), AutoConfig.from_pretrained(kept)
    except (OSError, ValueError):  # not kept yet, or damaged
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _keep(kept, tokenizer, config)
    tokenizer.name_or_path = config._name_or_path = str(gguf.parent)
    tokenizer.padding_side = "left"
    return tokenizer, config, GenerationConfig.from_model_config(config)


def _keep(folder: Path, tokenizer: Any, config: Any) -> None:
    """Save `tokenizer` and `config` into `folder` whole, or leave it as it was (another process
    kept it first, or the cache cannot be written: the next process reads the GGUF again)."""
    aside = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    try:
        shutil.rmtree(folder, ignore_errors=True)
        tokenizer.save_pretrained(aside)
        config.save_pretrained(aside)
        aside.rename(folder)
    except OSError:
        shutil.rmtree(aside, ignore_errors=True)


def default_tokenizer() -> Any:
    """A copy of the default model's tokenizer (SmolLM2's vocabulary and chat template, left
    padding), so that a caller may change it without touching another's."""
    return copy.deepcopy(_default_files()[0])


def default_config() -> Any:
    """A copy of the default model's transformers config (SmolLM2-135M's shape)."""
    return copy.deepcopy(_default_files()[1])


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **shape: Any) -> LoadedModel:
    """A random-weight causal LM on the default model's tokenizer, built on the CPU in about
    0.2 s once its files are read (`_default_files`): SmolLM2's config with `TINY_SHAPE` (and
    `shape`'s overrides, `llama_config`'s keywords: e.g. `layers=6` or `**SMOL_DEPTH`), weights
    drawn from `seed`, SmolLM2's generation config. The scorers, the TransformerLens
    bridge and nnsight run on it as on a loaded model; its numbers mean nothing, their
    agreement does."""
    tokenizer, config, generation = _default_files()
    config = llama_config(len(tokenizer), base=config, **{**TINY_SHAPE, **shape})
    model = random_weights(
        config, default_tokenizer(), dtype=dtype, seed=seed, generation=generation
    )
    spec = ",".join(f"{key}={value}" for key, value in sorted(shape.items()))
    model.meta["revision"] += f" ({spec})" if spec else ""
    return model
