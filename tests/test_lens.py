"""The logit lens on the exact readout: the scorer after the last layer, TransformerLens's and
nnsight's logit lens on one-token answers at every layer, the arithmetic of the trie per layer,
and `probekit lens STUDY` as a run folder (its files, headlines, resume, refusals, and the
patching run beside it)."""

from __future__ import annotations

import json
import re

import minimal_study
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ANSWERS

import probekit
from probekit import cli
from probekit.core.answers import ANSWER_KINDS, AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import Item
from probekit.engines.trie import extension_masks
from probekit.mechanism import lens as lens_module
from probekit.mechanism.interventions import answer_nodes, score_with
from probekit.mechanism.lens import layer_results, logit_lens
from probekit.mechanism.sites import hook_library
from probekit.run import lens as run_lens
from probekit.run import runner
from probekit.studies import base

QUESTIONS = [
    "My bike was stolen. How angry am I, from 0 to 12?",
    "A friend visited me after a long time. How glad am I, 0 to 12?",
    "x",
]
LETTERS = "Which reply is kinder? A, B, C or D? Answer with one letter."


def encode(model, texts):
    return [model.encode(Item(id=str(i), text=t)).input_ids for i, t in enumerate(texts)]


def masses(result):
    """The unnormalised answer probabilities of a result."""
    return np.asarray(result.probs) * result.valid_mass


# ---------------------------------------------------------------- the scorer after the last layer


@pytest.mark.default_model
@pytest.mark.parametrize(
    ("dtype", "tolerance", "relative"), [(torch.float64, 1e-12, 1e-12), (torch.float32, 1e-6, 1e-5)]
)
def test_the_last_layer_is_the_scorer(dtype, tolerance, relative):
    """After the last layer the lens reads the scorer's own hidden states through the same norm
    and head: the same answer probabilities, valid mass, expected value and greedy answer, to
    the arithmetic's own error (float64: ~1e-16; float32: the scorer's, ~1e-7 on a probability,
    ~1e-6 relative on the valid mass)."""
    from probekit.testing.synthetic import tiny_model

    model = tiny_model(dtype=dtype)
    scorer = model.scorer(ANSWERS, epsilon=0.0)
    prompts = encode(model, QUESTIONS)
    found = logit_lens(scorer, prompts, range(model.n_layers))
    with hook_library(model, "transformer_lens"):  # the kernels the lens ran on
        plain = list(scorer.score(prompts))
    for lens, own in zip(found, plain, strict=True):
        last = lens.results[-1]
        assert lens.layers == tuple(range(model.n_layers))
        np.testing.assert_allclose(last.probs, lens.final.probs, atol=tolerance, rtol=0)
        np.testing.assert_allclose(last.probs, own.probs, atol=tolerance, rtol=0)
        assert last.valid_mass == pytest.approx(own.valid_mass, rel=relative)
        assert last.expected == pytest.approx(own.expected, abs=12 * tolerance)
        assert (last.greedy, last.most_probable) == (own.greedy, own.most_probable)
        assert last.error_bound == 0.0


def test_each_layers_distribution_is_a_distribution(tiny):
    """Per layer: probabilities summing to 1 over the answers, a valid mass in (0, 1], the
    expected value and std of those probabilities, the most probable answer their argmax."""
    scorer = tiny.scorer(ANSWERS, epsilon=0.0)
    (lens,) = logit_lens(scorer, encode(tiny, QUESTIONS[:1]), [0, 2, 3])
    values = ANSWERS.values
    for result in lens.results:
        assert result.probs.sum() == pytest.approx(1.0, abs=1e-12)
        assert 0 < result.valid_mass <= 1
        assert result.expected == pytest.approx(float(result.probs @ values))
        spread = float(result.probs @ (values - result.expected) ** 2)
        assert result.std == pytest.approx(np.sqrt(spread))
        assert result.most_probable == ANSWERS.answers[int(np.argmax(result.probs))]
    # the layers read differ: each is its own reading, not a copy of the last
    assert len({round(r.expected, 6) for r in lens.results}) == 3


