"""`probekit.run_study`: a study run from Python as `probekit run` does it, with the same checks
(one line, nothing written), `limit`, the scaled noise figure, the view vocabulary, resume keys
refused before the model loads, older run folders, and SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import minimal_study
import pandas as pd
import pytest

import probekit
from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.core.rundir import RESULTS_FORMAT, SETTINGS, RunDir, resume_keys
from probekit.run.numerics import sample_size
from probekit.run.options import run_command
from probekit.studies import base, register

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def minimal():
    yield register(minimal_study.STUDY)
    base._REGISTRY.pop(minimal_study.STUDY.name)


@pytest.mark.slow
def test_run_study_returns_the_run(minimal, smol, tmp_path):
    run = probekit.run_study("minimal", smol, out=tmp_path / "run", days=2, epsilon=0)
    assert isinstance(run, probekit.Run) and run.complete
    assert run.path == tmp_path / "run" and run.report == run.path / "report.html"
    assert run.report.is_file()
    assert len(run.scores) == 4 and "most_probable" in run.scores and "mode" not in run.scores
    means = run.scores.groupby("name")["expected"].mean()
    assert run.summary.loc[0, "view"] == "exact"
    assert run.summary.loc[0, "gap"] == pytest.approx(means["Alice"] - means["Bob"])
    stored = json.loads((run.path / "manifest.json").read_text())
    assert run.manifest == stored
    assert stored["view"] == "exact" and stored["results_format"] == RESULTS_FORMAT == 3
    assert stored["limit"] is None and stored["epsilon"] == 0.0
    assert stored["command"].startswith("probekit.run_study('minimal'")
    assert stored["numerics"]["note"] == "skipped: under 200 prompts"


@pytest.mark.slow
def test_the_command_line_is_the_same_run(minimal, smol, tmp_path, monkeypatch):
    """`probekit run` parses argv and calls the same function: the same rows."""
    monkeypatch.setattr("probekit.engines.load_engine", lambda *a, **k: smol)
    out = tmp_path / "cli"
    assert cli.main(["run", "minimal", "--days", "2", "--epsilon", "0", "--out", str(out)]) == 0
    api = probekit.run_study("minimal", smol, out=tmp_path / "api", days=2, epsilon=0)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "scores.parquet"), api.scores)
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), api.summary)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"epsilon": -1}, "epsilon must be at least 0 (got -1)"),
        ({"epsilon": float("nan")}, "epsilon must be a finite number"),
        ({"batch_size": 0}, "batch_size must be at least 1 (got 0)"),
        ({"batch_size": -1}, "batch_size must be at least 1 (got -1)"),
        ({"batch_size": "8"}, "batch_size: '8' is not an integer"),
        ({"limit": 0}, "limit must be at least 1"),
        ({"numerics": -2}, "numerics must be at least 0"),
        ({"view": "sample"}, "view: unknown view 'sample'; choose one of exact, generate"),
        ({"events": 0}, "events must be at least 1"),
        ({"setting": "P9"}, "setting: unknown setting 'P9'"),
        ({"dtype": "int8"}, "dtype: 'int8' is not a dtype"),
        ({"device": "gpu"}, "device: 'gpu' is not a device"),
        ({"device_map": "everywhere"}, "device_map: device map 'everywhere' is neither"),
        ({"seed": -1}, "seed must be at least 0 (got -1)"),
        ({"shard": (2, 2)}, "shard: '2/2': need 0 <= i < n"),
        ({"model": 3}, "model must be a model spec (default, a hub id"),
        ({"event": 2}, "unknown keyword event for run_study('intergroup'); did you mean events?"),
        ({"authors_input": "yes"}, "authors_input must be True or False (got 'yes')"),
        ({"ray": True, "device_map": "auto"}, "ray loads one engine per actor"),
    ],
)
def test_bad_options_are_one_line_and_write_nothing(tmp_path, monkeypatch, options, message):
    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("probekit.engines.load_engine", no_load)
    out = tmp_path / "out"
    with pytest.raises(ProbekitError) as info:
        probekit.run_study("intergroup", out=out, **options)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not out.exists()


@pytest.mark.slow
def test_limit_runs_the_first_prompts_and_says_so(minimal, smol, tmp_path):
    full = probekit.run_study("minimal", smol, out=tmp_path / "full", days=3)
    part = probekit.run_study("minimal", smol, out=tmp_path / "part", days=3, limit=4)
    assert list(part.scores["prompt_index"]) == [0, 1, 2, 3]
    pd.testing.assert_frame_equal(part.scores, full.scores.head(4))
    assert part.manifest["limit"] == 4 and part.manifest["prompts"] == 4
    assert part.manifest["prompts_total"] == 6
    summary = (part.path / "summary.md").read_text()
    assert "PARTIAL RUN, the first 4 of 6 prompts" in summary
    assert "PARTIAL" not in (full.path / "summary.md").read_text()
    # limit is a resume key: the same folder with another limit is refused in one line
    with pytest.raises(ProbekitError, match="different limit"):
        probekit.run_study("minimal", smol, out=tmp_path / "part", days=3, limit=5)


@pytest.mark.slow
def test_a_limit_too_small_for_the_statistics_is_one_line(smol, tmp_path):
    """The first 4 intergroup prompts hold one perceiver only: no gap to measure. The run says
    so in one line, after keeping their scores."""
    from probekit.datasets.crowd_envent import SAMPLE_ROOT

    out = tmp_path / "small"
    with pytest.raises(ProbekitError) as info:
        probekit.run_study(
            "intergroup",
            smol,
            out=out,
            setting="P0S1T0",
            events=1,
            limit=4,
            numerics=0,
            data=str(SAMPLE_ROOT),
        )
    message = str(info.value)
    assert "the first 4 prompts (--limit) are too few for the statistics of intergroup" in message
    assert "\n" not in message and len(pd.read_parquet(out / "scores.parquet")) == 4


@pytest.mark.slow
def test_numerics_sample_scales_with_the_run(minimal, smol, tmp_path):
    assert [sample_size(n) for n in (4, 199, 200, 450, 1600, 10**6)] == [0, 0, 1, 2, 8, 8]
    assert sample_size(4, 2) == 2 and sample_size(4, 9) == 4 and sample_size(10**6, 0) == 0
    run = probekit.run_study("minimal", smol, out=tmp_path / "n", days=2, numerics=2)
    figure = run.manifest["numerics"]
    assert figure["sample"] == 2 and figure["reference_dtype"] == "float64"
    skipped = probekit.run_study("minimal", smol, out=tmp_path / "s", days=2, numerics=0)
    assert skipped.manifest["numerics"]["note"] == "skipped (numerics=0)"
    assert "skipped (numerics=0)" in (skipped.path / "summary.md").read_text()


@pytest.mark.slow
def test_resume_with_another_dtype_is_refused_before_loading(minimal, smol, tmp_path, monkeypatch):
    out = tmp_path / "run"
    probekit.run_study("minimal", smol, out=out, days=2)
    before = (out / "manifest.json").read_bytes()
    loaded = []
    monkeypatch.setattr("probekit.engines.load_engine", lambda *a, **k: loaded.append(a))
    argv = ["run", "minimal", "--days", "2", "--out", str(out), "--dtype", "bfloat16"]
    from probekit.run.study import run_parsed

    with pytest.raises(ProbekitError) as info:
        run_parsed(minimal, run_command(minimal).parse(argv[2:], "probekit run minimal"))
    assert "different dtype ('float32', now 'bfloat16')" in str(info.value)
    assert "\n" not in str(info.value) and not loaded
    assert (out / "manifest.json").read_bytes() == before
    assert cli.main(argv) == 2 and not loaded
    # the same settings resume (nothing left to score)
    again = probekit.run_study("minimal", smol, out=out, days=2)
    assert len(again.scores) == 4


@pytest.mark.slow
def test_every_manifest_field_is_declared_or_a_resume_key(minimal, smol, tmp_path):
    """A field no declaration names is a resume key, so a new setting cannot be forgotten."""
    run = probekit.run_study("minimal", smol, out=tmp_path / "run", days=1)
    keys = resume_keys(run.manifest)
    for name in ("dtype", "model", "weights", "view", "epsilon", "limit", "probe", "seed"):
        assert name in keys
    for name in ("command", "versions", "numerics", "model_source"):
        assert name not in keys
    assert "a_new_option" in resume_keys({**run.manifest, "a_new_option": 1})
    assert {s.name for s in SETTINGS if s.resume_key} >= {"device", "engine", "data_sha256"}


def test_the_views_are_named_one_way(minimal):
    """`exact` and `generate`; the old name `ev` and the old flag `--mode` are gone."""
    with pytest.raises(ProbekitError, match="^view: unknown view 'ev'; choose one of exact, gen"):
        probekit.run_study(minimal, view="ev")
    with pytest.raises(ProbekitError, match="unrecognized arguments: --mode"):
        run_command(minimal).parse(["--mode", "generate"], "probekit run minimal")


@pytest.mark.slow
def test_a_generate_run_reports_both_views(minimal, smol, tmp_path):
    generated = probekit.run_study("minimal", smol, out=tmp_path / "gen", days=1, view="generate")
    assert list(generated.summary["view"]) == ["generate", "exact"]
    assert {"response", "parsed", "most_probable"} <= set(generated.scores.columns)


@pytest.mark.slow
def test_a_format_2_folder_reads_and_is_not_resumed(minimal, smol, tmp_path):
    run = probekit.run_study("minimal", smol, out=tmp_path / "run", days=1)
    old = run.scores.rename(columns={"most_probable": "mode"})
    old.to_parquet(run.path / "scores.parquet")
    manifest = {k: v for k, v in run.manifest.items() if k != "view"}
    manifest |= {"results_format": 2, "mode": "ev"}
    (run.path / "manifest.json").write_text(json.dumps(manifest))
    folder = RunDir(run.path)
    assert folder.manifest["view"] == "exact"
    pd.testing.assert_frame_equal(folder.scores(), run.scores)
    assert [r.path for r in RunDir.discover(tmp_path)] == [run.path]
    with pytest.raises(ProbekitError, match="results format 2") as info:
        probekit.run_study("minimal", smol, out=run.path, days=1)
    assert "\n" not in str(info.value)


SIGTERM_RUN = """
import sys
sys.path.insert(0, {tests!r})
import minimal_study
import probekit
from probekit import cli
from probekit.studies import register
register(minimal_study.STUDY)
sys.exit(cli.main(["run", "minimal", "--days", "3", "--out", sys.argv[1], "--batch-size", "1"]))
"""


@pytest.mark.slow
def test_sigterm_releases_the_lock_and_says_how_to_resume(tmp_path):
    out = tmp_path / "run"
    code = SIGTERM_RUN.format(tests=str(Path(__file__).parent))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(out)], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    while not list((out / "parts").glob("part-*.parquet")) and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before its first part"
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = [line for line in err.splitlines() if line.startswith("probekit: error:")]
    assert len(lines) == 1 and "SIGTERM" in lines[0] and "run the same command again" in lines[0]
    assert not list(out.glob(".lock-shard-*")), "the shard's lock is left behind"
    assert not (out / "scores.parquet").exists()
    resumed = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "already done" in resumed.stderr
    assert list(pd.read_parquet(out / "scores.parquet")["prompt_index"]) == list(range(6))
