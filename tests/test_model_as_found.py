"""The mechanism leaves the model as it found it: the TransformerLens bridge is installed only for
the duration of a call, so scores before and after patch, capture and steer are bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probekit


# ---------------------------------------------------------------------- a tiny random model
@pytest.fixture(scope="module")
def tiny():
    """A 2-layer random-weight Llama with grouped-query attention, a padded vocabulary and a
    word-level tokenizer (so that the module needs no model files)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from probekit.testing.synthetic import llama_config, random_weights

    words = ["<pad>", "<unk>", *[str(d) for d in range(10)], *"abcdefgh"]
    word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level, pad_token="<pad>", unk_token="<unk>"
    )
    shape = dict(layers=2, width=16, mlp_width=32, heads=4, kv_heads=2, context=64)
    config = llama_config(len(tokenizer), vocab_rows=32, **shape)
    return random_weights(config, tokenizer, "tiny")


IDS = torch.tensor([[2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.hf(IDS).logits


def state(model) -> tuple:
    """What scoring runs: the block and attention classes and the attention kernel."""
    block = model.hf.model.layers[0]
    return type(block), type(block.self_attn), model.hf.config._attn_implementation


def test_bridged_installs_the_bridge_for_the_block_only(tiny):
    before, found = logits(tiny), state(tiny)
    seen = []
    with tiny.bridged() as bridge:
        assert type(tiny.hf.model.layers[0]).__name__ == "BlockBridge"
        assert tiny.hf.config._attn_implementation == "eager"
        with bridge.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", lambda v, hook: seen.append(v))]):
            inside = logits(tiny)
        with tiny.bridged():  # nested: still installed, and still after the inner block
            pass
        assert type(tiny.hf.model.layers[0]).__name__ == "BlockBridge"
    assert seen and seen[0].shape == (2, 6, 16)
    assert (inside - before).abs().max() <= 1e-5  # eager vs SDPA: close, not equal
    assert state(tiny) == found
    assert torch.equal(logits(tiny), before)


def test_enable_bridge_installs_for_good_and_bridged_off_restores_the_own_modules(tiny):
    before, found = logits(tiny), state(tiny)
    bridge = tiny.enable_bridge()
    assert tiny.bridge is bridge and type(tiny.hf.model.layers[0]).__name__ == "BlockBridge"
    with tiny.bridged(False) as nothing:
        assert nothing is bridge
        assert state(tiny) == found
        assert torch.equal(logits(tiny), before)
    assert type(tiny.hf.model.layers[0]).__name__ == "BlockBridge"  # as found: installed


# ---------------------------------------------------------------------- the real model
EVENT = {"role": "user", "content": "My bike was stolen. How angry am I, from 0 to 10?"}
PROMPTS = [
    [{"role": "system", "content": "You are a Muslim."}, EVENT],
    "I lost my keys on the train. How sad am I, from 0 to 10?",
]


def rows(model) -> torch.Tensor:
    """The probability columns and the valid mass of `probekit.score`."""
    df = probekit.score(model, PROMPTS, answers="0-10", epsilon=0.0)
    return torch.tensor(df[[c for c in df if c.startswith("p::")] + ["valid_mass"]].to_numpy())


@pytest.mark.slow
def test_scores_are_bit_identical_after_patch_capture_and_steer():
    from probekit.engines.hf.model import load_model

    model = load_model("default")
    found = state(model)
    before = rows(model)
    corrupt = [{"role": "system", "content": "You are a Jew."}, EVENT]
    pair = probekit.make_pair(model, PROMPTS[0], corrupt, span="Muslim")
    calls = {
        "patch": lambda: probekit.patch(
            model,
            pair,
            spans=["identity"],
            sites=["resid_pre", "z"],
            layers=[0, -1],
            heads=[0],
            answers="0-10",
            progress=False,
        ),
        "patch through the answer": lambda: probekit.patch(
            model,
            pair,
            spans=["from_identity"],
            sites=["mlp_out"],
            layers=[3],
            answers="0-10",
            progress=False,
        ),
        "patch with nnsight": lambda: probekit.patch(
            model,
            pair,
            spans=["identity"],
            sites=["attn_out"],
            layers=[2],
            answers="0-10",
            hooks="nnsight",
            progress=False,
        ),
        "attribution": lambda: probekit.patch(
            model,
            pair,
            spans=["identity"],
            sites=["resid_pre"],
            layers=[1],
            answers="0-10",
            method="attribution",
            progress=False,
        ),
        "capture": lambda: probekit.capture(model, PROMPTS, sites=["resid_post"], layers=[0, -1]),
        "steer": lambda: probekit.steer(
            model,
            PROMPTS[1:],
            np.ones(576, dtype=np.float32),
            layers=[3],
            alphas=[0, 2.0],
            answers="0-10",
        ),
    }
    for name, call in calls.items():
        call()
        assert state(model) == found, name
        assert torch.equal(rows(model), before), name
    assert model.bridge_enabled
