"""Patching answers the study's question with the uncertainty it has (issue 59): the 2x2
interaction's recovery against a direct computation, components known by construction
labelled and left out of rankings, intervals that resample units against a direct bootstrap,
Holm's adjustment against a direct computation, no p for a weak signal, whole spans of unequal
token counts patched as a block (or refused), and sets drawn at random, never by their gap."""

import itertools
import re

import numpy as np
import pandas as pd
import pytest
from conftest import EV, religion_prompt
from test_patching import _table

from probekit.core.errors import ProbekitError
from probekit.mechanism import components, patching
from probekit.mechanism.components import Patch
from probekit.mechanism.defaults import Interaction
from probekit.mechanism.interventions import score_with
from probekit.mechanism.pairs import draw_sets, interaction_sets
from probekit.mechanism.pipeline import top_components
from probekit.mechanism.plots import patching_heatmap
from probekit.stats import holm

MODEL = "tiny_bridged"  # the method's mechanics on the tiny model (4 layers)
G, H = "a Christian", "a Muslim"
SAME = Interaction("perceiver", "experiencer", lambda probe: lambda a, b: a == b)
EVENTS = {
    "e1": "I felt angry when a driver took the parking space I had been waiting for.",
    "e2": "I felt proud when I finished my first marathon.",
}


@pytest.fixture(scope="module")
def cells(model):
    """The four perceiver x experiencer prompts of G and H on each of two events."""
    return [
        religion_prompt(model, p, e, text=text, event_id=event)
        for event, text in EVENTS.items()
        for p in (G, H)
        for e in (G, H)
    ]


@pytest.fixture(scope="module")
def sets(cells):
    return interaction_sets(SAME, None, cells)


EXPERIENCER = Patch(2, "hook_resid_post", "experiencer")
PERCEIVER = Patch(2, "hook_resid_post", "perceiver")
KNOWN = [
    Patch(0, "hook_resid_pre", "experiencer"),  # the swapped tokens' embeddings: the clean run
    Patch(3, "hook_resid_pre", "from_experiencer"),  # everything from the swap on: the clean run
]


@pytest.fixture(scope="module")
def table(scorer, sets):
    return patching.sweep(scorer, sets, [EXPERIENCER, PERCEIVER, *KNOWN], EV, batch_size=32)


# ---------------------------------------------------------------------- the 2x2 interaction
def test_the_sets_are_the_2x2_cells_with_in_group_signs(sets):
    assert [s.swapped for s in sets] == ["experiencer", "perceiver"] * 2
    first = sets[0]
    clean = [(c.item.key["perceiver"], c.item.key["experiencer"]) for c, _ in first.pairs]
    corrupt = [(k.item.key["perceiver"], k.item.key["experiencer"]) for _, k in first.pairs]
    assert clean == [(G, G), (G, H), (H, G), (H, H)]
    assert corrupt == [(G, H), (G, G), (H, H), (H, G)]  # the experiencer swapped
    assert first.signs == (1, -1, -1, 1) and first.unit == "e1"
    swapped = [(k.item.key["perceiver"], k.item.key["experiencer"]) for _, k in sets[1].pairs]
    assert swapped == [(H, G), (H, H), (G, G), (G, H)]  # the perceiver swapped


def _patched(scorer, clean, corrupt, patch):
    """The corrupt prompt's readout with the clean run's values at the span, by hand."""
    hook = patch.hook
    at_clean, at_corrupt = clean.positions[patch.span], corrupt.positions[patch.span]
    _, acts = score_with(scorer, [clean.input_ids], reads={hook: [(0, p) for p in at_clean]})
    values = acts[hook]
    edit = ([(0, p) for p in at_corrupt], lambda old: values.to(old.dtype))
    (result,), _ = score_with(scorer, [corrupt.input_ids], edits={hook: edit})
    return result.expected


