"""Activation patching scored by the exact engine: alignment, identities of the method, the two
backends, batching, reproducibility from the stored columns, attention heads, bad input, and the
gap direction."""

import contextlib
import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ANSWERS, EV, REPO, religion_prompt

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.mechanism import directions, patching
from probekit.mechanism import pairs as pairing
from probekit.mechanism.components import Patch, check, grid
from probekit.mechanism.interventions import score_with
from probekit.mechanism.readouts import answer_probability, parse_readout
from probekit.mechanism.sites import DEFAULT_SITES, HEAD_SITE, n_heads
from probekit.studies.intergroup import get_category, get_setting

SETTING = get_setting("P0S0T0")
RELIGION = get_category("religion")
OTHER = "I felt proud when I finished my first marathon."
TOL = 1e-4  # on the 0-12 scale of the test answer set
MODEL = "tiny_deep"  # patching's mechanics: the tiny model of the default model's depth


@pytest.fixture(scope="module")
def pairs(model):
    clean = religion_prompt(model, "a Christian", "a Christian")
    return [(clean, religion_prompt(model, "a Christian", h)) for h in ("a Muslim", "a Jew")]


PATCHES = [
    Patch(1, "hook_resid_pre", "from_experiencer"),
    Patch(1, "hook_attn_out", "experiencer"),
    Patch(2, "hook_mlp_out", "from_experiencer"),
    Patch(3, "hook_resid_post", "experiencer"),
]


@pytest.fixture(scope="module")
def lens(scorer, pairs):
    return patching.sweep(scorer, pairs, PATCHES, EV, batch_size=len(PATCHES) * len(pairs))


@pytest.fixture(scope="module")
def prompt_only(scorer, pairs):
    size = len(PATCHES) * len(pairs)
    return patching.sweep(scorer, pairs, PATCHES, EV, batch_size=size, through_answer=False)


# ---------------------------------------------------------------------- alignment (no model run)
def test_align_is_right_to_left():
    assert pairing.align([5, 6, 7], [9, 10]) == ([6, 7], [9, 10])
    assert pairing.align([4], [8, 9, 10]) == ([4], [10])
    assert pairing.align([1, 2], [3, 4]) == ([1, 2], [3, 4])


def test_spans_of_different_lengths_align_last_token_to_last(model):
    clean = religion_prompt(model, "a Latino", "a Hispanic American")  # 3 experiencer tokens
    corrupt = religion_prompt(model, "a Latino", "a Latino")  # 2
    c_exp = pairing.span_positions(clean, "experiencer")
    k_exp = pairing.span_positions(corrupt, "experiencer")
    assert (len(c_exp), len(k_exp)) == (3, 2)
    c, k = pairing.align(c_exp, k_exp)
    assert c == c_exp[1:] and k == k_exp  # " Hispanic American" onto " a Latino"
    c, k = pairing.align(
        pairing.span_positions(clean, "from_experiencer"),
        pairing.span_positions(corrupt, "from_experiencer"),
    )
    assert c[-1] == len(clean.input_ids) - 1 and k[-1] == len(corrupt.input_ids) - 1
    assert c[0] == c_exp[1] and k[0] == k_exp[0]
    tail = slice(2, None)  # after the experiencer: the same text, so the same tokens
    assert [clean.input_ids[p] for p in c[tail]] == [corrupt.input_ids[p] for p in k[tail]]


# ---------------------------------------------------------------------- identities of the method
def test_clean_equal_to_corrupt_has_no_effect(scorer, pairs):
    same = (pairs[0][0], pairs[0][0])
    df = patching.sweep(scorer, [same], PATCHES, EV, run_noops=True)
    assert df["ran"].all()
    assert (df["expected_patched"] - df["expected_corrupt"]).abs().max() <= TOL
    assert df["recovery"].isna().all()  # 0 / 0
    skipped = patching.sweep(scorer, [same], PATCHES[:1], EV)
    assert not skipped["ran"].any()
    assert (skipped["expected_patched"] == skipped["expected_corrupt"]).all()


def test_patching_every_position_at_layer0_resid_pre_gives_the_clean_run(scorer, pairs):
    clean, corrupt = pairs[0]
    assert len(clean.input_ids) == len(corrupt.input_ids)
    hook = "blocks.0.hook_resid_pre"
    everything = list(range(len(clean.input_ids)))
    (want,), acts = score_with(
        scorer, [clean.input_ids], reads={hook: [(0, p) for p in everything]}
    )
    new = acts[hook]
    (got,), _ = score_with(
        scorer, [corrupt.input_ids], edits={hook: ([(0, p) for p in everything], lambda old: new)}
    )
    assert abs(got.expected - want.expected) <= 1e-6
    np.testing.assert_allclose(got.probs, want.probs, atol=1e-7)
    df = patching.sweep(scorer, pairs[:1], [Patch(0, "hook_resid_pre", "from_experiencer")], EV)
    assert abs(df["expected_patched"][0] - df["expected_clean"][0]) <= TOL
    assert abs(df["recovery"][0] - 1) <= 1e-2