def test_batched_equals_one_by_one(tiny):
    scorer = tiny.scorer(ANSWERS, epsilon=0.0)
    prompts = encode(tiny, QUESTIONS)
    together = logit_lens(scorer, prompts, [1, 3], batch_size=3)
    alone = logit_lens(scorer, prompts, [1, 3], batch_size=1)
    for a, b in zip(together, alone, strict=True):
        for x, y in zip(a.results, b.results, strict=True):
            np.testing.assert_allclose(x.probs, y.probs, atol=1e-6)
            assert x.valid_mass == pytest.approx(y.valid_mass, rel=1e-5)


def test_a_node_the_run_did_not_feed_is_dropped_mass(tiny):
    """A node the full model prunes (probability 0) is never fed: a layer that gives it mass
    cannot say how its answers end. That mass is the row's error bound; its answers get none;
    every other answer's probability is the one read with the node fed."""
    scorer = tiny.scorer(ANSWERS, epsilon=0.0)
    (prompt,) = encode(tiny, QUESTIONS[:1])
    trie = scorer.trie
    hook = "blocks.1.hook_resid_post"
    locs = [(0, len(prompt) - 1), *((0, node) for node in answer_nodes(scorer))]
    with hook_library(tiny, "transformer_lens"):
        _, values = score_with(scorer, [prompt], reads={hook: locs})
        hidden = values[hook].view(1, len(trie.nodes), -1)
        with torch.inference_mode():
            (whole,) = layer_results(scorer, hidden)
            # node "1" (its answers: 1, 10, 11, 12) left unfed, with everything below it
            node = trie.nodes[0].children[tiny.tokenizer.encode("1", add_special_tokens=False)[0]]
            below = {node} | {i for i, n in enumerate(trie.nodes) if _under(trie, i, node)}
            cut = hidden.clone()
            cut[0, sorted(below)] = torch.nan
            (pruned,) = layer_results(scorer, cut)
            logp_node, _, _ = scorer.read_nodes(hidden)
    lost = [a for a, answer in enumerate(ANSWERS.answers) if answer in ("1", "10", "11", "12")]
    kept = [a for a in range(len(ANSWERS)) if a not in lost]
    # the variant " 1" still reaches the lost answers through its own node
    assert masses(pruned)[kept] == pytest.approx(masses(whole)[kept], rel=1e-12)
    assert (masses(pruned)[lost] < masses(whole)[lost]).all()
    # dropped mass = P(node "1") at this layer, over the valid mass left
    assert pruned.error_bound > 0 and whole.error_bound == 0
    dropped = float(logp_node[0, node].exp())
    assert pruned.error_bound * pruned.valid_mass == pytest.approx(dropped, rel=1e-9)


def _under(trie, index: int, ancestor: int) -> bool:
    parent = trie.nodes[index].parent
    while parent > 0:
        if parent == ancestor:
            return True
        parent = trie.nodes[parent].parent
    return False


def test_the_batch_shrinks_to_the_read_budget(tiny, monkeypatch):
    scorer = tiny.scorer(ANSWERS, epsilon=0.0, batch_size=8)
    per_prompt = 4 * len(scorer.trie.nodes) * tiny.hf.config.hidden_size * 4
    assert lens_module.lens_batch_size(scorer, range(4), None) == 8
    monkeypatch.setattr(lens_module, "READ_BUDGET", 3 * per_prompt)
    assert lens_module.lens_batch_size(scorer, range(4), None) == 3
    assert lens_module.lens_batch_size(scorer, range(4), 2) == 2
    monkeypatch.setattr(lens_module, "READ_BUDGET", 1)
    assert lens_module.lens_batch_size(scorer, range(4), None) == 1


