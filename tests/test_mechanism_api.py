"""The mechanism from a script: `patch` gives the command's rows, `capture` in memory equals the
disk writer, pairs from two strings, layers from the end, one vocabulary of sites and hook
libraries, wrong types in one line, and float64 with left padding on the bridge."""

import doctest
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ANSWERS, religion_prompt

from probekit.core.errors import ProbekitError
from probekit.mechanism import api, sites
from probekit.mechanism.capture import read_index
from probekit.run import runner
from probekit.studies.base import Context

MODEL = "tiny"  # conftest's tiny model: each mechanism call installs its bridge for the call


# ---------------------------------------------------------------------- no model
def test_sites_one_table_with_short_forms():
    assert sites.site("resid_pre") is sites.site("hook_resid_pre")
    assert sites.site("z") is sites.site("attn.hook_z") is sites.site("hook_z")
    assert sites.site("mlp_out").hook(3) == "blocks.3.hook_mlp_out"
    assert sites.parse_hook("blocks.2.attn.hook_z") == (2, sites.site("z"))
    assert sites.DEFAULT_SITES == (
        "hook_resid_pre",
        "hook_attn_out",
        "hook_mlp_out",
        "hook_resid_post",
    )
    assert sites.site("z").per_head and not sites.site("resid_pre").per_head
    assert sites.library("transformer_lens") == "transformer_lens"
    with pytest.raises(ProbekitError, match="unknown hook library 'bridge'"):
        sites.library("bridge")
    with pytest.raises(ProbekitError, match="unknown site 'resid_mid'"):
        sites.site("resid_mid")
    with pytest.raises(ProbekitError, match="unknown hook library 'lens'"):
        sites.library("lens")


def test_layers_count_from_the_end():
    fake = SimpleNamespace(n_layers=30)
    assert sites.layer_indices(fake, [0, -1, -30, 29]) == [0, 29, 0, 29]
    for bad, message in (
        ([30], "out of range"),
        ([-31], "-30 to -1"),
        ([], "no layers"),
        (["1"], "not a layer index"),
        ("0,1", "must be a list"),
    ):
        with pytest.raises(ProbekitError, match=message):
            sites.layer_indices(fake, bad)


# ---------------------------------------------------------------------- with the tiny model
def test_make_pair_declares_the_swapped_word(model):
    clean, corrupt = api.make_pair(
        model, "I am a Muslim. Am I sad?", "I am a Jew. Am I sad?", span="Muslim"
    )
    assert clean.span_text("identity").strip() == "Muslim"
    assert corrupt.span_text("identity").strip() == "Jew"
    assert clean.item.unit == corrupt.item.unit == "I am a {identity}. Am I sad?"
    assert clean.item.key == {"identity": "Muslim"} and corrupt.item.key == {"identity": "Jew"}
    auto = api.make_pair(model, "I am a Muslim. Am I sad?", "I am a Jew. Am I sad?")
    assert auto[0].positions == clean.positions and auto[1].positions == corrupt.positions
    both = api.make_pair(model, "A Muslim asks.", "A Jew asks.", span=("Muslim", "Jew"))
    assert both[1].span_text("identity").strip() == "Jew"
    with pytest.raises(ProbekitError, match="not in the clean text"):
        api.make_pair(model, "I am a Jew.", "I am a Muslim.", span="Hindu")
    with pytest.raises(ProbekitError, match="differ outside"):
        api.make_pair(model, "I am a Muslim. Sad?", "You are a Jew. Sad?", span="Muslim")


PERSONA = "You are {}."
QUESTION = "My bike was stolen. How angry am I, from 0 to 10?"


def _chat(identity, question=QUESTION):
    return [
        {"role": "system", "content": PERSONA.format(identity)},
        {"role": "user", "content": question},
    ]