def test_a_perceiver_patch_is_a_noop_and_not_run(scorer, pairs):
    df = patching.sweep(scorer, pairs[:1], [Patch(5, "hook_resid_post", "perceiver")], EV)
    assert not df["ran"][0] and df["recovery"][0] == 0
    assert df["clean_positions"][0] == df["corrupt_positions"][0]


# ---------------------------------------------------------------------- backends and batching
def test_transformer_lens_and_nnsight_agree(scorer, pairs, prompt_only):
    """On the prompt: nnsight's hooks reach the prompt pass only."""
    other = patching.sweep(scorer, pairs, PATCHES, EV, hooks="nnsight", batch_size=8)
    assert prompt_only["ran"].all() and other["ran"].all()
    assert (prompt_only["expected_patched"] - other["expected_patched"]).abs().max() <= TOL
    moved = prompt_only["expected_patched"] - prompt_only["expected_corrupt"]
    assert moved.abs().max() > 1e-3  # the patches do act
    with pytest.raises(ProbekitError, match="answer positions are read and written"):
        patching.sweep(scorer, pairs[:1], PATCHES[:1], EV, hooks="nnsight", through_answer=True)


def test_sweep_batched_equals_one_by_one(scorer, pairs, lens):
    """`lens` ran its 8 patches in one forward; here two of them per pair, one at a time."""
    single = patching.sweep(scorer, pairs, PATCHES[:2], EV, batch_size=1)
    batched = lens[lens["site"].isin(single["site"])].reset_index(drop=True)
    assert lens["site"].isin(["hook_resid_pre", "hook_attn_out"]).any()
    assert len(batched) == len(single) == 4
    for column in ("expected_clean", "expected_corrupt", "expected_patched"):
        assert (batched[column] - single[column]).abs().max() <= TOL
    assert batched["clean_positions"].tolist() == single["clean_positions"].tolist()


def test_rows_are_reproducible_from_their_columns(model, scorer, prompt_only):
    """Recompute one prompt-only row with plain torch hooks on the HF decoder layers, from the
    text only."""
    row = prompt_only.iloc[0]  # hook_resid_pre at layer 1: the input of decoder layer 1
    assert (row["site"], row["layer"]) == ("hook_resid_pre", 1)
    tok = model.tokenizer
    clean = tok(row["clean_prompt"], add_special_tokens=False)["input_ids"]
    corrupt = tok(row["corrupt_prompt"], add_special_tokens=False)["input_ids"]
    layer = model.hf.model.layers[1]
    seen = {}

    def keep(module, args, kwargs):
        seen["x"] = args[0][0, list(row["clean_positions"])].clone()

    def put(module, args, kwargs):
        x = args[0].clone()
        shift = x.shape[1] - len(corrupt)
        x[0, [shift + p for p in row["corrupt_positions"]]] = seen["x"]
        return (x, *args[1:]), kwargs

    for ids, fn in ((clean, keep), (corrupt, put)):

        @contextlib.contextmanager
        def prompt_pass_only(fn=fn):
            handle = layer.register_forward_pre_hook(fn, with_kwargs=True)
            try:
                yield
            finally:
                handle.remove()

        (result,) = scorer.score_batch([ids], reuse_prefix=False, prompt_context=prompt_pass_only)
    assert abs(result.expected - row["expected_patched"]) <= TOL


# ---------------------------------------------------------------------- attention heads
HEADS = [Patch(2, HEAD_SITE, "experiencer", 3), Patch(4, HEAD_SITE, "from_experiencer", 0)]


def test_head_patching_transformer_lens_and_nnsight_agree(scorer, pairs):
    lens = patching.sweep(scorer, pairs[:1], HEADS, EV, through_answer=False)
    other = patching.sweep(scorer, pairs[:1], HEADS, EV, hooks="nnsight")
    assert lens["ran"].all() and lens["head"].tolist() == [3, 0]
    assert (lens["expected_patched"] - other["expected_patched"]).abs().max() <= TOL
    assert (
        lens["expected_patched"] - lens["expected_corrupt"]
    ).abs().max() > 1e-4  # the heads do act
    assert (lens["method"] == "exact").all() and lens["estimate"].isna().all()