def test_the_recovery_of_the_interaction_is_its_direct_computation(scorer, sets, table):
    """Per set, DiD(x) = sum over cells c of sign(c) x(c): clean R(c), corrupt R(swap c) (=
    -DiD), patched P(c); the recovery is the mean over sets of DiD_patched - DiD_corrupt over
    the mean of DiD_clean - DiD_corrupt (= 2 DiD)."""
    read = {p.id: r.expected for p, r in zip(*_scored(scorer, sets), strict=True)}
    summary = patching.summarise(table, n=200)
    for patch, swapped in ((EXPERIENCER, "experiencer"), (PERCEIVER, "perceiver")):
        effects, gaps = [], []
        for found in (s for s in sets if s.swapped == swapped):
            signs = np.array(found.signs, dtype=float)
            clean = signs @ [read[c.id] for c, _ in found.pairs]
            corrupt = signs @ [read[k.id] for _, k in found.pairs]
            patched = signs @ [_patched(scorer, c, k, patch) for c, k in found.pairs]
            assert corrupt == pytest.approx(-clean, abs=1e-6)
            effects.append(patched - corrupt)
            gaps.append(clean - corrupt)
        row = summary[(summary["span"] == patch.span) & (summary["swapped"] == swapped)].iloc[0]
        assert row["status"] == "measured" and row["sets"] == 2 and row["units"] == 2
        assert row["recovery"] == pytest.approx(np.mean(effects) / np.mean(gaps), abs=1e-4)
        assert row["gap"] == pytest.approx(np.mean(gaps), abs=1e-6)
        assert row["effect"] == pytest.approx(np.mean(effects), abs=1e-4)


def _scored(scorer, sets):
    prompts = list({p.id: p for s in sets for pair in s.pairs for p in pair}.values())
    return prompts, scorer.score_batch([p.input_ids for p in prompts], reuse_prefix=False)


# ---------------------------------------------------------------------- known by construction
def test_components_known_by_construction_are_labelled_and_left_out(table, tmp_path):
    status = table.groupby(["span", "layer", "swapped"])["status"].agg(set)
    assert status[("perceiver", 2, "experiencer")] == {"not run"}  # the shared perceiver
    assert status[("experiencer", 0, "experiencer")] == {"trivial"}  # swapped embeddings
    assert status[("from_experiencer", 3, "experiencer")] == {"trivial"}  # through the answer
    assert status[("experiencer", 0, "perceiver")] == {"not run"}  # the same tokens there
    assert status[("experiencer", 2, "experiencer")] == {"measured"}
    assert not table.loc[table["status"] == "not run", "ran"].any()
    trivial = table[table["status"] == "trivial"]
    assert trivial["ran"].all()
    assert (trivial["expected_patched"] - trivial["expected_clean"]).abs().max() < 1e-4
    summary = patching.summarise(table, n=100)
    known = summary[summary["status"] != "measured"]
    assert len(known) == 4 and known["p_value"].isna().all() and (known["reading"] == "").all()
    assert (summary["status"].iloc[: len(summary) - 4] == "measured").all()  # ranked last
    ranked = summary.assign(weak_signal=False)  # the tiny model's mass is weak everywhere
    lines = top_components(ranked, "effect", 16, "expected").splitlines()
    listed = [line for line in lines[1:] if not line.startswith("  left out")]
    assert len(listed) == len(summary) - 4
    assert not any(" 0  hook_resid_pre" in line for line in listed)
    assert lines[-1] == "  left out: 2 not run, 2 trivial (see status, weak_signal)"
    plain = summary[summary["head"].isna()]
    figure = patching_heatmap(plain, tmp_path / "p.png", title="model")
    assert figure.is_file()