def test_the_function_gives_one_row_per_prompt_and_layer(tiny):
    table = probekit.lens(tiny, QUESTIONS[:2], answers="0-12", layers=[0, -1], quiet=True)
    assert len(table) == 4 and table["layer"].tolist() == [0, 3, 0, 3]
    assert {"prompt_id", "valid_mass", "greedy", "expected", "p::12"} <= set(table.columns)
    scored = probekit.score(tiny, QUESTIONS[:2], answers="0-12", epsilon=0.0)
    last = table[table["layer"] == 3].reset_index(drop=True)
    # the lens runs on the bridge's kernels, the plain score on the model's own
    np.testing.assert_allclose(last["expected"], scored["expected"], atol=1e-5)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        (dict(answers="0-12", layers=[9]), "layer 9 is out of range"),
        (dict(answers="0-12", layers="x"), "layers must be a list of integers"),
        (dict(answers="0-12", batch_size=0), "batch_size must be at least 1 (got 0)"),
        (dict(answers="0-12", layer=[1]), "unknown keyword layer for lens(); did you mean"),
    ],
)
def test_bad_arguments_are_one_line(tiny, keywords, message):
    with pytest.raises(ProbekitError, match=re.escape(message)):
        probekit.lens(tiny, QUESTIONS[:1], **keywords)


# ------------------------------------------------------- against the field's logit lens (A-D)


def peer_masses(model, prompt, answers, logits):
    """P(answer) per layer from per-layer logits [layers, variants, positions, vocab] of the
    sequences prompt + [variant token], one per one-token surface form: the next-token
    probability of the variant at the prompt's last position times the probability, after it,
    of a token that does not extend a letter (the stop rule of the answer's kind)."""
    scorer = model.scorer(answers, epsilon=0.0)
    leaves = scorer.trie.nodes[1:]
    assert scorer.trie.max_depth == 1  # every surface form is one token
    vocab = logits.shape[-1]
    stop = ~extension_masks(model.tokenizer, vocab)[ANSWER_KINDS.index(answers.kind)]
    logp = logits.double().log_softmax(-1)
    out = torch.zeros(logits.shape[0], len(answers), dtype=torch.float64)
    for b, leaf in enumerate(leaves):
        p = logp[:, b, -2, leaf.token].exp() * logp[:, b, -1][:, stop].exp().sum(-1)
        for a in leaf.terminal_for:
            out[:, a] += p
    return out.numpy()


def field_lenses(model, prompt, answers):
    """TransformerLens's logit lens (`accumulated_resid(apply_ln=True)` through the
    unembedding, on the model's TransformerBridge) and a plain nnsight loop (each decoder
    layer's output through the final norm and the LM head), per layer after each block."""
    scorer = model.scorer(answers, epsilon=0.0)
    sequences = torch.tensor([[*prompt, leaf.token] for leaf in scorer.trie.nodes[1:]])
    with torch.no_grad():
        with model.bridged() as bridge:
            _, cache = bridge.run_with_cache(sequences)
            stack = cache.accumulated_resid(apply_ln=True)  # embeddings, then after each block
            transformer_lens = bridge.unembed(stack[1:])
        lm, saved = model.nnsight, []
        with lm.trace(sequences):
            for layer in lm.model.layers:
                out = layer.output
                out = out[0] if isinstance(out, tuple) else out
                saved.append(lm.lm_head(lm.model.norm(out)).save())
        nnsight = torch.stack(list(saved))
    return (
        peer_masses(model, prompt, answers, transformer_lens),
        peer_masses(model, prompt, answers, nnsight),
    )


def check_against_the_field(model, answers):
    (prompt,) = encode(model, [LETTERS])
    scorer = model.scorer(answers, epsilon=0.0)
    (lens,) = logit_lens(scorer, [prompt], range(model.n_layers))
    ours = np.array([masses(r) for r in lens.results])
    transformer_lens, nnsight = field_lenses(model, prompt, answers)
    # TransformerLens runs the bridge's kernels, as the lens does; nnsight the model's own
    np.testing.assert_allclose(ours, transformer_lens, rtol=2e-6, atol=1e-12)
    np.testing.assert_allclose(ours, nnsight, rtol=1e-4, atol=1e-9)
    normalised = ours / ours.sum(-1, keepdims=True)
    np.testing.assert_allclose(normalised, nnsight / nnsight.sum(-1, keepdims=True), atol=1e-5)


@pytest.mark.parametrize("spec", ["A-D", "A-E"])
def test_one_token_answers_match_transformer_lens_and_nnsight_on_the_tiny_model(tiny, spec):
    check_against_the_field(tiny, AnswerSet.parse(spec))


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["A-D", "A-E"])
def test_one_token_answers_match_transformer_lens_and_nnsight_on_the_default_model(smol, spec):
    check_against_the_field(smol, AnswerSet.parse(spec))