def test_all_heads_of_a_layer_equal_its_attention_output(scorer, pairs, model):
    """hook_z of every head at once (head None), every head one by one in a batch, and
    hook_attn_out: all heads patched together is the attention output patched."""
    both = [Patch(3, HEAD_SITE, "from_experiencer"), Patch(3, "hook_attn_out", "from_experiencer")]
    df = patching.sweep(scorer, pairs[:1], both, EV)
    assert abs(df["expected_patched"][0] - df["expected_patched"][1]) <= TOL
    assert abs(df["expected_patched"][0] - df["expected_corrupt"][0]) > 1e-4
    heads = grid([3], [HEAD_SITE], ["from_experiencer"], range(n_heads(model)))
    assert len(heads) == n_heads(model) and heads[-1].name == "L3 H8 from_experiencer"


def test_head_heatmap_writes_a_png(tmp_path):
    from probekit.mechanism.plots import head_heatmap

    summary = pd.DataFrame(
        [
            {"layer": layer, "head": head, "span": span, "recovery": 0.1 * head - 0.2}
            for layer in (0, 3, 7)
            for head in range(9)
            for span in ("experiencer", "from_x")
        ]
    )
    assert head_heatmap(summary, tmp_path / "h.png", title="t").stat().st_size > 1000
    with pytest.raises(ProbekitError, match="no per-head"):
        head_heatmap(summary.assign(head=None), tmp_path / "q.png")


def test_position_heatmap_puts_each_position_in_its_cell(tmp_path):
    """One stacked panel per (site, span) in the order of `sites`; cell (layer, position)."""
    from probekit.mechanism.plots import position_heatmap, position_heatmap_figure

    summary = pd.DataFrame(
        [
            {
                "layer": layer,
                "site": f"blocks.{layer}.{site}",
                "span": f"experiencer@{i}",
                "recovery": 0.1 * layer + 0.01 * i,
            }
            for layer in (0, 3)
            for site in ("hook_mlp_out", "hook_resid_pre")
            for i in (-3, -2, -1)
        ]
    )
    sites = ["hook_resid_pre", "hook_mlp_out"]
    assert position_heatmap(summary, tmp_path / "p.png", sites=sites).stat().st_size > 1000
    fig = position_heatmap_figure(summary, sites=sites)
    panels = [ax for ax in fig.axes if ax.images and ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["resid_pre experiencer", "mlp_out experiencer"]
    grid = panels[0].images[0].get_array()
    assert grid.shape == (2, 3) and grid[1, 0] == pytest.approx(0.3 - 0.03)
    with pytest.raises(ProbekitError, match="no per-position"):
        position_heatmap(summary.assign(span="experiencer"), tmp_path / "q.png")


# ---------------------------------------------------------------------- bad input
def test_bad_inputs_raise_one_clear_error(model, pairs):
    cases = {
        "out of range": [Patch(model.n_layers, "hook_resid_pre", "experiencer")],
        "unknown site": [Patch(0, "hook_resid_mid_x", "experiencer")],
        "unknown span": [Patch(0, "hook_resid_pre", "event_and_more")],
        "head 9 is out of range": [Patch(0, HEAD_SITE, "experiencer", 9)],
        "a head index needs the site": [Patch(0, "hook_attn_out", "experiencer", 1)],
    }
    for message, patches in cases.items():
        with pytest.raises(ProbekitError, match=message):
            check(model, pairs, patches)
    missing = religion_prompt(model, "a Christian", "a Jew", spans={"perceiver"})
    with pytest.raises(ProbekitError, match="unknown span 'from_experiencer'"):
        check(model, [(pairs[0][0], missing)], PATCHES[:1])
    elsewhere = religion_prompt(model, "a Christian", "a Jew", text=OTHER, event_id="e2")
    with pytest.raises(ProbekitError, match="must share its unit"):
        check(model, [(pairs[0][0], elsewhere)], PATCHES[:1])


def test_metrics_as_a_parameter(scorer, pairs):
    """P(answer) and a difference of two: recovery and the pair's gap use the chosen metric."""
    p7 = answer_probability(ANSWERS, "7")
    df = patching.sweep(scorer, pairs[:1], PATCHES[:2], p7)
    assert {"p_clean", "p_corrupt", "p_patched"} <= set(df.columns)
    assert (df["readout"] == "p:7").all() and "metric" not in df
    assert ((df["p_clean"] >= 0) & (df["p_clean"] <= 1)).all()
    diff = patching.sweep(scorer, pairs[:1], PATCHES[:2], parse_readout("p:7 - p:5", ANSWERS))
    p5 = patching.sweep(scorer, pairs[:1], PATCHES[:2], answer_probability(ANSWERS, "5"))
    np.testing.assert_allclose(diff["diff_patched"], df["p_patched"] - p5["p_patched"], atol=1e-9)
    np.testing.assert_allclose(diff["gap"], diff["diff_clean"] - diff["diff_corrupt"])


def test_tv_metric_reads_the_pairs_two_distributions(scorer, pairs):
    """`tv`: 1 on the clean prompt, gap = TV(clean, corrupt) from plain scores; patching the
    whole sequence at layer 0 restores the clean distribution (recovery 1)."""
    tv = parse_readout("tv", ANSWERS)
    patches = [Patch(0, "hook_resid_pre", "from_experiencer"), *PATCHES[:2]]
    df = patching.sweep(scorer, pairs, patches, tv)
    assert (df["overlap_clean"] == 1).all() and (df["readout"] == "tv").all()
    for clean, corrupt in pairs:
        a, b = scorer.score([clean.input_ids, corrupt.input_ids])
        want = 0.5 * np.abs(a.probs - b.probs).sum()
        gaps = df.loc[df["corrupt_prompt_id"] == corrupt.id, "gap"].to_numpy()
        assert want > 1e-4 and len(gaps) == len(patches)
        # the sweep scores every pair's baselines in one batch, the reference two prompts: the
        # batch's shape moves each fp32 probability by up to ~1e-6, and TV sums 11 of them
        # (1.8e-6 seen on a gap of 0.039)
        np.testing.assert_allclose(gaps, want, atol=1e-5)
    first = df[df["layer"] == 0]
    assert ((first["recovery"] - 1).abs() <= 1e-2).all()
    with pytest.raises(ProbekitError, match="compares a pair"):
        tv(next(scorer.score([pairs[0][0].input_ids])), pairs[0][0].item)
    with pytest.raises(ProbekitError, match="no part in a difference"):
        parse_readout("tv - p:3", ANSWERS)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("p:13", "not an answer"),
        ("median", "unknown readout"),
        ("expected - p:99", "not an answer"),
    ],
)
def test_bad_readouts(spec, message):
    with pytest.raises(ProbekitError, match=message):
        parse_readout(spec, ANSWERS)
    with pytest.raises(ProbekitError, match="needs numeric answers"):
        parse_readout("expected", AnswerSet.parse("A,B,C,D"))