def test_the_heatmap_hatches_known_cells_and_holds_every_value():
    from probekit.mechanism.plots import _finish_panels, _layer_panels, _panels
    from probekit.reporting.figures import new_figure

    data = pd.DataFrame(
        {
            "layer": [0, 1, 0, 1],
            "site": ["hook_resid_pre"] * 4,
            "span": ["x"] * 4,
            "swapped": ["a", "a", "b", "b"],
            "status": ["trivial", "measured", "not run", "measured"],
            "recovery": [1.0, 1.17, 0.0, -0.4],
        }
    )
    fig = new_figure(6, 3)
    data = _panels(data, "span")
    panels = list(dict.fromkeys(data["panel"]))
    assert panels == ["x, a swapped", "x, b swapped"]
    axes = [
        ax
        for ax, _ in _layer_panels(
            fig, data, panels, [0, 1], "site", ["hook_resid_pre"], "recovery"
        )
    ]
    _finish_panels(fig, "recovery", "model")
    low, high = axes[0].images[0].get_clim()
    assert (low, high) == (-1.17, 1.17)  # 1.17 is on the scale, not clipped at 1
    marks = [t.get_text() for ax in axes for t in ax.texts]
    assert marks == ["triv", "n/r"]
    assert fig.axes[-1].get_ylabel() == "recovery: mean effect / mean gap over the sets"


# ---------------------------------------------------------------------- inference by unit
def _synthetic(effects_by_unit, gaps_by_unit):
    """A patching table of one component: unit u has one single-pair set per (effect, gap)."""
    units = [f"u{u}" for u, effects in enumerate(effects_by_unit) for _ in effects]
    df = _table(sum(gaps_by_unit, []), sum(effects_by_unit, []), noise=1e-9)
    return df.assign(unit=units, layer=1, span="x", swapped="x", valid_mass_patched=0.5)


EFFECTS = [[0.2, 0.4], [0.9, 0.7, 0.8], [0.1]]
GAPS = [[1.0, 1.2], [1.0, 0.8, 1.1], [0.9]]


def test_intervals_resample_units_as_a_direct_bootstrap():
    n, seed = 500, 3
    summary = patching.summarise(_synthetic(EFFECTS, GAPS), n=n, seed=seed)
    row = summary.iloc[0]
    effect = np.array([sum(e) for e in EFFECTS])
    gap = np.array([sum(g) for g in GAPS])
    count = np.array([len(e) for e in EFFECTS])
    draws = np.random.default_rng(seed).integers(3, size=(n, 3))  # units, not pairs
    ratio = effect[draws].sum(1) / gap[draws].sum(1)
    mean = effect[draws].sum(1) / count[draws].sum(1)
    assert row["recovery"] == pytest.approx(effect.sum() / gap.sum())
    assert (row["recovery_low"], row["recovery_high"]) == pytest.approx(
        tuple(np.percentile(ratio, [2.5, 97.5]))
    )
    assert (row["effect_low"], row["effect_high"]) == pytest.approx(
        tuple(np.percentile(mean, [2.5, 97.5]))
    )
    assert (row["pairs"], row["sets"], row["units"]) == (6, 6, 3)
    # resampling the six pairs as if independent gives a narrower interval
    pairs = patching.summarise(
        _synthetic([[e] for e in sum(EFFECTS, [])], [[g] for g in sum(GAPS, [])]), n=n, seed=seed
    )
    assert (
        pairs["recovery_high"][0] - pairs["recovery_low"][0]
        < row["recovery_high"] - row["recovery_low"]
    )


def test_p_values_are_the_sign_flip_test_over_units_adjusted_by_holm():
    means = np.array([np.mean(e) for e in EFFECTS])  # each unit's mean set effect
    flips = np.array(list(itertools.product((1, -1), repeat=3)))
    direct = np.mean(np.abs(flips @ means) / 3 >= abs(means.mean()) - 1e-12)
    table = pd.concat(
        [
            _synthetic(EFFECTS, GAPS),
            _synthetic([[-0.1, 0.05], [0.02, -0.01, 0.0], [0.03]], GAPS).assign(layer=2),
            _synthetic(EFFECTS, GAPS).assign(layer=3, status="trivial"),
            _synthetic(EFFECTS, GAPS).assign(layer=4, valid_mass_patched=1e-4),
        ],
        ignore_index=True,
    )
    summary = patching.summarise(table, n=100).set_index("layer")
    assert summary.loc[1, "p_value"] == pytest.approx(direct) == 0.25
    assert np.isnan(summary.loc[3, "p_value"]) and np.isnan(summary.loc[4, "p_value"])
    assert summary.loc[4, "weak_signal"] and summary.loc[4, "status"] == "measured"
    tested = summary.loc[[1, 2], "p_value"].to_numpy()
    assert summary.loc[[1, 2], "p_adjusted"].to_numpy() == pytest.approx(holm(tested))
    assert summary.attrs["adjustment"] == "holm"