# ---------------------------------------------------------------------- the study command


def lens_minimal(model, out, **options):
    return probekit.lens_study(
        minimal_study.MinimalStudy(), model, out=out, days=2, quiet=True, **options
    )


def test_a_lens_run_is_a_run_folder_with_the_studys_headline_per_layer(tiny, tmp_path):
    result = lens_minimal(tiny, tmp_path / "lens", layers=[0, 2, -1])
    files = {p.name for p in result.path.iterdir()}
    assert {"lens.parquet", "summary.csv", "lens.png", "report.html", "manifest.json"} <= files
    assert {"parts", "layers"} <= files and "scores.parquet" not in files  # not a study run
    table = pd.read_parquet(result.path / "lens.parquet")
    assert len(table) == 4 * 3 and sorted(set(table["layer"])) == [0, 2, 3]
    assert table["valid_mass"].dtype == float and table["expected"].dtype == float
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["layers"] == [0, 2, 3] and manifest["epsilon"] == 0.0
    assert manifest["command"] == "probekit.lens_study"
    assert manifest["weights"] == tiny.describe()["weights"] and manifest["seed"] == 0
    assert manifest["versions"]["probekit"] == probekit.__version__
    assert re.fullmatch("[0-9a-f]{40}|unknown", manifest["commit"])
    summary = pd.read_csv(result.path / "summary.csv")
    assert summary["layer"].tolist() == [0, 2, 3] and summary["primary"].all()
    study = minimal_study.MinimalStudy()
    report = {"model": tiny.name, "seed": 0, "view": "exact", "min_valid_mass": 0.0}
    for layer, row in zip(summary["layer"], summary.to_dict("records"), strict=True):
        rows = table[table["layer"] == layer].reset_index(drop=True)
        own = study.headline(rows, tmp_path / f"own{layer}", report)
        assert (row["label"], row["value"]) == (own.label, pytest.approx(own.value))
        means = rows.groupby("name")["expected"].mean()
        assert row["value"] == pytest.approx(means["Alice"] - means["Bob"])
        assert row["mean_valid_mass"] == pytest.approx(rows["valid_mass"].mean())
    # the last layer read is the model's: the page says how close the lens is to the scorer
    page = (result.path / "report.html").read_text()
    assert "After the last layer the lens is the scorer" in page


def test_a_resumed_run_reads_its_parts_back_and_redoes_a_damaged_one(tiny, tmp_path, capsys):
    out = tmp_path / "lens"
    first = lens_minimal(tiny, out, layers=[1, 3], batch_size=2)
    parts = sorted((out / "parts").glob("part-*.parquet"))
    assert len(parts) == 2
    (out / "lens_by_prompt.parquet").unlink()  # the parts merged: the run loop's own
    parts[0].write_bytes(parts[0].read_bytes()[:100])  # a part cut short
    again = lens_minimal(tiny, out, layers=[1, 3], batch_size=2)
    err = capsys.readouterr().err
    assert "is damaged" in err and "2 of 4 prompts of this shard already done" in err
    assert list((out / "parts").glob("*.damaged"))
    columns = ["prompt_id", "layer", "valid_mass", "expected"]
    pd.testing.assert_frame_equal(again.table[columns], first.table[columns], atol=1e-6)


def test_every_prompt_read_back_runs_no_model(tiny, tmp_path, monkeypatch):
    out = tmp_path / "lens"
    first = lens_minimal(tiny, out, layers=[3])

    def refuse(*args, **kwargs):
        raise AssertionError("scored again")

    monkeypatch.setattr(run_lens, "logit_lens", refuse)
    again = lens_minimal(tiny, out, layers=[3])
    pd.testing.assert_frame_equal(again.summary, first.summary)


