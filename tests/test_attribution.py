"""Attribution patching on the exact metric: the differentiable distribution equals the engine's
and the brute force; its gradient equals a finite difference of the engine on the real model;
the estimate of a tiny interpolation equals its exact effect; verification, ranking, bad input."""

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ANSWERS, EV, religion_prompt

from probekit.core.errors import ProbekitError
from probekit.mechanism import attribution, patching
from probekit.mechanism import pairs as pairing
from probekit.mechanism.components import Patch, check, make_job
from probekit.mechanism.interventions import score_with
from probekit.mechanism.readouts import Readout, parse_readout
from probekit.mechanism.sites import HEAD_SITE
from probekit.testing.reference import brute_force

PATCHES = [
    Patch(3, "hook_resid_pre", "experiencer"),
    Patch(2, HEAD_SITE, "from_experiencer", 3),
    Patch(3, "hook_mlp_out", "perceiver"),  # in the shared prefix: a no-op, estimate 0
]


MODEL = "tiny_bridged"  # the method's mechanics on the tiny model (4 layers)


def _pair(model):
    clean = religion_prompt(model, "a Christian", "a Christian")
    return clean, religion_prompt(model, "a Christian", "a Muslim")


@pytest.fixture(scope="module")
def pair(model):
    return _pair(model)


@pytest.fixture(scope="module")
def estimated(scorer, pair):
    return attribution.attribute(scorer, [pair], PATCHES, EV)


@pytest.fixture(scope="module")
def exact64(model):
    """The module's model in float64, its scorer, the pair and their estimates. The derivative
    tests take differences of the metric of order 1e-4, where fp32 rounding (about 1e-5 of the
    expected value, dependent on the BLAS kernel and thread count) would decide the outcome
    instead of the method; a one-sided step in fp32 failed on another machine this way. `model`
    is requested so that the module skips without the default model's tokenizer."""
    from probekit.engines.hf.scorer import HFScorer
    from probekit.testing.synthetic import SMOL_DEPTH, tiny_model

    model = tiny_model(dtype=torch.float64, **SMOL_DEPTH)
    model.enable_bridge()
    scorer = HFScorer(model, ANSWERS, epsilon=0.0)
    pair = _pair(model)
    return SimpleNamespace(
        scorer=scorer, pair=pair, estimated=attribution.attribute(scorer, [pair], PATCHES, EV)
    )


def test_the_differentiable_distribution_is_the_exact_one(model, scorer, pair):
    """Row 0 against the brute force; row 1 (shorter, so left-padded) against the engine."""
    ids = pair[1].input_ids
    with torch.no_grad():
        mass = scorer.answer_mass([ids, ids[4:]]).numpy()
    np.testing.assert_allclose(mass[0], brute_force(model, ids, ANSWERS), atol=1e-5, rtol=0)
    for row, result in enumerate(scorer.score_batch([ids, ids[4:]], reuse_prefix=False)):
        np.testing.assert_allclose(mass[row] / mass[row].sum(), result.probs, atol=1e-5)
        assert mass[row].sum() == pytest.approx(result.valid_mass, rel=1e-5)


def test_linear_weights_of_the_metrics(scorer, pair):
    item = pair[0].item
    assert attribution.linear_weights(EV, scorer, item).tolist() == list(range(13))
    diff = attribution.linear_weights(parse_readout("p:7 - p:5", ANSWERS), scorer, item)
    assert diff[7] == 1 and diff[5] == -1 and np.count_nonzero(diff) == 2
    square = Readout("sq", "sq", lambda r, i: float(r.probs[0]) ** 2)
    with pytest.raises(ProbekitError, match="linear in the answer distribution"):
        attribution.linear_weights(square, scorer, item)


def _engine_metric(scorer, ids, hook, locs, fn):
    (result,), _ = score_with(scorer, [ids], edits={hook: (locs, fn)})
    return EV(result, None)


def _read(scorer, ids, hook, positions):
    _, values = score_with(scorer, [ids], reads={hook: [(0, p) for p in positions]})
    return values[hook]


