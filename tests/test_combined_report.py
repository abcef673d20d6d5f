"""`probekit report` over several runs (`probekit.report`): the combined summary and page never
replace a run's own, the folder they go to is checked before any work, and it holds one report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.core.rundir import RunDir
from probekit.run import report


def finished_run(folder: Path, study: str = "isear") -> Path:
    """A folder `RunDir.discover` takes for a finished run, with its own summary."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"study": study}))
    pd.DataFrame({"valid_mass": [0.5]}).to_parquet(folder / "scores.parquet")
    (folder / "summary.csv").write_text("metric,value\nmax_diff,0.25\n")
    return folder


@pytest.fixture
def no_report_work(monkeypatch):
    """Any study lookup fails the test: the out folder must be refused before any work."""

    def work(name):
        pytest.fail(f"the study {name} was reported before the out folder was checked")

    monkeypatch.setattr("probekit.studies.base.get_study", work)


def test_several_runs_are_combined_beside_them_not_into_the_first(tmp_path):
    first, second = finished_run(tmp_path / "q1"), finished_run(tmp_path / "q2")
    runs = [RunDir(first), RunDir(second)]
    assert report.report_folder([first, second], None, runs) == tmp_path.resolve() / "combined"
    nested = finished_run(tmp_path / "models" / "a"), finished_run(tmp_path / "models" / "b")
    target = report.report_folder(list(nested), None, [RunDir(p) for p in nested])
    assert target == (tmp_path / "models").resolve() / "combined"
    assert report.report_folder([first], None, [RunDir(first)]) == first  # a run re-reported


def test_a_run_folder_as_out_of_several_runs_is_refused_before_any_work(
    tmp_path, no_report_work, capsys
):
    first, second = finished_run(tmp_path / "q1"), finished_run(tmp_path / "q2")
    before = (first / "summary.csv").read_bytes()
    assert cli.main(["report", str(first), str(second), "--out", str(first)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{first} holds a run of its own" in line and "give another --out" in line
    assert (first / "summary.csv").read_bytes() == before
    with pytest.raises(ProbekitError, match="summary and page of .*q1 would replace its own"):
        report.report([first], out=second)  # one run into another run's folder


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_an_unwritable_out_is_refused_before_any_work(tmp_path, no_report_work):
    first, second = finished_run(tmp_path / "q1"), finished_run(tmp_path / "q2")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ProbekitError, match="cannot write"):
            report.report([first, second], out=locked / "both")
    finally:
        locked.chmod(0o700)


def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path, no_report_work):
    first, second = finished_run(tmp_path / "q1"), finished_run(tmp_path / "q2")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ProbekitError, match="is a file, not a folder"):
        report.report([first, second], out=tmp_path / "file" / "both")


@pytest.mark.slow
def test_two_real_runs_reported_together_keep_their_own_summaries(smol, tmp_path):
    """Two ISEAR runs on the default model (two events each), then `probekit report Q1 Q2` with
    the default --out: each run's summary and page stay its own."""
    runs = [tmp_path / "runs" / "q1", tmp_path / "runs" / "q2"]
    for seed, out in enumerate(runs):
        args = ["--events", "2", "--seed", str(seed)]
        assert cli.main(["run", "isear", *args, "--out", str(out)]) == 0
    own = {out: (out / "summary.csv").read_bytes() for out in runs}
    assert cli.main(["report", *map(str, runs)]) == 0
    assert all((out / "summary.csv").read_bytes() == own[out] for out in runs)
    combined = tmp_path / "runs" / "combined"
    assert len(pd.read_csv(combined / "summary.csv")["run"].unique()) == 2
    assert (combined / "report.html").is_file()


class RowsStudy:
    """A study whose summary is its runs' rows as they are: a report that needs no model."""

    @staticmethod
    def make(name: str):
        from minimal_study import MinimalStudy

        class Study(MinimalStudy):
            def summary_rows(self, scores, run_dir, manifest):
                gap = float(scores["valid_mass"].mean())
                return [{"view": "exact", "run": run_dir.name, "gap": gap}]

        study = Study()
        study.name = name
        return study


def test_a_combined_folder_holds_one_report(tmp_path):
    """`report A B` then `report A C` (C of another study): the second report's files replace
    the first's, none of the first's summaries stays beside them; files of anyone else stay."""
    a, b = finished_run(tmp_path / "a", "one"), finished_run(tmp_path / "b", "one")
    c = finished_run(tmp_path / "c", "two")
    studies = [RowsStudy.make("one"), RowsStudy.make("two")]
    report.report([a, b], studies=studies)
    combined = tmp_path / "combined"
    first = json.loads((combined / report.RECORD).read_text())
    assert first["runs"] == [str(a), str(b)] and "summary.csv" in first["files"]
    assert "report.html" in first["files"]
    (combined / "notes.txt").write_text("mine")
    report.report([a, c], studies=studies)
    second = json.loads((combined / report.RECORD).read_text())
    assert second["runs"] == [str(a), str(c)]
    assert not (combined / "summary.csv").exists() and not (combined / "summary.md").exists()
    assert pd.read_csv(combined / "one" / "summary.csv")["run"].tolist() == ["a"]
    assert pd.read_csv(combined / "two" / "summary.csv")["run"].tolist() == ["c"]
    assert {"one/summary.csv", "two/summary.csv", "report.html"} <= set(second["files"])
    assert (combined / "notes.txt").read_text() == "mine" and "notes.txt" not in second["files"]
    report.report([a, b], studies=studies)  # and back: the per-study folders go
    assert not (combined / "one").exists() and not (combined / "two").exists()
    assert pd.read_csv(combined / "summary.csv")["run"].tolist() == ["a", "b"]
    assert (a / "summary.csv").read_text() == "metric,value\nmax_diff,0.25\n"  # a run's own