def test_a_folder_of_another_run_is_refused_before_the_model_loads(tiny, tmp_path):
    out = tmp_path / "lens"
    lens_minimal(tiny, out, layers=[1])
    for options, setting in ((dict(layers=[2]), "layers"), (dict(layers=[1], seed=3), "seed")):
        with pytest.raises(ProbekitError, match=f"holds a run with a different {setting}"):
            probekit.lens_study(
                minimal_study.MinimalStudy(), "no-such-model", out=out, days=2, **options
            )


def test_parts_of_other_settings_are_set_aside(tiny, tmp_path, capsys):
    out = tmp_path / "lens"
    lens_minimal(tiny, out, layers=[1])
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").unlink()  # a manifest deleted: its parts still say what they are
    lens_minimal(tiny, out, layers=[1], seed=5)
    assert "set aside as *.mismatched" in capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["seed"] == 5 != manifest["seed"]


def test_the_patching_run_in_the_folder_is_drawn_beside(tiny_deep, tmp_path):
    """`probekit patch` and `probekit lens` into one folder: the lens's gap of the patched
    pairs per layer, as a share of their gap in the full model, which it reaches after the
    last layer (the lens is the scorer there)."""
    out = tmp_path / "both"
    common = dict(out=out, days=2, quiet=True)
    study = minimal_study.MinimalStudy()
    probekit.patch_study(
        study, tiny_deep, layers=[0, 29], sites=["resid_pre"], bootstrap=20, **common
    )
    result = probekit.lens_study(study, tiny_deep, layers=[0, 15, 29], **common)
    gaps = pd.read_csv(out / "lens_gaps.csv")
    assert result.gaps is not None and gaps["layer"].tolist() == [0, 15, 29]
    patched = pd.read_parquet(out / "patching.parquet")
    assert (gaps["pairs"] == 2).all() and gaps["readout"].eq("expected").all()
    assert gaps["full_gap"].iloc[0] == pytest.approx(patched["gap"].drop_duplicates().mean())
    # after the last layer the lens is the scorer: the pairs' whole gap; but the tiny random
    # model puts almost no mass on the answers, so no layer has a share of the gap (weak signal)
    assert gaps["gap"].iloc[-1] == pytest.approx(gaps["full_gap"].iloc[-1], abs=1e-4)
    assert gaps["share"].isna().all() and result.summary["weak_signal"].all()
    table = result.table
    last = table[table["layer"] == 29].set_index("prompt_id")["expected"]
    pairs = [("0|Alice", "0|Bob"), ("1|Alice", "1|Bob")]
    assert gaps["gap"].iloc[-1] == pytest.approx(np.mean([last[c] - last[k] for c, k in pairs]))
    assert "share of the patched pairs' gap" in (out / "report.html").read_text()
    # each record names its figure's numbers, the numbers the summaries hold
    record = json.loads((out / "patching" / "manifest.json").read_text())
    assert record["figures"] == {"patching.png": ["patching.csv"]}
    drawn = pd.read_csv(out / "patching.csv")["recovery"].dropna()
    summary = pd.read_csv(out / "patching_summary.csv")["recovery"].dropna()
    assert sorted(drawn) == pytest.approx(sorted(summary))
    manifest = json.loads((out / "manifest.json").read_text())
    figures = manifest["figures"]
    assert figures.pop("lens.png") == ["lens.layers.csv", "lens.recovery.csv"]
    assert sorted(figures) == sorted(
        p.relative_to(out).as_posix() for p in out.glob("layers/*/*.png")
    )  # each layer's study report, its figures with their numbers
    assert all(files and all((out / f).is_file() for f in files) for files in figures.values())
    layers = pd.read_csv(out / "lens.layers.csv")
    first = result.summary[result.summary["primary"].astype(bool)].sort_values("layer")
    np.testing.assert_allclose(layers["value"], first["value"])
    assert (layers["depth"] == layers["layer"] + 1).all()


def test_the_command_line_writes_the_folder(tiny, tmp_path, monkeypatch, capsys, minimal):
    monkeypatch.setattr("probekit.engines.load_engine", lambda *a, **k: tiny)
    out = tmp_path / "lens"
    argv = ["lens", "minimal", "--days", "2", "--layers", "0,-1", "--out", str(out), "--quiet"]
    assert cli.main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    assert json.loads((out / "manifest.json").read_text())["command"] == "probekit lens"
    assert pd.read_csv(out / "summary.csv")["layer"].tolist() == [0, 3]


