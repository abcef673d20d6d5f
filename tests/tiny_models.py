"""A two-layer random-weight Llama with the default model's tokenizer (no weights are read, so the
unit loop may build it): for the tests of the batch plan and of the precision tiers."""

from __future__ import annotations

import pytest
import torch


def tiny_llama(tie: bool = False, seed: int = 0):
    """The tiny model (float32, CPU); `tie`: its LM head shares the input embeddings, as the
    default model's does."""
    from transformers import AutoTokenizer, LlamaConfig

    from probekit.engines.hf.gguf import converted_cache_dir, default_gguf_path
    from probekit.engines.hf.tiers import initial_record
    from probekit.testing.synthetic import random_weights

    folder = converted_cache_dir(default_gguf_path())
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("needs the default model's tokenizer (run ./setup.sh)")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        tie_word_embeddings=tie,
    )
    model = random_weights(config, tokenizer, "tiny", "cpu", torch.float32)
    model.meta["precision"] = initial_record(model, False, None)
    return model