def test_make_pair_takes_two_message_lists(model):
    """A persona pair: the span is found in the system prompt, where the two lists differ."""
    clean, corrupt = api.make_pair(model, _chat("a Muslim"), _chat("a Jew"), span="Muslim")
    assert clean.span_text("identity").strip() == "Muslim"
    assert corrupt.span_text("identity").strip() == "Jew"
    assert (
        clean.item.messages[0]["role"] == "system" and clean.item.spans["identity"][0].message == 0
    )
    assert clean.item.unit == corrupt.item.unit == f"You are a {{identity}}. | {QUESTION}"
    assert clean.positions["identity"] == corrupt.positions["identity"]
    user = api.make_pair(
        model,
        [{"role": "user", "content": "I am a Muslim. Sad?"}],
        [{"role": "user", "content": "I am a Jew. Sad?"}],
    )
    assert user[0].item.key == {"identity": "Muslim"}
    with pytest.raises(ProbekitError, match="different roles"):
        api.make_pair(model, _chat("a Muslim"), _chat("a Jew")[1:])
    with pytest.raises(ProbekitError, match="differ in messages"):
        api.make_pair(model, _chat("a Muslim"), _chat("a Jew", "Sad?"))
    with pytest.raises(ProbekitError, match="two texts or two message lists, not one"):
        api.make_pair(model, _chat("a Muslim"), "I am a Jew.")
    with pytest.raises(ProbekitError, match="chat-message lists"):
        api.make_pair(model, [{"role": "user"}], "I am a Jew.")


def test_make_pair_refuses_tokens_that_diverge_outside_the_span(model):
    with pytest.raises(ProbekitError) as error:
        api.make_pair(model, "I am a Muslim. Angry?", "I am a Jewlim. Angry?", span=("Mus", "Jew"))
    line = str(error.value)
    assert "\n" not in line and "diverge after the span 'identity'" in line and "'lim'" in line


