"""Models side by side as a paper needs them (issue 61): `probekit run STUDY --model A --model B`
scores every model in the first one's precision tier, and it and `probekit report` write the
paper's table (`headlines.csv` / `.md` / `.tex`) and the forest plot (`forest.png` / `.csv`),
whose numbers are the runs' own; `probekit.report` returns the table."""

from __future__ import annotations

import json
import re
import shutil

import pandas as pd
import pytest

import probekit
from probekit import cli
from probekit.engines.hf.model import LoadedModel
from probekit.run.command import FIRST_MODEL
from probekit.studies import get_study
from probekit.testing.synthetic import tiny_model

SEEDS = {"a": 0, "b": 1}
"""The two models of the run: tiny random models, one seed each."""


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """`probekit run intergroup --model a --model b` (two events of the sample, exact view) on
    two tiny models; the `keep_precision` calls it made."""
    out = tmp_path_factory.mktemp("across") / "ig"
    calls = []
    keep = LoadedModel.keep_precision

    def recorded(self, record, why="kept from the run being resumed"):
        calls.append((dict(record), why))
        return keep(self, record, why)

    data = str(get_study("intergroup").dataset.sample)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "probekit.engines.load_engine", lambda spec, **k: tiny_model(seed=SEEDS[spec])
        )
        patch.setattr(LoadedModel, "keep_precision", recorded)
        models = [arg for name in SEEDS for arg in ("--model", name)]
        options = ["--limit", "72", "--min-valid-mass", "0", "--numerics", "0", "--quiet"]
        argv = ["run", "intergroup", *models, *options, "--data", data, "--out", str(out)]
        assert cli.main(argv) == 0
    return out, calls


def test_the_second_model_keeps_the_first_models_tier(two):
    out, calls = two
    first, second = (json.loads((out / m / "manifest.json").read_text()) for m in SEEDS)
    assert calls == [(first["precision"], FIRST_MODEL)]
    assert second["precision"]["tier"] == first["precision"]["tier"]
    assert second["precision"]["note"] == FIRST_MODEL != first["precision"]["note"]


def test_the_run_writes_the_table_and_forest_plot_across_its_models(two):
    out, _ = two
    for name in ("headlines.csv", "headlines.md", "headlines.tex", "forest.png", "forest.csv"):
        assert (out / name).is_file(), name
    table = pd.read_csv(out / "headlines.csv")
    assert sorted(table["model"]) == ["a", "b"] and set(table["category"]) == {"religion"}
    assert '<h2 id="paper-table">' in (out / "report.html").read_text()
    record = json.loads((out / "report.json").read_text())  # the figure named with its numbers
    assert record["figures"]["forest.png"] == ["forest.csv"]
    assert sorted(record["runs"]) == [str(out / "a"), str(out / "b")]
    assert "headlines.csv" in record["files"] and "a/scores.parquet" not in record["files"]


@pytest.fixture(scope="module")
def reported(two):
    """`probekit.report` over the two model folders: the table it returns."""
    out, _ = two
    return probekit.report([out / "a", out / "b"])


def test_the_table_holds_each_runs_own_summary_numbers(two, reported):
    out, _ = two
    assert isinstance(reported, pd.DataFrame) and set(reported["study"]) == {"intergroup"}
    summary = pd.read_csv(out / "summary.csv")
    assert len(reported) == len(summary) == 2
    for _, row in reported.iterrows():
        (own,) = summary[summary["model"] == row["model"]].to_dict("records")
        pairs = {"value": "delta", "low": "delta_ci_low", "high": "delta_ci_high"}
        pairs |= {"p": "p_value", "n": "n_kept", "raw_gap": "raw_gap", "d_z": "d_z"}
        pairs |= {"valid_mass": "mean_valid_mass", "exclusion_rate": "exclusion_rate"}
        for column, theirs in pairs.items():
            assert row[column] == pytest.approx(own[theirs]), column
        assert row["raw_gap_low"] == pytest.approx(own["raw_gap_ci_low"])
        assert row["interval"] == "95% bootstrap CI over events" and row["unit"] == "z-scores"
        assert row["tier"] == "float32" and row["view"] == "exact"
    assert reported.attrs["tier_note"] == ""


def body_rows(tex: str) -> list[list[str]]:
    """The cells of each row between `\\midrule` and `\\bottomrule`."""
    body = tex.split("\\midrule\n")[1].split("\\bottomrule")[0]
    return [line.removesuffix(" \\\\").split(" & ") for line in body.splitlines()]