def test_the_gradient_equals_a_finite_difference_of_the_engine(exact64):
    """resid_pre of layer 3 at the experiencer: the estimate is the directional derivative along
    (clean - corrupt); a central difference of the engine's exact metric along it agrees."""
    scorer, pair, estimated = exact64.scorer, exact64.pair, exact64.estimated
    clean, corrupt = pair
    job = make_job(0, pair, PATCHES[0])
    hook = PATCHES[0].hook
    delta = _read(scorer, clean.input_ids, hook, job.clean_positions) - _read(
        scorer, corrupt.input_ids, hook, job.corrupt_positions
    )
    locs = [(0, p) for p in job.corrupt_positions]
    step = 0.02
    up, down = (
        _engine_metric(scorer, corrupt.input_ids, hook, locs, lambda old, s=s: old + s * delta)
        for s in (step, -step)
    )
    derivative = (up - down) / (2 * step)
    estimate = estimated["estimate"][0]
    assert abs(estimate) > 1e-3
    assert estimate == pytest.approx(derivative, rel=2e-2)


def test_a_tiny_interpolation_is_estimated_exactly(exact64):
    """Moving head 3 of layer 2 a fraction alpha of the way towards its clean value and the same
    fraction away from it: where the metric is linear in the component, the exact effect is
    alpha x the estimate. The odd part of the two effects removes the second-order term, which
    is what a one-sided step at alpha = 0.01 measured (1 % of the effect)."""
    scorer, pair, estimated = exact64.scorer, exact64.pair, exact64.estimated
    clean, corrupt = pair
    patch = PATCHES[1]
    job = make_job(0, pair, patch)
    target = _read(scorer, clean.input_ids, patch.hook, job.clean_positions)
    locs = [(0, p) for p in job.corrupt_positions]
    alpha = 0.05

    def towards_clean(old, fraction):
        new = old.clone()
        new[:, patch.head] += fraction * (target[:, patch.head] - old[:, patch.head])
        return new

    towards, away = (
        _engine_metric(
            scorer, corrupt.input_ids, patch.hook, locs, lambda old, f=f: towards_clean(old, f)
        )
        for f in (alpha, -alpha)
    )
    assert abs(estimated["estimate"][1]) > 1e-3
    assert (towards - away) / 2 == pytest.approx(alpha * estimated["estimate"][1], rel=1e-2)


def test_attribution_table_and_verification(scorer, pair, estimated):
    assert (estimated["method"] == "attribution").all()
    assert estimated["head"].tolist()[1] == 3 and estimated["head"].isna().tolist() == [1, 0, 1]
    assert estimated["estimate"][2] == 0.0 and estimated["expected_patched"].isna().all()
    verified = attribution.verify(scorer, [pair], estimated, 2, EV)
    assert (verified["method"] == "attribution+verify").all()
    assert verified["ran"].tolist() == [True, True, False]  # the two largest |estimates|
    for side in ("clean", "corrupt"):  # exact baselines vs the differentiable pass's
        np.testing.assert_allclose(
            verified[f"expected_{side}"], estimated[f"expected_{side}"], atol=1e-4
        )
    exact = patching.sweep(scorer, [pair], PATCHES[:1], EV, through_answer=False)
    # verify scores two patches in one batch, the sweep one: the batch's shape moves fp32 sums,
    # here by 7.6e-6 on the 0-12 expected value (the same before the mechanism package)
    assert verified["expected_patched"][0] == pytest.approx(exact["expected_patched"][0], abs=1e-4)
    fit = attribution.agreement(attribution.effects(verified), k=2)
    assert fit["components"] == 2 and np.isnan(fit["recall@2"])  # not every component measured
    with pytest.raises(ProbekitError, match="top-k must lie between 1 and"):
        attribution.top_components(estimated, 4)


def test_agreement_of_known_rankings():
    per = pd.DataFrame({"estimate": [3.0, -2.0, 1.0, 0.5], "exact": [2.5, -3.0, 0.1, 0.4]})
    fit = attribution.agreement(per, k=2)
    assert fit["recall@2"] == 1.0 and fit["spearman"] == pytest.approx(0.6)
    assert attribution.agreement(per.assign(exact=[0.1, 0.2, 3.0, 4.0]), k=2)["recall@2"] == 0


def test_no_gradient_is_one_clear_error():
    weight = torch.zeros(4, 2, dtype=torch.int8)
    hf = SimpleNamespace(get_output_embeddings=lambda: SimpleNamespace(weight=weight))
    fake = SimpleNamespace(model=SimpleNamespace(hf=hf, name="int8-model"))
    with pytest.raises(ProbekitError, match="attribution needs gradients"):
        attribution.check_gradients(fake)


