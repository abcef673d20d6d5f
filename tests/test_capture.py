"""Activation capture at spans: bridge and nnsight agree, shards resume, bad requests fail (on the
tiny model: capture's mechanics need no trained weights)."""

import pytest
import torch
from conftest import religion_prompt
from safetensors import safe_open

from probekit.core.errors import ProbekitError
from probekit.mechanism.capture import (
    capture,
    check_request,
    read_activations,
    read_index,
    read_spans,
)
from probekit.mechanism.sites import DEFAULT_SITES as SITES
from probekit.testing.synthetic import tiny_model

LAYERS = [1, 3]  # of the tiny model's 4
KEY_COLUMNS = ["perceiver", "experiencer", "event_id", "emotion"]
PROMPTS = [  # different lengths, so a batch is left-padded
    ("a Christian", "a person", "a Christian took my seat"),
    ("a person", "a person from the United States", "My bus was late again."),
    ("a Jew", "a Muslim", "Someone broke my bike."),
]


@pytest.fixture(scope="module")
def items(tiny):
    return [
        religion_prompt(tiny, perceiver, experiencer, event, f"e{i}")
        for i, (perceiver, experiencer, event) in enumerate(PROMPTS)
    ]


@pytest.mark.default_model
def test_bridge_is_built_only_on_request():
    fresh = tiny_model()
    assert not fresh.bridge_enabled
    with pytest.raises(ProbekitError, match="enable_bridge"):
        _ = fresh.bridge
    bridge = fresh.enable_bridge()
    assert fresh.bridge_enabled
    assert fresh.bridge is bridge and fresh.enable_bridge() is bridge


def test_bridge_and_nnsight_agree(tiny, items, tmp_path):
    # A second copy (the same seed, the same weights) that never gets a bridge, read through
    # nnsight on plain HF modules. The bridge runs HF attention eagerly; give the copy the same
    # kernel so the sums match.
    plain = tiny_model()
    plain.hf.set_attn_implementation("eager")
    kw = dict(layers=LAYERS, batch_size=2, storage_dtype=torch.float32)
    capture(tiny, items, tmp_path / "bridge", hooks="transformer_lens", **kw)
    assert tiny.bridge_enabled  # the bridge backend builds it itself
    capture(plain, items, tmp_path / "nnsight", hooks="nnsight", **kw)
    assert not plain.bridge_enabled
    assert type(plain.hf.model.layers[0]).__name__ == "LlamaDecoderLayer"  # no bridge inside
    bridge, nnsight = (read_activations(tmp_path / name) for name in ("bridge", "nnsight"))
    assert list(bridge.index["prompt_id"].unique()) == [item.id for item in items]
    assert bridge.index.equals(nnsight.index)
    assert {"perceiver", "experiencer", "emotion", "event", "answer"} <= set(bridge.index["span"])
    for layer in LAYERS:
        for site in SITES:
            hook = f"blocks.{layer}.{site}"
            assert bridge[hook].shape == (len(bridge[hook]), tiny.hf.config.hidden_size)
            assert len(bridge[hook]) == bridge.index["row_stop"].max()
            assert (bridge[hook] - nnsight[hook]).abs().max().item() <= 1e-4, hook


def test_read_spans_rows_follow_the_spans(tiny, items):
    tiny.enable_bridge()
    acts = read_spans(tiny, items[:2], [1], ["resid_post"], spans=["experiencer", "answer"])
    order = [(0, "experiencer"), (0, "answer"), (1, "experiencer"), (1, "answer")]
    index = acts.index
    assert list(zip(index["prompt_id"], index["span"], strict=True)) == [
        (items[b].id, name) for b, name in order
    ]
    assert list(index["positions"]) == [list(items[b].positions[name]) for b, name in order]
    (key,) = acts.tensors
    assert key == "blocks.1.hook_resid_post"
    assert acts[key].shape == (index["row_stop"].iloc[-1], tiny.hf.config.hidden_size)