def test_the_studys_options_and_the_lens_options_are_checked_in_one_line(minimal):
    for options, message in (
        (dict(layerz=[0]), "unknown keyword layerz for lens_study('minimal'); did you mean"),
        (dict(min_valid_mass=0.1), "min_valid_mass is an option of intergroup; minimal takes"),
        (dict(days=0), "days must be at least 1"),
        (dict(sites=["resid_pre"]), "unknown keyword sites"),
    ):
        with pytest.raises(ProbekitError, match=re.escape(message)):
            probekit.lens_study("minimal", **options)


@pytest.mark.slow
def test_the_intergroup_delta_after_the_last_layer_is_the_scored_delta(smol, tmp_path):
    """On the default model and intergroup's 0-10 setting: the Δ the lens gives after the last
    layer is the study's Δ of the same prompts scored exactly (on the same kernels), and every
    layer read gives a Δ with its interval."""
    chosen = dict(events=2, setting="P0S1T0")
    result = probekit.lens_study(
        "intergroup", smol, out=tmp_path / "lens", layers=[0, 15, -1], quiet=True, **chosen
    )
    summary = result.summary
    assert summary["layer"].tolist() == [0, 15, smol.n_layers - 1]
    assert summary["value"].notna().all() and (summary["low"] <= summary["high"]).all()
    study = base.get_study("intergroup")
    options = runner("lens").build(chosen, "f", study).study
    probe, items = study.mechanism_items(options, base.Context("lens"))
    encoded = [smol.encode(item) for item in items]
    scorer = smol.scorer(probe.answers, epsilon=0.0)
    with hook_library(smol, "transformer_lens"):
        scored = list(scorer.score([e.input_ids for e in encoded]))
    rows = pd.DataFrame(
        [
            {"prompt_id": e.id, **e.item.key, **r.row(probe.answers)}
            for e, r in zip(encoded, scored, strict=True)
        ]
    )
    report = {**probe.manifest(), "model": smol.name, "seed": 0, "view": "exact"}
    own = study.headline(rows, tmp_path / "own", {**report, "min_valid_mass": 0.0})
    assert summary["value"].iloc[-1] == pytest.approx(own.value, abs=1e-4)
    assert summary["mean_valid_mass"].iloc[-1] == pytest.approx(rows["valid_mass"].mean(), 1e-4)


# ---------------------------------------------------------------------- the page's statistics
def _layers(masses, p_values, notes=None):
    """A lens summary of one headline per layer (layers 0, 1, ...)."""
    n = len(masses)
    return pd.DataFrame(
        {
            "layer": range(n),
            "prompts": 4,
            "mean_valid_mass": masses,
            "mean_error_bound": 0.0,
            "label": "Δ",
            "value": np.linspace(-1, 1, n),
            "low": -2.0,
            "high": 2.0,
            "p_value": p_values,
            "primary": True,
            "reference": 0.0,
            "note": notes or [f"note {k}" for k in range(n)],
        }
    )


def test_layers_get_holm_adjusted_p_and_no_p_or_share_where_weak():
    from probekit.reporting.lens import adjust_layers
    from probekit.stats import holm

    summary = _layers([0.3, 2e-7, 0.4, 0.2], [0.01, 0.001, 0.04, 0.5])
    gaps = pd.DataFrame({"layer": range(4), "gap": 0.1, "full_gap": 0.2, "share": 0.5})
    out, shares = adjust_layers(summary, gaps)
    assert out["weak_signal"].tolist() == [False, True, False, False]
    assert np.isnan(out["p_value"][1]) and np.isnan(out["p_adjusted"][1])
    kept = [0, 2, 3]
    np.testing.assert_allclose(out["p_adjusted"][kept], holm(np.array([0.01, 0.04, 0.5])))
    np.testing.assert_allclose(out["p_adjusted"][kept], [0.03, 0.08, 0.5])
    assert out["note"][1].startswith("weak signal") and out["note"][0] == "note 0"
    assert np.isnan(shares["share"][1]) and shares["share"][[0, 2, 3]].eq(0.5).all()
    assert shares["gap"][1] == 0.1  # the lens's gap itself stays