def test_the_expected_value_readout_has_one_name():
    assert parse_readout("expected", ANSWERS).column == "expected"
    with pytest.raises(ProbekitError, match="unknown readout 'ev'"):
        parse_readout("ev", ANSWERS)


def test_sweep_columns_name_what_differs(lens):
    """Key columns equal within every pair appear once; the one that differs appears twice."""
    assert {"event_id", "emotion", "perceiver"} <= set(lens.columns)
    assert {"clean_experiencer", "corrupt_experiencer"} <= set(lens.columns)
    assert "experiencer" not in lens.columns
    assert (lens["clean_prompt_id"].str.count(r"\|") == 4).all()


@pytest.mark.slow
@pytest.mark.parametrize("flag", [["--layers", "0,30"], ["--sites", "hook_resid_mid"]])
def test_script_reports_bad_input_in_one_line(model, tmp_path, flag):
    run = subprocess.run(
        [sys.executable, str(REPO / "hooks" / "patch_gap.py"), "--out", str(tmp_path), *flag],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("patch_gap: error:")]
    assert len(errors) == 1 and "Traceback" not in run.stderr
    assert not (tmp_path / "patching.parquet").exists()


# ---------------------------------------------------------------------- gap direction and plot
def test_projection_on_the_direction_predicts_a_planted_gap():
    """States = gap x a fixed direction + noise: every layer's r is high, and exactly 1
    without noise; the difference of means points along the planted direction."""
    rng = np.random.default_rng(0)
    rows = [
        {"event_id": e, "perceiver": p, "experiencer": x, "in_group": p == x}
        for e in ("e1", "e2")
        for p in RELIGION.named
        for x in RELIGION.named
    ]
    frame = pd.DataFrame(rows).rename(columns={"in_group": "contrast"})
    frame["value"] = 50 + 3 * frame["contrast"] + rng.normal(0, 1, len(frame))
    frame["gap"] = frame["value"] - frame.groupby(["event_id", "perceiver"])["value"].transform(
        "mean"
    )
    axis = rng.normal(size=16)
    axis /= np.linalg.norm(axis)
    clean = frame["value"].to_numpy()[:, None] * axis
    noisy = clean + rng.normal(0, 0.05, clean.shape)
    states = directions.States(frame, np.stack([clean, noisy], axis=1), [0, 1], "experiencer")
    fit = directions.projection_fit(states, frame["event_id"], ["event_id", "perceiver"])
    assert fit["cross_validated"].all()
    assert fit["r"][0] == pytest.approx(1.0) and fit["r"][1] > 0.9
    d = directions.diff_of_means(clean, frame["contrast"].to_numpy())
    assert abs(d @ axis) == pytest.approx(1.0)
    with pytest.raises(ProbekitError):
        directions.diff_of_means(clean, np.ones(len(frame), dtype=bool))


