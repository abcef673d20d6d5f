"""Each figure's numbers beside it (`save_figure`'s CSV files, named in the manifest's `figures`)
and the context beside each headline of ISEAR, GIEBench and JaEm-ST (the raw effect in the
answer's scale, an effect size and test over the study's unit, the valid mass by group)."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pandas as pd
import pytest
from conftest import DATA_ROOT
from scipy import stats

import probekit
from probekit.reporting import figures
from probekit.reporting.headline import format_number
from probekit.studies.giebench import metrics as giebench_metrics
from probekit.studies.giebench.report import context_line as giebench_context
from probekit.studies.isear import metrics as isear_metrics
from probekit.studies.isear.events import SAMPLE_ROOT
from probekit.studies.isear.probe import EMOTIONS, GENDERS
from probekit.studies.isear.report import context_line as isear_context
from probekit.studies.jaem_st import metrics as jaem_metrics
from probekit.studies.jaem_st.data import REQUIRED as JAEM_FILES
from probekit.studies.jaem_st.report import context_line as jaem_context


def test_save_figure_writes_each_table_beside_the_png(tmp_path):
    fig = figures.new_figure(2, 2)
    one = pd.DataFrame({"x": [0.5, 1.5], "y": [1e-9, 2.0]})
    two = {"matrix": one, "mask": pd.DataFrame({"shown": [True, False]})}
    figures.save_figure(fig, tmp_path / "a.png", one)
    figures.save_figure(fig, tmp_path / "b.png", two)
    figures.save_figure(fig, tmp_path / "a_exact.png", one)  # not a's
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a.csv"), one)
    assert pd.read_csv(tmp_path / "b.mask.csv")["shown"].tolist() == [True, False]
    assert figures.figure_data(tmp_path) == {
        "a.png": ["a.csv"],
        "a_exact.png": ["a_exact.csv"],
        "b.png": ["b.mask.csv", "b.matrix.csv"],
    }
    assert figures.figure_data(tmp_path, ["b.png"]) == {"b.png": ["b.mask.csv", "b.matrix.csv"]}
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary left


def test_the_heatmap_csv_holds_the_matrix_and_its_mask(tmp_path):
    labels = ["a", "b", "c"]
    Z = np.arange(9.0).reshape(3, 3) / 7
    mask = np.array([[True, False, True], [True, True, False], [False, True, True]])
    figures.heatmap(Z, labels, mask=mask, path=tmp_path / "heatmap.png")
    cells = pd.read_csv(tmp_path / "heatmap.csv")
    assert list(cells.columns) == ["row", "column", "value", "shown"]
    grid = cells.pivot(index="row", columns="column", values="value").loc[labels, labels]
    np.testing.assert_allclose(grid.to_numpy(), Z)
    shown = cells.pivot(index="row", columns="column", values="shown").loc[labels, labels]
    assert (shown.to_numpy() == mask).all()


# ------------------------------------------------------------------ context on hand-made frames
def test_isear_context_on_a_hand_made_table():
    """Two genders, 4 events: fear is the widest emotion (woman .75, man 0), its per-event gaps
    1, 1, 0, 1 give d_z .75 / .5; the permutation p equals the exact enumeration of the 2^4
    ways of swapping each event's genders."""
    man, woman = GENDERS[:2]
    chosen = {man: ["anger", "anger", "anger", "joy"], woman: ["fear", "fear", "anger", "fear"]}
    rows = []
    for event, gender in itertools.product(range(4), (man, woman)):
        p = {f"p::{e}": float(e == chosen[gender][event]) for e in EMOTIONS}
        mass = 0.5 if gender == man else 2e-7
        rows.append({"event_id": event, "gender": gender, "valid_mass": mass, **p})
    scores = pd.DataFrame(rows).assign(most_probable="anger")
    tables = isear_metrics.view_tables(scores, "exact", [man, woman])
    context = isear_metrics.gender_context(tables, scores, seed=0)
    assert (context["widest"], context["higher"], context["lower"]) == ("fear", woman, man)
    assert context["d_z"] == pytest.approx(0.75 / np.std([1, 1, 0, 1], ddof=1))
    observed = isear_metrics.view_metrics(tables)["max_diff"]
    exact = []
    for swap in itertools.product((False, True), repeat=4):
        weights = tables.weights.copy()
        weights[list(swap)] = weights[list(swap)][:, ::-1]
        swapped = isear_metrics.view_metrics(dataclasses.replace(tables, weights=weights))
        exact.append(swapped["max_diff"] >= observed - 1e-12)
    assert context["p_events"] == pytest.approx(np.mean(exact), abs=0.05)
    assert context["mean_valid_mass"] == pytest.approx((0.5 + 2e-7) / 2)
    assert context["valid_mass_by_group"] == f"{man} 0.500; {woman} 2.0e-07"
    summary = isear_metrics.summarize(tables, 0).set_index("metric")
    for column, value in context.items():
        summary.loc["max_diff", column] = value
    line = isear_context(summary)
    assert "max_diff 75.0 probability points (fear: a woman 0.750 vs a man 0.000)" in line
    assert "d_z +1.50 over events" in line and f"{woman} 2.0e-07" in line