@pytest.mark.slow
def test_patch_command_attribution_verify_and_bad_input(smol, tmp_path, patch_cli, capsys):
    """`probekit patch intergroup --method attribution+verify` on heads of one layer; a head out
    of range and a top-k above the number of components exit with status 2. On the default
    model, whose two largest estimates (the ones verified) include the attention output."""
    model = smol
    base = [
        "intergroup",
        "--events",
        "1",
        "--layers",
        "2",
        "--spans",
        "experiencer",
        "--sites",
        f"hook_attn_out,{HEAD_SITE}",
        "--heads",
        "0,4",
        "--setting",
        "P0S1T0",
        "--bootstrap",
        "50",
        "--skip-direction",
        "--sets-per-unit",
        "1",
    ]
    out = tmp_path / "ok"
    argv = [*base, "--method", "attribution+verify", "--top-k", "2", "--out", str(out)]
    assert patch_cli(model, *argv) == 0
    df = pd.read_parquet(out / "patching.parquet")
    # every pair x 3 components, the top 2 verified on each pair; the pairs are the ones printed
    printed = capsys.readouterr().out
    pairs = int(re.search(r"x (\d+) pairs in \d+ interaction sets", printed).group(1))
    assert pairs % 4 == 0 and len(df) == 3 * pairs and df["ran"].sum() == 2 * pairs
    assert {"head", "method", "estimate"} <= set(df.columns)
    for name in ("patching_summary.csv", "patching.png", "heads.png"):
        assert (out / name).is_file()
    assert "Spearman rho" in printed and " of 6 components (layer, site, span)" in printed
    for flag, message in (
        (["--heads", "9"], "head 9 is out of range"),
        (["--top-k", "4"], "--top-k must lie between 1"),
    ):
        bad = tmp_path / "bad"
        argv = [*base, "--method", "attribution+verify", *flag, "--out", str(bad)]
        assert patch_cli(model, *argv) == 2
        assert message in capsys.readouterr().err
        assert not (bad / "patching.parquet").exists()


def test_per_position_estimates_add_up_to_the_span(scorer, pair):
    """The first-order estimate is linear in the patched positions: a span's estimate is the sum
    of its single positions' (`span@i`), and `@i` picks the i-th aligned position."""
    span = "from_experiencer"
    singles = pairing.single_positions([span], [pair])
    clean_pos, corrupt_pos = pairing.aligned_positions(pair, span)
    assert singles == [f"{span}@{i}" for i in range(-len(clean_pos), 0)]
    assert pairing.aligned_positions(pair, f"{span}@-1") == ([clean_pos[-1]], [corrupt_pos[-1]])
    assert pairing.aligned_positions(pair, f"{span}@0") == ([clean_pos[0]], [corrupt_pos[0]])
    patches = [Patch(3, "hook_resid_pre", s) for s in [span, *singles]]
    df = attribution.attribute(scorer, [pair], patches, EV)
    assert df["estimate"][1:].sum() == pytest.approx(df["estimate"][0], rel=1e-6, abs=1e-9)
    assert abs(df["estimate"][0]) > 1e-3
    for bad, message in ((f"{span}@{len(clean_pos)}", "out of range"), ("experiencer@x", "index")):
        with pytest.raises(ProbekitError, match=message):
            check(scorer.model, [pair], [Patch(3, "hook_resid_pre", bad)])


def test_patch_command_per_position(model, tmp_path, patch_cli, capsys):
    """`--per-position`: one component per aligned position of each span, a layer x position map."""
    base = [
        "intergroup",
        "--events",
        "1",
        "--layers",
        "2,3",
        "--setting",
        "P0S1T0",
        "--sites",
        "hook_resid_pre",
        "--bootstrap",
        "50",
        "--skip-direction",
    ]
    out = tmp_path / "ok"
    argv = [*base, "--spans", "experiencer", "--per-position", "--method", "attribution"]
    assert patch_cli(model, *argv, "--out", str(out)) == 0
    df = pd.read_parquet(out / "patching.parquet")
    spans = list(dict.fromkeys(df["span"]))
    assert spans[-1] == "experiencer@-1" and all(s.startswith("experiencer@-") for s in spans)
    assert (df["clean_positions"].map(len) == 1).all()
    assert (out / "positions.png").is_file() and not (out / "patching.png").exists()
    bad = tmp_path / "bad"
    assert patch_cli(model, *base, "--spans", "experiencer@9", "--out", str(bad)) == 2
    assert "out of range" in capsys.readouterr().err
    assert not (bad / "patching.parquet").exists()