def test_patching_heatmap_writes_a_png(tmp_path):
    from probekit.mechanism.plots import patching_heatmap

    summary = pd.DataFrame(
        [
            {"layer": layer, "site": f"blocks.{layer}.{site}", "span": span, "recovery": r}
            for layer in (0, 5)
            for site in DEFAULT_SITES
            for span, r in zip(
                ("experiencer", "perceiver", "from_experiencer"), (0.5, 0.0, 1.2), strict=True
            )
        ]
    )
    path = patching_heatmap(summary, tmp_path / "p.png", title="test")
    assert path.stat().st_size > 1000
    with pytest.raises(ProbekitError):
        patching_heatmap(summary.iloc[:0], tmp_path / "q.png")


def test_score_with_reads_before_editing(scorer, pairs):
    ids = pairs[0][1].input_ids
    hook = "blocks.2.hook_mlp_out"
    locs = [(0, 3), (0, 4)]
    _, before = score_with(scorer, [ids], reads={hook: locs})
    _, during = score_with(
        scorer, [ids], reads={hook: locs}, edits={hook: (locs, torch.zeros_like)}
    )
    torch.testing.assert_close(before[hook], during[hook])


def test_patch_command_end_to_end(tiny_bridged, tmp_path, patch_cli, capsys):
    """`probekit patch intergroup` on one event: the patching table, its figure, the direction
    and the causal check; prompt ids are the study's item ids (on the 4-layer tiny model)."""
    model = tiny_bridged
    argv = ["intergroup", "--layers", "0,3", "--out", str(tmp_path)]  # the first 2 events
    argv += ["--sets-per-unit", "1", "--controls", "2", "--bootstrap", "50"]
    assert patch_cli(model, *argv, "--sites", "hook_resid_pre", "--setting", "P0S1T0") == 0
    df = pd.read_parquet(tmp_path / "patching.parquet")
    # one identity pair per event drawn at random: its two 2x2 sets, 8 pairs x layers x spans
    assert len(df) == 2 * 8 * 2 * 3
    assert set(df["span"]) == {"experiencer", "perceiver", "from_experiencer"}
    assert df["clean_prompt_id"].str.startswith("religion|P0S1T0|").all()
    assert set(df["contrast"]) == {"interaction"} and set(df["sign"]) == {1, -1}
    assert df.attrs["selection"] == "random 1 per event, seed 0"
    summary = pd.read_csv(tmp_path / "patching_summary.csv")  # what a reader needs to redo it
    record = summary[["contrast", "resampled", "selection", "adjustment"]].drop_duplicates()
    assert record.values.tolist() == [
        ["interaction", "event", "random 1 per event, seed 0", "holm"]
    ]
    check = json.loads((tmp_path / "causal_check.json").read_text())
    assert check["folds"] == 2 and check["controls"] == 2 and "shrink_low" in check
    for name in ("patching.png", "directions.parquet", "causal_check.json"):
        assert (tmp_path / name).is_file()
    printed = capsys.readouterr().out
    assert "6 components (2 layers) x 16 pairs in 4 interaction sets on 2 events" in printed
    assert "of 12 components (layer, site, span)" in printed


def test_patch_with_mediation_writes_the_direct_effects(tiny_bridged, tmp_path, patch_cli, capsys):
    """`--mediation` adds mediation.parquet and its summary, and says the top components' share
    of the total effect (on the 4-layer tiny model)."""
    model = tiny_bridged
    argv = ["intergroup", "--layers", "0", "--sites", "hook_resid_pre", "--spans", "experiencer"]
    argv += ["--sets-per-unit", "1", "--bootstrap", "20", "--mediation", "--skip-direction"]
    assert patch_cli(model, *argv, "--out", str(tmp_path), "--setting", "P0S1T0") == 0
    effects = pd.read_parquet(tmp_path / "mediation.parquet")
    assert {"total", "indirect", "direct"} <= set(effects.columns) and len(effects)
    summary = pd.read_csv(tmp_path / "mediation_summary.csv")
    assert {"indirect", "indirect_low", "share"} <= set(summary.columns)
    assert "indirect effects carry" in capsys.readouterr().out