def test_giebench_context_on_a_hand_made_table():
    """3 items: raw 0.2, 0.4, 0.6 and id 0.5, 0.4, 0.9 in the own order (changes .3, 0, .3:
    mean .2, d_z .2 / sd, sign-flip p 4/8 exactly); a second order moves the average only."""
    rows = [
        {"item_id": i, "category": c, "prompt_type": t, "order": 0, "score": s, "valid_mass": m}
        for i, c in enumerate(["Age", "Age", "Faith"])
        for t, s, m in (("raw", 0.2 * (i + 1), 0.9), ("id", (0.5, 0.4, 0.9)[i], 0.1 * (i + 1)))
    ]
    rows += [{**r, "order": 1, "score": r["score"] + 0.3} for r in rows if r["prompt_type"] == "id"]
    frame = pd.DataFrame(rows).assign(mismatch=False)
    own = giebench_metrics.identity_context(frame, "id", giebench_metrics.OWN)
    assert own["change_from_raw"] == pytest.approx(0.2)
    assert own["d_z"] == pytest.approx(0.2 / np.std([0.3, 0.0, 0.3], ddof=1))
    assert own["p_items"] == pytest.approx(0.5)
    assert own["mean_valid_mass"] == pytest.approx(0.2)
    assert own["valid_mass_by_group"] == "Age 0.150; Faith 0.300"
    averaged = giebench_metrics.identity_context(frame, "id", giebench_metrics.AVERAGED)
    assert averaged["change_from_raw"] == pytest.approx(0.2 + 0.15)
    raw = giebench_metrics.identity_context(frame, "raw", giebench_metrics.OWN)
    assert np.isnan(raw["change_from_raw"]) and np.isnan(raw["p_items"])
    line = giebench_context(own)
    assert line.startswith("+20.0 percentage points from the raw prompt on the same items")
    assert "d_z +1.15, sign-flip p 0.5000 over items" in line and "Faith 0.300" in line
    assert giebench_context(raw) == "valid mass 0.900 (Age 0.900; Faith 0.900)"


def test_jaem_context_on_a_hand_made_table():
    """Groups A (.2, .4), B (.6, .8), C (.5, .5): gap .4 from A to B, η² = .16 / .2, and the
    F test's p from F = (.16 / 2) / (.04 / 3) with (2, 3) degrees of freedom."""
    groups = ["A", "A", "B", "B", "C", "C"]
    samples = pd.DataFrame({"gender": groups, "score": [0.2, 0.4, 0.6, 0.8, 0.5, 0.5]})
    scores = pd.DataFrame({"gender": groups, "valid_mass": [1e-6, 3e-6, 0.5, 0.7, 0.1, 0.1]})
    context = jaem_metrics.group_context(samples, scores, ["gender"])
    assert (context["highest"], context["lowest"]) == ("B", "A")
    assert context["group_gap"] == pytest.approx(0.4)
    assert context["eta_squared"] == pytest.approx(0.8)
    assert context["p_samples"] == pytest.approx(stats.f.sf(6.0, 2, 3))
    assert context["valid_mass_by_group"] == "A 2.0e-06; B 0.600; C 0.100"
    row = {**context, "n_samples": 6, "mean_valid_mass": scores["valid_mass"].mean()}
    line = jaem_context(row)
    assert line.startswith("highest B, lowest A: gap 40.0 percentage points; η² 0.80")
    assert f"one-way ANOVA p {stats.f.sf(6.0, 2, 3):.4f} over 6 samples" in line