def test_holm_against_a_direct_computation():
    p = np.array([0.01, 0.04, 0.03, np.nan, 0.2])
    # sorted 0.01, 0.03, 0.04, 0.2 (m = 4): x4, x3, x2, x1, then running maxima
    want = [0.04, 0.09, 0.09, np.nan, 0.2]
    np.testing.assert_allclose(holm(p), want)
    assert holm(np.array([0.5, 0.6])).tolist() == [1.0, 1.0]


def test_a_reading_needs_its_interval_outside():
    """L29's -0.001 [-0.010, +0.010] is not "below 0"; -0.05 [-0.08, -0.02] is."""
    assert patching.reading(-0.001, low=-0.010, high=0.010) == ""
    assert patching.reading(-0.05, low=-0.08, high=-0.02) == patching.AWAY
    assert patching.reading(1.17, low=0.9, high=1.4) == ""
    assert patching.reading(1.17, low=1.05, high=1.4) == patching.OVERSHOOT


# ---------------------------------------------------------------------- unequal token counts
def test_spans_of_unequal_token_counts_are_patched_whole(model, scorer):
    """Ethnicity's "a Hispanic American" (3 tokens) and "a Latino" (2): the whole span is
    patched as a block at the residual stream, so at layer 0 the patched run is the clean one;
    at other sites it is refused in one line."""
    clean = religion_prompt(model, "a Latino", "a Hispanic American")
    corrupt = religion_prompt(model, "a Latino", "a Latino")
    assert (len(clean.positions["experiencer"]), len(corrupt.positions["experiencer"])) == (3, 2)
    patches = [
        Patch(0, "hook_resid_pre", "experiencer"),
        Patch(3, "hook_resid_post", "experiencer"),
    ]
    df = patching.sweep(scorer, [(clean, corrupt)], patches, EV)
    assert (df["alignment"] == "block").all() and df["ran"].all()
    assert df["clean_positions"][0] == clean.positions["experiencer"]  # every token of it
    assert df["recovery"][0] == pytest.approx(1, abs=1e-3)
    assert abs(df["gap"][0]) > 1e-3
    with pytest.raises(ProbekitError) as refused:
        patching.sweep(scorer, [(clean, corrupt)], [Patch(1, "hook_attn_out", "experiencer")], EV)
    assert "\n" not in str(refused.value) and re.search(
        r"'experiencer' has 3 tokens in .* and 2 in .*: at hook_attn_out a whole span of unequal "
        r"token counts has no position-by-position match",
        str(refused.value),
    )


def test_a_block_patch_equals_the_position_patch_where_both_exist(scorer, cells, monkeypatch):
    """On spans of equal counts, the block (the clean run with the corrupt run's states outside
    the span written into it) gives what the position patch gives, at any residual layer."""
    cases = [
        ((cells[0], cells[1]), Patch(2, "hook_resid_pre", "experiencer")),  # experiencer swapped
        ((cells[4], cells[6]), Patch(2, "hook_resid_post", "perceiver")),  # perceiver swapped
    ]

    def as_block(i, pair, patch, through_answer=True):
        job = components.make_job(i, pair, patch, through_answer)
        return components._block(
            i, pair, patch, job.clean_positions, job.corrupt_positions, job.answer
        )

    for pair, patch in cases:
        position = patching.sweep(scorer, [pair], [patch], EV)
        with monkeypatch.context() as patched:
            patched.setattr(patching, "make_job", as_block)
            block = patching.sweep(scorer, [pair], [patch], EV)
        assert (block["alignment"] == "block").all() and (position["alignment"] == "position").all()
        moved = position["expected_patched"][0] - position["expected_corrupt"][0]
        assert abs(moved) > 1e-4
        assert block["expected_patched"][0] == pytest.approx(
            position["expected_patched"][0], abs=1e-4
        )