def test_patch_study_is_the_command_as_a_function(tiny_bridged, tmp_path):
    import probekit

    model = tiny_bridged
    result = probekit.patch_study(
        "intergroup",
        model,
        out=tmp_path,
        limit=25,  # one event: 5 x 5 named pairs
        layers=[0],
        sites=["resid_pre"],
        spans=["from_experiencer", "experiencer"],
        setting="P0S1T0",
        skip_direction=True,
        bootstrap=50,
        sets_per_unit=1,
    )
    assert result.path == tmp_path and "patching.parquet" in result.files
    assert len(result.table) == 8 * 2 and set(result.table["site"]) == {"hook_resid_pre"}
    assert {"recovery", "recovery_low", "recovery_high", "pairs_in_noise"} <= set(result.summary)
    assert len(result.summary) == 2 * 2 and (result.summary["pairs"] == 4).all()
    # its record, apart from the files a lens run of the folder may share
    assert {"patching/manifest.json", "patching/report.html"} <= set(result.files)
    record = json.loads((tmp_path / "patching" / "manifest.json").read_text())
    assert record["weights"] == model.describe()["weights"] and record["seed"] == 0
    assert record["selection"] == "random 1 per event, seed 0" and len(record["sets"]) == 2
    assert (record["sites"], record["layers"]) == (["resid_pre"], [0])
    assert record["versions"]["torch"] == torch.__version__
    assert re.fullmatch("[0-9a-f]{40}|unknown", record["commit"])
    page = (tmp_path / "patching" / "report.html").read_text()
    assert f"<th>commit</th><td><code>{record['commit']}</code>" in page
    assert "<summary>versions</summary>" in page and "<summary>sets</summary>" in page


def test_patch_study_refuses_bad_options_in_one_line():
    import probekit

    for options, message in (
        (
            dict(layerz=[0]),
            "unknown keyword layerz for patch_study('intergroup'); did you mean layers?",
        ),
        (dict(layers="x"), "layers must be a list of integers (got 'x')"),
        (dict(prompt_only="yes"), "prompt_only must be True or False (got 'yes')"),
        (dict(method="magic"), "method: unknown method 'magic'; choose one of exact"),
        (dict(batch_size=-1), "batch_size must be at least 1 (got -1)"),
    ):
        with pytest.raises(ProbekitError, match=re.escape(message)):
            probekit.patch_study("intergroup", **options)


def test_keywords_are_the_commands_options():
    """patch_study's keywords and probekit patch's flags read the same declarations."""
    from probekit.mechanism.pipeline import PatchOptions
    from probekit.run import runner
    from probekit.studies import get_study

    patch, intergroup = runner("patch"), get_study("intergroup")
    keywords = {"layers": range(0, 2), "prompt_only": True, "readout": "p:5", "top_k": 3}
    options = patch.build(keywords, "patch_study", intergroup).own
    argv = ["--layers", "0,1", "--prompt-only", "--readout", "p:5", "--top-k", "3"]
    parsed = patch.parse(argv, "probekit patch", intergroup).own
    assert isinstance(options, PatchOptions) and options == parsed
    assert (options.layers, options.through_answer, options.readout) == ([0, 1], False, "p:5")
    default = patch.build({}, "patch_study", intergroup).own
    assert str(default.out) == "runs/patch" and default.hooks == "transformer_lens"


# ---------------------------------------------------------------------- through the answer
README_CLEAN = "I am a Muslim. My bike was stolen. How angry am I, from 0 to 10?"
README_CORRUPT = "I am a Jew. My bike was stolen. How angry am I, from 0 to 10?"


@pytest.fixture(scope="module")
def readme_pair(model):
    return pairing.make_pair(model, README_CLEAN, README_CORRUPT, span="Muslim")


@pytest.mark.parametrize(
    ("readout", "layers"),
    [("expected", [0, 14, 29]), ("p:5", [0, 29]), ("tv", [29]), ("p:5 - p:3", [29])],
)
def test_patching_from_the_span_through_the_answer_recovers_every_readout(
    model, readme_pair, readout, layers
):
    """The README's pair: everything from the identity on, answer positions included, at
    hook_resid_pre of any layer is the clean run, so recovery is 1 to float noise."""
    import probekit

    df = probekit.patch(
        model,
        readme_pair,
        spans=["from_identity"],
        sites=["resid_pre"],
        layers=layers,
        readout=readout,
        answers="0-10",
        progress=False,
    )
    assert df["ran"].all() and (df["gap"].abs() > 1e-4).all()
    assert (df["noise"] > 0).all() and (df["noise"] < 1e-4).all() and not df["small_gap"].any()
    np.testing.assert_allclose(df["recovery"], 1.0, atol=1e-3)
    m = parse_readout(readout, AnswerSet.parse("0-10")).column
    np.testing.assert_allclose(df[f"{m}_patched"], df[f"{m}_clean"], atol=1e-5)