def test_resume_skips_captured_prompts(tiny, items, tmp_path):
    first = capture(tiny, items[:2], tmp_path, layers=LAYERS, batch_size=2)
    again = capture(tiny, items, tmp_path, layers=LAYERS, batch_size=2)
    assert (first.captured, first.skipped) == (2, 0)
    assert (again.captured, again.skipped) == (1, 2)
    assert len(first.shards) == len(again.shards) == 1 and first.shards != again.shards
    index = read_index(tmp_path)
    n_spans = len(items[0].positions)
    assert sorted(set(index["prompt_id"])) == sorted(item.id for item in items)
    assert len(index) == 3 * n_spans * len(LAYERS) * len(SITES)
    assert not index.duplicated(["prompt_id", "span", "layer", "site"]).any()
    # Every row carries its item's id and key columns (the join keys of the scores table).
    assert "meta" not in index.columns
    for item in items:
        rows = index[index["prompt_id"] == item.id]
        assert len(rows) == n_spans * len(LAYERS) * len(SITES)
        for column in KEY_COLUMNS:
            assert list(rows[column].unique()) == [item.item.key[column]], column
        assert set(rows["n_tokens"]) == {len(item.input_ids)}
    assert list(index[index["prompt_id"] == items[2].id]["perceiver"].unique()) == ["a Jew"]
    with safe_open(tmp_path / again.shards[0].relative_to(tmp_path), framework="pt") as f:
        assert f.get_tensor("blocks.3.hook_resid_post").dtype == torch.float16
    assert set(index["site"]) == set(SITES)
    # Positions are into the unpadded prompt and match the encoded span.
    p1 = index[(index["prompt_id"] == items[1].id) & (index["span"] == "experiencer")]
    assert list(p1["positions"].iloc[0]) == items[1].positions["experiencer"]


def test_repeated_ids_are_captured_once(tiny, items, tmp_path):
    result = capture(tiny, [items[0], items[0]], tmp_path, layers=[1], sites=["resid_pre"])
    assert (result.captured, result.skipped) == (1, 1)
    assert list(read_index(tmp_path)["prompt_id"].unique()) == [items[0].id]


def test_resume_with_other_settings_fails(tiny, items, tmp_path):
    capture(tiny, items[:1], tmp_path, layers=[1])
    with pytest.raises(ProbekitError, match="layers"):
        capture(tiny, items, tmp_path, layers=[2])


@pytest.mark.parametrize(
    "layers, sites, hooks, message",
    [
        ([4], SITES, "transformer_lens", "layer 4 is out of range"),
        ([-5], SITES, "transformer_lens", "out of range"),
        ([], SITES, "transformer_lens", "no layers"),
        ([1], ["resid_mid"], "transformer_lens", "unknown site 'resid_mid'"),
        ([1], SITES, "lens", "unknown hook library"),
    ],
)
def test_bad_requests_raise(tiny, items, tmp_path, layers, sites, hooks, message):
    with pytest.raises(ProbekitError, match=message):
        check_request(tiny, layers, sites, hooks)
    with pytest.raises(ProbekitError, match=message):
        capture(tiny, items, tmp_path, layers=layers, sites=sites, hooks=hooks)
    assert not (tmp_path / "index").exists()


def test_unknown_span_raises(tiny, items, tmp_path):
    with pytest.raises(ProbekitError, match="unknown span 'speaker'"):
        capture(tiny, items, tmp_path, layers=[1], spans=["speaker"])


def test_intergroup_capture_items_carry_setting_and_side():
    """`probekit capture intergroup` indexes the setting and whether the pair is in-group, as the
    capture script did before the study-generic core; patching items keep the plain key."""
    from probekit.datasets.crowd_envent import SAMPLE_ROOT
    from probekit.studies.base import Context
    from probekit.studies.intergroup import STUDY
    from probekit.studies.intergroup.study import IntergroupOptions

    options = IntergroupOptions(category="religion", setting="P0S0T0", events=1, data=SAMPLE_ROOT)
    probe, items = STUDY.mechanism_items(options, Context("capture", seed=0, limit=36))
    assert len(items) == 36 and {item.key["setting"] for item in items} == {"P0S0T0"}
    sides = {(i.key["perceiver"], i.key["experiencer"]): i.key["in_group"] for i in items}
    assert sides[("a Jew", "a Jew")] and not sides[("a Jew", "a Muslim")]
    _, patch_items = STUDY.mechanism_items(options, Context("patch", seed=0, limit=25))
    assert len(patch_items) == 25 and "in_group" not in patch_items[0].key