# ---------------------------------------------------------------------- which sets
def test_sets_are_drawn_at_random_per_unit_never_by_their_gap(model):
    names = ["a Christian", "a Muslim", "a Jew"]
    cells = [
        religion_prompt(model, p, e, text=text, event_id=event)
        for event, text in EVENTS.items()
        for p in names
        for e in names
    ]
    found = interaction_sets(SAME, None, cells)
    assert len(found) == 2 * 3 * 2  # per event: 3 identity pairs, each swapping either side
    assert draw_sets(found, None, 0) == found
    one = draw_sets(found, 1, seed=4)
    assert len(one) == 4 and {s.unit for s in one} == {"e1", "e2"}
    assert [s.name for s in draw_sets(found, 1, seed=4)] == [s.name for s in one]
    assert len({s.draw for s in one}) == 2  # both sides of the drawn identity pair
    seeds = {tuple(s.name for s in draw_sets(found, 1, seed)) for seed in range(8)}
    assert len(seeds) > 1
    assert "gap" not in draw_sets.__code__.co_varnames


# ---------------------------------------------------------------------- the direction check
def test_the_direction_is_cross_fitted_with_several_controls(monkeypatch):
    """Each fold's direction and layer come from the other folds' units only; every prompt is
    ablated once per direction (the study's and each control), and each effect has its
    interval over units."""
    from probekit.mechanism import directions

    rng = np.random.default_rng(1)
    units = [f"e{k}" for k in range(6)]
    rows = [
        {"unit": u, "event_id": u, "group": g, "contrast": g == 0} for u in units for g in (0, 1)
    ]
    frame = pd.DataFrame(rows)
    frame["value"] = 10 + 2 * frame["contrast"] + rng.normal(0, 0.5, len(frame))
    frame["gap"] = frame["value"] - frame.groupby("unit")["value"].transform("mean")
    acts = rng.normal(size=(len(frame), 3, 8)) + frame["value"].to_numpy()[:, None, None]
    states = directions.States(frame, acts, [4, 5, 6], "experiencer")
    prompts = list(range(len(frame)))  # stand-ins: project_out is recorded, not run
    calls = []

    def project_out(scorer, chosen, span, layer, direction, readout, batch_size=None):
        calls.append((list(chosen), layer, np.asarray(direction)))
        return [
            float(frame.loc[i, "value"]) * (0.5 if len(calls) % 4 == 1 else 1.0) for i in chosen
        ]

    monkeypatch.setattr(directions, "project_out", project_out)

    def statistic(table, column):
        means = table.groupby("contrast")[column].mean()
        return float(means[True] - means[False])

    found = directions.causal_check(None, prompts, states, None, statistic, ["unit"], 3, 0, 200)
    fold = directions.unit_folds(list(frame["unit"]), 0)
    assert found["folds"] == 5 and len(calls) == 5 * 4  # 5 folds x (the direction + 3 controls)
    for k in range(5):
        held = np.flatnonzero(fold == k)
        mine = [c for c in calls if c[0] == held.tolist()]
        assert len(mine) == 4 and len({c[1] for c in mine}) == 1
        layer = mine[0][1]
        train = fold != k
        at = states.layers.index(layer)
        want = directions.diff_of_means(acts[train, at], frame["contrast"].to_numpy()[train])
        np.testing.assert_allclose(mine[0][2], want)  # fitted without the held-out units
        assert all(found["layers"][frame.loc[i, "unit"]] == layer for i in held)
    assert len(found["delta_random"]) == 3
    for name in ("delta", "ablated", "shrink"):
        assert found[f"{name}_low"] <= found[name] <= found[f"{name}_high"]
    assert found["shrink"] == pytest.approx(0.5)  # the direction halved every readout
    assert found["random_shrink"] == pytest.approx(0.0)
    with pytest.raises(ProbekitError, match="needs at least two units"):
        directions.unit_folds(["e1", "e1"], 0)