@pytest.mark.slow
def test_the_prompt_only_patch_misses_the_answer_positions_at_late_layers(smol, readme_pair):
    """Prompt positions alone at the last layer leave the answer's later tokens on the corrupt
    run below it: recovery is not 1 there (the old behaviour, kept as through_answer=False). On
    the default model: the tiny one's stop probabilities hardly depend on the answer positions."""
    import probekit

    both = {
        through: probekit.patch(
            smol,
            readme_pair,
            spans=["from_identity"],
            sites=["resid_pre"],
            layers=[29],
            answers="0-10",
            through_answer=through,
            progress=False,
        )
        for through in (True, False)
    }
    assert abs(both[True]["recovery"][0] - 1) <= 1e-3
    assert abs(both[False]["recovery"][0] - 1) > 0.05


def test_distributions_sit_beside_the_readout(model, readme_pair):
    import probekit

    df = probekit.patch(
        model,
        readme_pair,
        spans=["from_identity", "identity"],
        sites=["resid_pre"],
        layers=[3],
        answers="0-10",
        distributions=True,
        progress=False,
    )
    assert df.attrs["answers"] == [str(i) for i in range(11)]
    for run in ("clean", "corrupt", "patched"):
        assert (df[f"valid_mass_{run}"] > 0).all() and (df[f"valid_mass_{run}"] <= 1 + 1e-9).all()
        assert all(abs(p.sum() - 1) < 1e-9 for p in df[f"probs_{run}"])
    full = df[df["span"] == "from_identity"].iloc[0]
    np.testing.assert_allclose(full["probs_patched"], full["probs_clean"], atol=1e-6)
    values = np.arange(11)
    for _, row in df.iterrows():
        assert row["expected_patched"] == pytest.approx(row["probs_patched"] @ values, abs=1e-9)


def test_a_sweep_reports_its_progress(scorer, pairs):
    class Bar:
        total = 0

        def update(self, n):
            self.total += n

        def close(self):
            self.closed = True

    bar = Bar()
    patching.sweep(scorer, pairs[:1], PATCHES[:2], EV, progress=bar)
    assert bar.total == 2 + 2 and bar.closed  # two baselines (scored twice: noise), two patches


# ---------------------------------------------------------------------- recovery over pairs
def _table(gaps, effects, noise=1e-6):
    rows = []
    for i, (gap, effect) in enumerate(zip(gaps, effects, strict=True)):
        rows.append(
            {
                "unit": f"u{i}",
                "set": f"s{i}",
                "sign": 1,
                "swapped": "identity",
                "status": "measured",
                "clean_prompt_id": f"c{i}",
                "corrupt_prompt_id": f"k{i}",
                "layer": 3,
                "site": "hook_resid_pre",
                "head": None,
                "span": "from_identity",
                "expected_clean": gap,
                "expected_corrupt": 0.0,
                "expected_patched": effect,
                "gap": gap,
                "recovery": effect / gap,
                "ran": True,
                "method": "exact",
                "estimate": np.nan,
                "noise": noise,
                "small_gap": abs(gap) <= noise,
            }
        )
    df = pd.DataFrame(rows)
    df["head"] = df["head"].astype("Int64")
    return df


def test_recovery_over_pairs_is_a_ratio_of_means():
    """One pair with a small gap blew the mean of ratios up (13.5 in the issue); the ratio of the
    mean effect to the mean gap stays at the pairs' common scale."""
    df = _table([1.0, 0.8, -0.02], [1.2, 1.0, -0.27])
    assert df["recovery"].mean() > 4  # the old figure
    summary = patching.summarise(df, n=200)
    want = (1.2 + 1.0 - 0.27) / (1.0 + 0.8 - 0.02)
    assert summary["recovery"][0] == pytest.approx(want)
    assert summary["recovery_low"][0] <= want <= summary["recovery_high"][0]
    assert summary["pairs"][0] == 3 and summary["pairs_in_noise"][0] == 0


def test_pairs_within_the_noise_are_left_out_with_one_line():
    import probekit

    df = _table([1.0, 0.8, 1e-7], [0.5, 0.4, 3e-7])
    summary = probekit.recovery(df, n=100)
    assert summary["recovery"][0] == pytest.approx(0.5)
    assert summary["pairs_in_noise"][0] == 1
    assert summary.attrs["note"] == (
        "1 of 3 pairs have a gap within the run's numeric noise (|gap| <= 1e-06) and are left "
        "out of recovery"
    )
    assert patching.noise_line(_table([1.0], [0.5])) is None
    with pytest.raises(ProbekitError, match=r"table must be a DataFrame \(got \[1, 2\]\)"):
        probekit.recovery([1, 2])