# ------------------------------------------------------------------ small real runs
@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """Small runs of the four studies on the tiny model (intergroup: 3 events of the sample)."""

    def run(study, **options):
        out = tmp_path_factory.mktemp(study) / "run"
        return probekit.run_study(study, tiny, out=out, quiet=True, **options)

    return run


def assert_figures_have_their_data(folder):
    """Every PNG of the run has its CSV beside it, named in the manifest."""
    named = json.loads((folder / "manifest.json").read_text())["figures"]
    pngs = sorted(p.name for p in folder.glob("*.png"))
    assert pngs and sorted(named) == pngs
    for png, files in named.items():
        assert files == [png.removesuffix(".png") + ".csv"] and (folder / files[0]).is_file()


def assert_paper_row(run, expected):
    """The paper's table (`probekit.report`) of the run: its primary row holds the headline's
    value and interval and the `expected` context columns (name -> the summary's value)."""
    table = probekit.report(run.path)
    row = table[table["primary"]].iloc[0]
    headline = next(h for h in run.headlines if h.primary)
    assert [row["value"], row["low"], row["high"]] == pytest.approx(
        [headline.value, headline.low, headline.high], nan_ok=True
    )
    assert {name: row[name] for name in expected} == pytest.approx(expected, nan_ok=True)


@pytest.mark.slow
def test_isear_run_figure_and_context(runs):
    run = runs("isear", events=3, data=SAMPLE_ROOT)
    assert_figures_have_their_data(run.path)
    summary = pd.read_csv(run.path / "summary.csv").set_index("metric")
    drawn = pd.read_csv(run.path / "emotions.csv").set_index("metric")
    for column in ("value", "low", "high"):
        np.testing.assert_allclose(drawn[column], summary.loc[drawn.index, column])
    assert len(drawn) == len(EMOTIONS) * len(GENDERS) + 1
    scores = pd.read_parquet(run.path / "scores.parquet")
    md = summary.loc["max_diff"]
    probs = scores[[f"p::{e}" for e in EMOTIONS]]
    share = probs[f"p::{md['widest']}"] / probs.sum(axis=1)
    by = scores.assign(share=share).pivot(index="event_id", columns="gender", values="share")
    gaps = by[md["higher"]] - by[md["lower"]]
    assert md["d_z"] == pytest.approx(gaps.mean() / gaps.std(ddof=1))
    mass = scores.groupby("gender")["valid_mass"].mean()
    assert md["valid_mass_by_group"] == "; ".join(f"{g} {format_number(mass[g])}" for g in GENDERS)
    headline = next(h for h in run.headlines if h.primary)
    assert f"d_z {format_number(md['d_z'], 2, True)}" in headline.context
    assert md["valid_mass_by_group"] in headline.context
    assert md["valid_mass_by_group"] in (run.path / "summary.md").read_text()
    assert_paper_row(run, {"d_z": md["d_z"], "p_events": md["p_events"]})


@pytest.mark.slow
def test_giebench_run_figures_and_context(runs):
    run = runs("giebench", items="sample")
    assert_figures_have_their_data(run.path)
    summary = pd.read_csv(run.path / "summary.csv")
    accuracy = pd.read_csv(run.path / "accuracy.csv")
    overall = accuracy[accuracy["category"] == giebench_metrics.OVERALL]
    np.testing.assert_allclose(overall["accuracy"], summary["accuracy"])
    scores = pd.read_parquet(run.path / "scores.parquet")
    own = scores[(scores["order"] == 0) & ~scores["mismatch"]]
    correct = own.apply(lambda r: r[f"p::{r['correct']}"], axis=1)
    items = own.assign(score=correct).pivot(index="item_id", columns="prompt_type", values="score")
    row = summary[summary["prompt_type"] == "id"].iloc[0]
    assert row["change_from_raw"] == pytest.approx((items["id"] - items["raw"]).mean())
    typed = own[own["prompt_type"] == "id"]
    assert row["mean_valid_mass"] == pytest.approx(typed["valid_mass"].mean())
    headline = next(h for h in run.headlines if h.key.startswith("accuracy, id"))
    assert f"{100 * row['change_from_raw']:+.1f} percentage points" in headline.context
    primary = summary[[h.primary for h in run.headlines]].iloc[0]
    names = ("change_from_raw", "d_z", "p_items")
    assert_paper_row(run, {"valid_mass": primary["mean_valid_mass"], **primary[list(names)]})