def test_the_module_example_runs_and_recovers_the_gap(model, monkeypatch):
    """The docstring of `probekit.mechanism.api`: swap one identity word, patch the residual
    stream layer by layer, plot the recovered share (on the model of this module)."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setattr(api, "hookable", lambda spec: model)
    (test,) = [t for t in doctest.DocTestFinder().find(api, "api") if t.name == "api"]
    globs = {**test.globs}
    test.globs = globs
    result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test, clear_globs=False)
    assert result.failed == 0 and result.attempted >= 4
    df = globs["df"]
    assert len(df) == model.n_layers and (df["site"].iloc[-1], df["layer"].iloc[-1]) == (
        "hook_resid_pre",
        model.n_layers - 1,
    )
    assert abs(df["gap"].iloc[0]) > 1e-3
    assert df["recovery"].iloc[0] == pytest.approx(1, abs=1e-2)  # layer 0: everything patched


def test_patch_equals_the_commands_rows(model, tmp_path, patch_cli):
    """`probekit patch intergroup` and `api.patch` on the sets the command drew: equal rows;
    `--layers 0,-1` is the first and the last layer."""
    from probekit.mechanism.pairs import interaction_sets
    from probekit.studies.intergroup import STUDY

    argv = [
        "--limit",
        "25",
        "--layers",
        "0,-1",
        "--setting",
        "P0S1T0",
        "--sites",
        "resid_pre,hook_mlp_out",
        "--spans",
        "experiencer,from_experiencer",
        "--skip-direction",
        "--bootstrap",
        "20",
        "--sets-per-unit",
        "1",
    ]
    assert patch_cli(model, "intergroup", *argv, "--out", str(tmp_path)) == 0
    command = pd.read_parquet(tmp_path / "patching.parquet")
    assert sorted(set(command["layer"])) == [0, model.n_layers - 1]
    parsed = runner("patch").parse(
        ["--limit", "25", "--setting", "P0S1T0"], "probekit patch intergroup", STUDY
    )
    context = Context("patch", parsed.own.seed, limit=parsed.own.limit)
    probe, items = STUDY.mechanism_items(parsed.study, context)
    encoded = [model.encode(item) for item in items]
    drawn = set(command["set"])
    found = interaction_sets(STUDY.mechanism_defaults().effect, probe, encoded)
    sets = [s for s in found if s.name in drawn]
    assert len(sets) == 2  # one identity pair: its two sets
    script = api.patch(
        model,
        sets,
        spans=["experiencer", "from_experiencer"],
        sites=["hook_resid_pre", "mlp_out"],
        layers=[0, -1],
        readout="expected",
        answers=probe.answers,
    )
    assert list(script.columns) == list(command.columns) and len(script) == len(command)
    for column in script.columns:
        if column.endswith("_positions"):
            assert [list(x) for x in command[column]] == [list(x) for x in script[column]]
        elif script[column].dtype.kind == "f":
            np.testing.assert_allclose(script[column], command[column], atol=1e-12)
        else:
            assert script[column].tolist() == command[column].tolist(), column


def test_capture_in_memory_equals_the_disk_writer(model, tmp_path):
    prompts = [
        religion_prompt(model, "a Christian", "a Jew"),
        religion_prompt(model, "a Jew", "a Muslim", event_id="e2"),
    ]
    kw = dict(sites=["resid_pre", "attn.hook_z"], layers=[1, -1], spans=["experiencer"])
    memory = api.capture(model, prompts, **kw)
    stored = api.capture(model, prompts, out=tmp_path, **kw)
    last = model.n_layers - 1
    hooks = [
        "blocks.1.hook_resid_pre",
        "blocks.1.attn.hook_z",
        f"blocks.{last}.hook_resid_pre",
        f"blocks.{last}.attn.hook_z",
    ]
    assert sorted(memory.tensors) == sorted(stored.tensors) == sorted(hooks)
    config = model.hf.config
    assert memory["blocks.1.attn.hook_z"].shape[1:] == (config.num_attention_heads, config.head_dim)
    for hook in hooks:
        assert memory[hook].dtype == torch.float32 and stored[hook].dtype == torch.float16
        assert torch.equal(memory[hook].half(), stored[hook])
    pd.testing.assert_frame_equal(memory.index[stored.index.columns], stored.index)
    one = memory.at(f"blocks.{last}.hook_resid_pre", prompts[1].id, "experiencer")
    assert one.shape == (len(prompts[1].positions["experiencer"]), model.hf.config.hidden_size)
    assert sorted(set(read_index(tmp_path)["layer"])) == [1, last]
    # a plain string has the `answer` span; nnsight reads the same hook names
    text = api.capture(model, "How sad am I?", layers=[-1], sites=["resid_post"])
    other = api.capture(model, "How sad am I?", layers=[-1], sites=["resid_post"], hooks="nnsight")
    assert list(text.index["span"]) == ["answer"]
    torch.testing.assert_close(
        text[f"blocks.{last}.hook_resid_post"],
        other[f"blocks.{last}.hook_resid_post"],
        atol=1e-4,
        rtol=0,
    )


def test_wrong_types_are_one_line(model):
    pair = api.make_pair(model, "I am a Muslim.", "I am a Jew.", span="Muslim")
    common = dict(spans=["identity"], layers=[0], answers=ANSWERS)
    cases = [
        (dict(pairs=list(pair)), "pair 0 is a EncodedItem"),  # prompts, not pairs
        (dict(pairs=[pair[0].item, pair[1].item, pair[0].item]), "pair 0 is a Item"),
        (dict(pairs="text"), "pairs must be a list"),
        (dict(pairs=[pair], sites="hook_resid_pre"), "sites must be a list"),
        (dict(pairs=[pair], sites=["resid_mid"]), "unknown site 'resid_mid'"),
        (dict(pairs=[pair], layers=[40]), "layer 40 is out of range"),
        (dict(pairs=[pair], spans="identity"), "spans must be a list"),
        (dict(pairs=[pair], spans=["perceiver"]), "unknown span 'perceiver'"),
        (dict(pairs=[pair], readout=3), r"readout must be a str or a Readout \(got 3\)"),
        (
            dict(pairs=[pair], readouts="expected"),
            "did you mean readout",
        ),
        (dict(pairs=[pair], batch_size=0), r"batch_size must be at least 1 \(got 0\)"),
    ]
    for change, message in cases:
        kwargs = {**common, **change}
        with pytest.raises(ProbekitError, match=message):
            api.patch(model, kwargs.pop("pairs"), **kwargs)
    with pytest.raises(ProbekitError, match="sites must be a list"):
        api.capture(model, "text", sites="resid_pre", layers=[0])
    with pytest.raises(ProbekitError, match="unknown hook library"):
        api.capture(model, "text", layers=[0], hooks="pyvene")
    with pytest.raises(ProbekitError, match="prompt 0 is a int"):
        api.capture(model, [1, 2], layers=[0])


@pytest.mark.default_model
def test_float64_left_padding_on_the_bridge_is_finite():
    """The bridge's float32 softmax turned float64's mask minimum into -inf, so the pad rows of a
    left-padded batch were NaN and leaked into the real rows; `sites.bridged` clamps."""
    from probekit.engines.hf.scorer import HFScorer
    from probekit.mechanism.interventions import score_with
    from probekit.testing.synthetic import tiny_model

    wide = tiny_model(dtype=torch.float64)
    scorer = HFScorer(wide, ANSWERS, epsilon=0.0)
    long = religion_prompt(wide, "a Jew", "a Hispanic American")
    short = religion_prompt(wide, "a Jew", "a Jew")
    assert len(long.input_ids) != len(short.input_ids)
    hook = "blocks.3.hook_resid_post"
    (alone,), _ = score_with(scorer, [short.input_ids])
    both, read = score_with(
        scorer,
        [long.input_ids, short.input_ids],
        reads={hook: [(1, short.positions["experiencer"][0])]},
    )
    assert torch.isfinite(read[hook]).all()
    assert both[1].expected == pytest.approx(alone.expected, abs=1e-9)
    np.testing.assert_allclose(both[1].probs, alone.probs, atol=1e-12)


def test_the_mechanism_types_against_the_engine_protocol():
    """No mechanism module names the transformers engine's scorer class; they take a
    `HookedScorer` (engines/base.py)."""
    import ast

    root = Path(api.__file__).parent
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert "HFScorer" not in names, path.name


def test_the_transformers_engine_is_a_hooked_scorer(tiny_scorer):
    scorer = tiny_scorer
    from probekit.engines.base import HookableModel, HookedScorer

    assert isinstance(scorer, HookedScorer) and isinstance(scorer.model, HookableModel)


# ---------------------------------------------------------------------- a hook library missing
def without(monkeypatch, *packages):
    """Make `packages` (and their submodules, imported or not) fail to import in this test, as
    on a machine where they are not installed."""
    import sys

    for name in [m for m in sys.modules if m.split(".")[0] in packages] + list(packages):
        monkeypatch.setitem(sys.modules, name, None)


def hook_line(text, missing, other):
    """`text` is one line naming the missing package, its install command and the other one."""
    assert "\n" not in text.strip() and "Traceback" not in text
    assert f"the {missing} package is not installed here" in text or (
        f"the {missing} package cannot be imported here" in text
    )
    assert "pip install 'transformer-lens" in text or "pip install 'nnsight" in text
    assert f"or use the other hook library, {other}" in text


@pytest.mark.parametrize(
    ("missing", "other", "hooks"),
    [("transformer_lens", "nnsight", []), ("nnsight", "transformer_lens", ["--hooks", "nnsight"])],
)
def test_the_commands_say_a_missing_hook_library_in_one_line(
    monkeypatch, capsys, missing, other, hooks
):
    """`probekit patch/capture/steer` without the hook library's package: one line before any
    model loads (the default hooks, transformer_lens, checked as a given one is)."""
    from probekit import cli

    without(monkeypatch, missing)
    for command in ("patch", "capture", "steer"):
        assert cli.main([command, "intergroup", *hooks]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("probekit: error: --hooks: "), err
        hook_line(err, missing, other)


def test_the_functions_say_a_missing_hook_library_in_one_line(model, monkeypatch):
    """`probekit.patch`, `capture`, `steer` (and the study functions) without the package, and
    the TransformerLens and nnsight views of a model built without it: one ProbekitError line,
    not a ModuleNotFoundError."""
    import probekit
    from probekit.testing.synthetic import tiny_model

    pair = api.make_pair(model, "I am a Muslim. Sad?", "I am a Jew. Sad?", span="Muslim")
    without(monkeypatch, "transformer_lens")
    calls = {
        "patch": lambda: probekit.patch(
            model, pair, spans=["identity"], layers=[0], answers="0-10", progress=False
        ),
        "capture": lambda: probekit.capture(model, ["How sad?"], layers=[0]),
        "steer": lambda: probekit.steer(
            model, ["How sad?"], np.ones(64), layers=[0], alphas=[1.0], answers="0-10"
        ),
        "patch_study": lambda: probekit.patch_study("intergroup", model),
        "the bridge": lambda: tiny_model().enable_bridge(),
    }
    for call in calls.values():
        with pytest.raises(ProbekitError) as error:
            call()
        hook_line(str(error.value), "transformer_lens", "nnsight")
    without(monkeypatch, "nnsight")
    with pytest.raises(ProbekitError, match="the nnsight package cannot be imported here"):
        tiny_model().nnsight  # noqa: B018
    with pytest.raises(ProbekitError, match=r"also missing: `pip install 'nnsight>=0.8'`"):
        probekit.capture(model, ["How sad?"], layers=[0])