def test_the_latex_is_a_booktabs_table_of_the_same_numbers(two, reported):
    tex = (two[0] / "combined" / "headlines.tex").read_text()
    rules = [tex.index(r) for r in ("\\toprule", "\\midrule", "\\bottomrule")]
    assert rules == sorted(rules) and tex.count("\\begin{tabular}") == 1
    assert tex.count("{") == tex.count("}") and "$\\Delta$" in tex and "Δ" not in tex
    header = tex.split("\\toprule\n")[1].split(" \\\\")[0].split(" & ")
    rows = body_rows(tex)
    assert len(rows) == len(reported) and all(len(r) == len(header) for r in rows)
    for cells, (_, row) in zip(rows, reported.iterrows(), strict=True):
        value = cells[header.index("value")]
        assert value == f"{row['value']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"
    caption = re.search(r"\\caption\{(.*)\}", tex).group(1)
    assert "95\\% bootstrap CI over events" in caption and "unit: z-scores" in caption


def test_the_forest_plot_draws_the_tables_primary_numbers(two, reported):
    forest = pd.read_csv(two[0] / "combined" / "forest.csv")
    primary = reported[reported["primary"]]
    assert len(forest) == len(primary) == 2 and (forest["reference"] == 0).all()
    for column in ("value", "low", "high"):
        assert forest[column].tolist() == pytest.approx(primary[column].tolist())


def test_the_table_says_when_the_models_tiers_differ(two, tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(two[0], runs, ignore=shutil.ignore_patterns("parts"))
    manifest = json.loads((runs / "b" / "manifest.json").read_text())
    manifest["precision"] = {**manifest["precision"], "tier": "bfloat16"}
    (runs / "b" / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(["report", str(runs / "a"), str(runs / "b")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("| model | category | setting | headline |")
    note = "do not score in one precision tier (a: float32, b: bfloat16)"
    assert note in printed and "--dtype float32" in printed
    assert note in (runs / "combined" / "headlines.md").read_text()
    assert note in (runs / "combined" / "report.html").read_text()
    table = probekit.report([runs / "a", runs / "b"])
    assert note in table.attrs["tier_note"] and set(table["tier"]) == {"float32", "bfloat16"}


@pytest.fixture(scope="module")
def mechanisms(tmp_path_factory):
    """A patching and a lens run in one folder per model, on two tiny models (4 layers)."""
    import minimal_study

    root = tmp_path_factory.mktemp("curves")
    study = minimal_study.MinimalStudy()
    for name, seed in SEEDS.items():
        model, common = tiny_model(seed=seed), dict(out=root / name, days=2, quiet=True)
        probekit.patch_study(
            study, model, layers=[0, 2], sites=["resid_pre"], bootstrap=20, **common
        )
        probekit.lens_study(study, model, layers=[0, 1, 2, 3], **common)
    return root


def test_the_curves_of_several_models_share_a_normalised_depth_axis(mechanisms):
    probekit.report([mechanisms / name for name in SEEDS])
    curves = pd.read_csv(mechanisms / "combined" / "curves.csv")
    assert set(curves["model"]) == {"tiny-random"} and curves["folder"].nunique() == 2
    assert (curves["n_layers"] == 4).all() and curves["x"].between(0, 1).all()
    lens = curves[curves["kind"] == "lens"]
    assert lens["x"].tolist() == [(layer + 1) / 4 for layer in lens["layer"]]  # after layer l
    patched = curves[curves["kind"] == "patching"]
    assert len(patched) and patched["x"].tolist() == [layer / 4 for layer in patched["layer"]]
    own = pd.read_csv(mechanisms / "a" / "patching_summary.csv").set_index("layer")
    first = patched[patched["folder"].str.endswith("/a")].set_index("layer")
    for layer, row in first.iterrows():
        assert (row["low"], row["high"]) == pytest.approx(
            (own.loc[layer, "recovery_low"], own.loc[layer, "recovery_high"])
        )
    page = (mechanisms / "combined" / "report.html").read_text()
    assert 'id="figure-curves"' in page and "the lens rows have no interval; drawn without" in page
    assert (mechanisms / "combined" / "curves.png").is_file()


def test_a_folder_of_neither_runs_nor_curves_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    assert cli.main(["report", str(tmp_path / "junk")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "holds no finished run" in line and "no lens or patching run" in line