@pytest.mark.slow
@pytest.mark.reference_data(*JAEM_FILES)
def test_jaem_run_figures_and_context(runs):
    run = runs("jaem-st", limit=40, data=DATA_ROOT)
    assert_figures_have_their_data(run.path)
    groups = pd.read_csv(run.path / "groups.csv")
    heat = pd.read_csv(run.path / "groups_heatmap.csv")
    np.testing.assert_allclose(heat["mean"], groups["mean"])
    pd.testing.assert_frame_equal(
        pd.read_csv(run.path / "accuracy_by_group.csv"), pd.read_csv(run.path / "dimensions.csv")
    )
    scores = pd.read_parquet(run.path / "scores.parquet")
    letter = scores.apply(lambda r: r[f"p::{r['empathetic_letter']}"], axis=1)
    samples = scores.assign(s=letter).groupby(["sample", "gender", "pronoun"])["s"].mean()
    means = samples.groupby(["gender", "pronoun"]).mean()
    np.testing.assert_allclose(groups.set_index(["gender", "pronoun"])["mean"], means)
    row = pd.read_csv(run.path / "summary.csv").iloc[0]
    assert row["group_gap"] == pytest.approx(means.max() - means.min())
    assert row["highest"] == "/".join(means.idxmax())
    headline = next(h for h in run.headlines if h.primary)
    assert f"gap {100 * row['group_gap']:.1f} percentage points" in headline.context
    primary = pd.read_csv(run.path / "summary.csv")[[h.primary for h in run.headlines]].iloc[0]
    assert_paper_row(run, dict(primary[["group_gap", "eta_squared", "p_samples"]]))


@pytest.mark.slow
def test_intergroup_heatmap_csv_is_z_and_its_mask(runs):
    from probekit.studies.intergroup import metrics
    from probekit.studies.intergroup.probe import get_category

    run = runs("intergroup", limit=108, min_valid_mass=0.0)  # 3 events of the sample
    assert_figures_have_their_data(run.path)
    cells = pd.read_csv(run.path / "heatmap.csv")
    n = int(len(cells) ** 0.5)
    np.testing.assert_allclose(cells["value"].to_numpy().reshape(n, n), np.load(run.path / "Z.npy"))
    category = get_category("religion")
    scores = pd.read_parquet(run.path / "scores.parquet")
    summary = metrics.summarize(
        scores, category.identities, category.labels, "exact", 0, min_valid_mass=0.0
    )
    assert (cells["shown"].to_numpy().reshape(n, n) == summary.shown).all()


def test_the_steer_record_names_its_figures_data(tiny_bridged, tmp_path):
    from test_steering import steer_days

    result = steer_days(tiny_bridged, tmp_path / "steer")
    manifest = json.loads((result.path / "manifest.json").read_text())
    figures = manifest["figures"]
    assert figures.pop("steer.png") == ["steer.csv"]
    # each α's study report: its figures and their numbers, under alphas/
    pngs = sorted(p.relative_to(result.path).as_posix() for p in result.path.glob("alphas/*/*.png"))
    assert sorted(figures) == pngs
    for png, files in figures.items():
        assert files == [png.removesuffix(".png") + ".csv"] and (result.path / files[0]).is_file()
    drawn = pd.read_csv(result.path / "steer.csv")
    np.testing.assert_allclose(drawn["value"], result.summary["value"])
    np.testing.assert_allclose(drawn["mean_kl"], result.summary["mean_kl"])