def test_a_reading_of_each_recovery_outside_zero_to_one():
    assert "overshoots" in patching.OVERSHOOT and "away from the clean run" in patching.AWAY
    assert patching.reading(1.6) == patching.OVERSHOOT
    assert patching.reading(-0.3) == patching.AWAY
    assert patching.reading(0.0) == patching.reading(0.4) == patching.reading(1.0) == ""
    assert patching.reading(np.nan) == ""
    assert patching.reading(2.0, small_gap=True) == patching.IN_NOISE
    # within the run's noise of [0, 1] (the noise over the gap) is not outside it
    assert patching.reading(1.000002, tolerance=2e-5) == patching.reading(-1e-6, tolerance=2e-5)
    assert patching.reading(1.000002, tolerance=2e-5) == ""
    assert patching.reading(1.0001, tolerance=2e-5) == patching.OVERSHOOT


def test_the_table_carries_an_interval_over_several_pairs_and_a_reading():
    df = _table([1.0, 0.8, 1.0, 1e-7], [1.2, 0.4, -0.3, 3e-7])  # the last pair is noise
    out = patching.annotate(df, n=200)
    want = (1.2 + 0.4 - 0.3) / (1.0 + 0.8 + 1.0)
    assert out["recovery_over_pairs"].tolist() == pytest.approx([want] * 4)
    low, high = out["recovery_over_pairs_low"][0], out["recovery_over_pairs_high"][0]
    assert low < want < high
    assert out["recovery_over_pairs_low"].nunique() == 1  # one component: one interval
    assert out["reading"].tolist() == [patching.OVERSHOOT, "", patching.AWAY, patching.IN_NOISE]
    assert out["recovery"].tolist() == df["recovery"].tolist()  # each pair's own stays
    summary = patching.summarise(df, n=200)
    assert summary["gap"][0] == pytest.approx(2.8 / 3) and summary["reading"][0] == ""
    noisy = patching.annotate(_table([0.5, 0.5], [0.5 + 4e-6, 0.5 - 4e-6], noise=1e-5))
    assert noisy["recovery"].max() > 1 and noisy["reading"].tolist() == ["", ""]
    assert out.attrs["note"].startswith("recovery_over_pairs: each component's mean effect")
    assert "across the 4 pairs" in out.attrs["note"]
    assert out.attrs["note"].endswith(
        "1 of 4 pairs have a gap within the run's numeric noise "
        "(|gap| <= 1e-06) and are left out of recovery"
    )


def test_one_pair_says_it_has_no_interval():
    out = patching.annotate(_table([1.0], [1.7]))
    assert out[["recovery_over_pairs", "recovery_over_pairs_low"]].isna().all().all()
    assert out["reading"][0] == patching.OVERSHOOT
    assert out.attrs["note"].startswith(
        "one pair: each recovery is that pair's alone, with no interval over pairs"
    )


@pytest.mark.slow
def test_the_readme_persona_pair_reads_as_documented(smol):
    """README.md and docs/mechanism.md ("Reading a patching table") quote these figures."""
    import probekit

    model = smol

    event = {"role": "user", "content": "My bike was stolen. How angry am I, from 0 to 10?"}
    clean, corrupt = (
        [{"role": "system", "content": f"You are a {who}."}, event] for who in ("Muslim", "Jew")
    )
    pair = probekit.make_pair(model, clean, corrupt, span="Muslim")
    df = probekit.patch(
        model,
        pair,
        spans=["identity"],
        sites=["resid_pre"],
        layers=range(30),
        answers="0-10",
        progress=False,
    )
    r = df["recovery"].to_numpy()
    assert df["gap"][0] == pytest.approx(0.48, abs=0.005)
    assert (df["noise"] < 5e-5).all() and not df["small_gap"].any()
    assert r[[0, 6, 12, 18, 24]] == pytest.approx([1.0, 0.90, 0.90, 0.49, 0.04], abs=0.006)
    assert r[1:16].min() >= 0.735 and r[1:16].max() <= 0.985
    assert r[16:24].min() >= 0.405 and r[16:24].max() <= 0.535
    assert (r[25:] < 0).all() and (r[25:] >= -0.0105).all()
    assert abs(r[0] - 1) < 1e-4
    assert df["reading"].tolist() == [""] * 25 + [patching.AWAY] * 5
    assert df.attrs["note"].startswith("one pair: each recovery is that pair's alone")
    assert df["recovery_over_pairs"].isna().all()


def test_which_positions_each_span_patches(model, readme_pair):
    """Spans that run to the end take the answer positions along; one position does not."""
    from probekit.mechanism.components import make_job

    expect = {
        "identity": False,
        "from_identity": True,
        "answer": True,
        "answer@-1": False,
        "from_identity@-1": False,
    }
    for span, answer in expect.items():
        job = make_job(0, readme_pair, Patch(3, "hook_resid_pre", span))
        assert job.answer is answer, span
        assert not make_job(0, readme_pair, Patch(3, "hook_resid_pre", span), False).answer