# ---------------------------------------------------------------------- hostile state
def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_damaged_parts_and_shards_are_set_aside_and_captured_again(tiny, items, tmp_path, capsys):
    from probekit.mechanism.capture import read_activations

    capture(tiny, items, tmp_path, layers=[1], batch_size=1, prompts_per_shard=1)
    first = read_activations(tmp_path)
    parts = sorted((tmp_path / "index").glob("shard-*.parquet"))
    shards = sorted((tmp_path / "shards").glob("shard-*.safetensors"))
    assert len(parts) == len(shards) == 3
    parts[0].write_bytes(parts[0].read_bytes()[:-30])  # a truncated index part
    data = bytearray(shards[1].read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in a shard's values
    shards[1].write_bytes(bytes(data))
    capsys.readouterr()
    again = capture(tiny, items, tmp_path, layers=[1], batch_size=1, prompts_per_shard=1)
    err = capsys.readouterr().err
    assert f"{parts[0]} is damaged (" in err
    assert f"is damaged ({shards[1].name}, which it commits, is missing or not as written)" in err
    assert (again.captured, again.skipped) == (2, 1)
    assert (tmp_path / "index" / f"{parts[0].name}.damaged").is_file()
    assert (tmp_path / "shards" / f"{shards[1].name}.damaged").is_file()
    found = read_activations(tmp_path)
    order = found.index.sort_values("prompt_id").index
    expected = first.index.sort_values("prompt_id").index
    for hook, values in first.tensors.items():
        for a, b in zip(order, expected, strict=True):
            x, y = found.index.loc[a], first.index.loc[b]
            assert x["prompt_id"] == y["prompt_id"] and x["span"] == y["span"]
            got = found[hook][x["row_start"] : x["row_stop"]]
            assert torch.equal(got, values[y["row_start"] : y["row_stop"]])


def test_a_capture_resumes_only_under_its_own_settings(tiny, items, tmp_path, capsys):
    capture(tiny, items[:2], tmp_path, layers=[1])
    with pytest.raises(ProbekitError) as error:
        capture(tiny, items, tmp_path, layers=[1], storage_dtype=torch.float32)
    assert "a different storage_dtype ('float16', now 'float32')" in one_line(error)
    (tmp_path / "manifest.json").write_text("[")
    with pytest.raises(ProbekitError) as error:
        capture(tiny, items, tmp_path, layers=[1])
    assert "manifest.json is damaged" in one_line(error)
    (tmp_path / "manifest.json").unlink()  # as that line advises; then other settings
    capsys.readouterr()
    again = capture(tiny, items, tmp_path, layers=[1], storage_dtype=torch.float32)
    err = capsys.readouterr().err
    assert "holds rows captured under another storage_dtype ('float16', now 'float32')" in err
    assert "set aside as shard-00000.parquet.mismatched with shard-00000.safetensors" in err
    assert (again.captured, again.skipped) == (3, 0)
    assert set(read_index(tmp_path)["prompt_id"]) == {item.id for item in items}


def test_capture_study_refuses_another_capture_before_the_model(tiny, tmp_path):
    import probekit

    capture(tiny, [], tmp_path, layers=[1])  # an empty capture at layer 1
    with pytest.raises(ProbekitError) as error:
        probekit.capture_study("intergroup", "no/such-model", out=tmp_path, layers=[2], events=1)
    assert "a different layers ([1], now [2])" in one_line(error)


def test_capture_study_records_what_made_it(tiny, tmp_path):
    """The capture's manifest and page: the weights, layers, sites, package versions, probekit
    commit and command."""
    import json
    import re

    import probekit

    captured = probekit.capture_study(
        "intergroup",
        tiny,
        out=tmp_path,
        layers=[1],
        sites=["resid_post"],
        limit=36,  # one event: 6 x 6 pairs
        quiet=True,
    )
    assert captured.index["prompt_id"].nunique() == 36
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["weights"] == tiny.describe()["weights"]
    assert (manifest["layers"], manifest["sites"]) == ([1], ["resid_post"])
    assert manifest["versions"]["torch"] == torch.__version__
    assert re.fullmatch("[0-9a-f]{40}|unknown", manifest["commit"])
    assert manifest["command"] == "probekit.capture_study"
    selection = manifest["selection"]  # which items, drawn how: recorded, not a resume key
    assert (selection["study"], selection["seed"], selection["limit"]) == ("intergroup", 0, 36)
    assert selection["prompts"] == 36 and len(selection["prompt_ids_sha256"]) == 64
    page = (tmp_path / "report.html").read_text()
    assert f"<th>commit</th><td><code>{manifest['commit']}</code>" in page
    assert "<summary>versions</summary>" in page