def test_the_lens_is_drawn_at_the_residual_stream_it_reads():
    """The lens after layer l reads resid_post l = resid_pre l + 1: drawn at x = l + 1, where
    patching at resid_pre l + 1 and resid_post l are; a site inside a block half way through."""
    from probekit.reporting.lens import depth, lens_figure_of

    summary = _layers([0.3, 0.3, 0.3], [0.1, 0.1, 0.1])
    gaps = pd.DataFrame({"layer": [0, 1, 2], "gap": 0.1, "full_gap": 0.2, "share": 0.5})
    recovery = pd.DataFrame(
        {
            "layer": [0, 1, 0, 1, 1],
            "site": ["hook_resid_pre"] * 2 + ["hook_resid_post"] * 2 + ["hook_attn_out"],
            "span": "x",
            "swapped": "x",
            "status": ["trivial", "measured", "measured", "measured", "measured"],
            "recovery": [1.0, 0.5, 0.4, 0.3, 0.2],
        }
    )
    fig = lens_figure_of(summary, gaps, recovery, "model")
    headline, mass, share = fig.axes[:3]
    assert list(headline.lines[0].get_xdata()) == [1, 2, 3]
    assert list(mass.lines[0].get_xdata()) == [1, 2, 3]
    by_label = {line.get_label(): list(np.asarray(line.get_xdata())) for line in share.lines}
    assert by_label["lens"] == [1, 2, 3]
    assert by_label["resid_pre x (x)"] == [0, 1]
    assert by_label["resid_pre x (x): trivial"] == [0, 1]  # grey, dashed, labelled
    assert by_label["resid_post x (x)"] == [1, 2]
    assert by_label["attn_out x (x)"] == [1.5]
    assert depth(3, "blocks.3.hook_resid_post") == depth(4, "hook_resid_pre") == 4
    assert headline.get_xlabel() == "depth: the residual stream before layer x"


def test_the_notes_carry_their_layer_in_layer_order(tmp_path):
    from probekit.reporting.html import summary_notes
    from probekit.reporting.lens import write_lens_page

    layers = [0, 2, 10, 11]
    summary = _layers([0.3] * 4, [0.1] * 4, ["b", "a", "c", ""]).assign(layer=layers)
    assert summary_notes(summary) == ["L0: b", "L2: a", "L10: c"]  # not sorted as strings
    figure = tmp_path / "f.png"
    figure.write_bytes(b"png")
    page = write_lens_page(tmp_path / "r.html", summary, None, figure, "m", {}, "data", None)
    html = page.read_text()
    found = [html.index(f"L{layer}: {note}") for layer, note in zip(layers[:3], "bac", strict=True)]
    assert found == sorted(found)


def test_a_patching_run_of_other_weights_or_without_its_record_is_refused(tiny_deep, tmp_path):
    """The lens reads a patching run in its folder only against that run's record: one made on
    other weights (here its record edited), or with no record, is refused in one line before
    the lens scores anything (it was read by prompt ids alone: a wrong share, no word)."""
    out = tmp_path / "both"
    common = dict(out=out, days=2, quiet=True)
    study = minimal_study.MinimalStudy()
    probekit.patch_study(study, tiny_deep, layers=[0], sites=["resid_pre"], bootstrap=20, **common)
    record = out / "patching" / "manifest.json"
    manifest = json.loads(record.read_text())
    record.write_text(json.dumps({**manifest, "weights": "sha256:other"}))
    with pytest.raises(ProbekitError, match=r"was made with a different weights \('sha256:other'"):
        probekit.lens_study(study, tiny_deep, layers=[0], **common)
    assert not (out / "lens.parquet").exists() and not (out / "parts").exists()
    record.unlink()
    with pytest.raises(ProbekitError, match=r"patching.parquet has no record"):
        probekit.lens_study(study, tiny_deep, layers=[0], **common)
    record.write_text(json.dumps(manifest))  # its own record back: the lens reads it beside
    assert probekit.lens_study(study, tiny_deep, layers=[0], **common).gaps is not None
