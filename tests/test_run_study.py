"""`probekit.run_study`: a study run from Python as `probekit run` does it, with the same checks
(one line, nothing written), `limit`, the scaled noise figure, the view vocabulary, resume keys
refused before the model loads, and SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import DATA_ROOT, REPO

import probekit
from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.core.options import as_flags
from probekit.core.rundir import RECORDED_ONLY, RESULTS_FORMAT, resume_keys
from probekit.run.study import RUN, sample_size


def test_run_study_returns_the_run(minimal, tiny, tmp_path):
    run = probekit.run_study("minimal", tiny, out=tmp_path / "run", days=2, epsilon=0)
    assert isinstance(run, probekit.Run) and run.complete
    assert run.path == tmp_path / "run" and run.report == run.path / "report.html"
    assert run.report.is_file()
    assert len(run.scores) == 4 and "most_probable" in run.scores and "mode" not in run.scores
    means = run.scores.groupby("name")["expected"].mean()
    assert run.summary.loc[0, "view"] == "exact"
    assert run.summary.loc[0, "gap"] == pytest.approx(means["Alice"] - means["Bob"])
    stored = json.loads((run.path / "manifest.json").read_text())
    assert run.manifest == stored
    assert stored["view"] == "exact" and stored["results_format"] == RESULTS_FORMAT == 4
    assert stored["limit"] is None and stored["epsilon"] == 0.0
    assert stored["command"].startswith("probekit.run_study('minimal'")
    assert stored["numerics"]["note"] == "skipped: under 200 prompts"


def test_the_command_line_is_the_same_run(minimal, tiny, tmp_path, monkeypatch):
    """`probekit run` parses argv and calls the same function: the same rows."""
    monkeypatch.setattr("probekit.engines.load_engine", lambda *a, **k: tiny)
    out = tmp_path / "cli"
    assert cli.main(["run", "minimal", "--days", "2", "--epsilon", "0", "--out", str(out)]) == 0
    api = probekit.run_study("minimal", tiny, out=tmp_path / "api", days=2, epsilon=0)
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
        ({"model": probekit.ModelOptions(dtype="int8")}, "dtype: 'int8' is not a dtype"),
        ({"model": probekit.ModelOptions(device="gpu")}, "device: 'gpu' is not a device"),
        (
            {"model": probekit.ModelOptions(device_map="everywhere")},
            "device_map: device map 'everywhere' is neither",
        ),
        ({"seed": -1}, "seed must be at least 0 (got -1)"),
        ({"shard": (2, 2)}, "shard: '2/2': need 0 <= i < n"),
        (
            {"model": 3},
            "run_study(): model must be a str, a Path, an Engine or a ModelOptions (got 3)",
        ),
        ({"event": 2}, "unknown keyword event for run_study('intergroup'); did you mean events?"),
        ({"authors_input": "yes"}, "authors_input must be True or False (got 'yes')"),
        (
            {"ray": True, "model": probekit.ModelOptions(device_map="auto")},
            "ray loads one engine per actor",
        ),
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


def study_probe(name: str, **options):
    """The first probe a run of study `name` would score with `options`, built without a
    model (the command's parser and the study's `probes`)."""
    from probekit.studies import get_study

    study = get_study(name)
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    parsed = RUN.parse(argv, f"probekit run {name}", study)
    return study.probes(parsed.study, RUN.context(parsed, lambda *a, **k: None))[0]


def units(probe) -> dict[str, list]:
    """Each unit's prompt ids, in the probe's order."""
    found: dict[str, list] = {}
    for item in probe.items():
        found.setdefault(item.unit, []).append(item.id)
    return found


JAEM = pytest.mark.reference_data("jaem_st/dimensions.json")
"""JaEm-ST's cases: its templates are in the reference data only."""


LIMITED = [  # (study, options, a limit that fits, the smallest balanced run, its message)
    ("intergroup", {}, 100, 36, "(1 event, with 36 perceiver × experiencer pairs)"),
    ("isear", {"events": 10}, 7, 3, "(1 event, with 3 genders)"),
    ("giebench", {}, 20, 5, "(1 item, with its 3 prompt types, and the identity swaps)"),
    pytest.param(
        "jaem-st", {"data": str(DATA_ROOT)}, 60, 1, "(1 sample, with 1 answer order)", marks=JAEM
    ),
]


@pytest.mark.parametrize(("name", "options", "limit", "smallest", "message"), LIMITED)
def test_limit_keeps_whole_units_taken_in_turn_from_every_group(
    name, options, limit, smallest, message
):
    """`limit` is a smoke run the statistics can use: whole units (every perceiver pair,
    gender, prompt type of each), taken in turn from each group (emotion, category, template ×
    group), the probe's order kept; a limit that fits no whole unit is refused, before any
    scoring, with the smallest limit that works, and that limit works."""
    probe = study_probe(name, **options)
    whole = units(probe)
    limited = probe.limited(limit)
    kept = units(limited)
    assert len(limited) <= limit < len(probe) and limited.whole is probe
    assert all(kept[unit] == whole[unit] for unit in kept)  # whole units only
    assert len(limited) == sum(len(ids) for ids in kept.values())
    order = [item.id for item in probe.items() if item.unit in kept]
    assert [item.id for item in limited.items()] == order  # the probe's own order
    group_of = {item.unit: str(probe.unit_group(item)) for item in probe.items()}
    counts = pd.Series([group_of[unit] for unit in kept]).value_counts()
    every = set(group_of.values())
    assert counts.max() - counts.min() <= 1  # balanced: one more unit at most per group
    assert len(counts) == min(len(kept), len(every))  # no group twice before all once
    assert limited.config()["limit"]["units"] == list(kept)  # the manifest names them
    with pytest.raises(ProbekitError) as info:
        probe.limited(smallest - 1)
    text = str(info.value)
    assert text.startswith(f"limit={smallest - 1} is too small for {name}")
    assert as_flags(info.value.marked).startswith(f"--limit {smallest - 1} is too")  # the flag
    assert f"the smallest balanced run is {smallest} prompts" in text and message in text
    assert len(probe.limited(smallest)) == smallest
    assert probe.limited(len(probe)) is probe  # everything fits: the whole run


def test_isear_limit_1_is_refused_not_one_gender():
    """`limit=1` used to score one prompt and report a max_diff and a mark from one gender."""
    probe = study_probe("isear", events=4)
    with pytest.raises(ProbekitError, match="smallest balanced run is 3 prompts"):
        probe.limited(1)
    limited = probe.limited(3)
    assert {item.key["gender"] for item in limited.items()} == set(probe.genders)


@pytest.mark.parametrize(
    ("name", "options", "limit", "smallest"),
    [("intergroup", {"events": 1}, 36, 36), ("isear", {"events": 3}, 1, 3)],
)
def test_a_too_small_limit_is_refused_before_any_work(
    tmp_path, monkeypatch, name, options, limit, smallest
):
    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("probekit.engines.load_engine", no_load)
    out = tmp_path / "out"
    with pytest.raises(ProbekitError) as info:
        probekit.run_study(name, out=out, limit=smallest - 1, **options)
    assert f"the smallest balanced run is {smallest} prompts" in str(info.value)
    assert "\n" not in str(info.value) and not out.exists()


def test_limit_runs_whole_units_and_says_so(minimal, tiny, tmp_path):
    full = probekit.run_study("minimal", tiny, out=tmp_path / "full", days=3)
    part = probekit.run_study("minimal", tiny, out=tmp_path / "part", days=3, limit=5)
    assert list(part.scores["prompt_index"]) == [0, 1, 2, 3]  # two whole days: 4 of 5 fit
    pd.testing.assert_frame_equal(part.scores, full.scores.head(4))
    assert part.manifest["limit"] == 5 and part.manifest["prompts"] == 4
    assert part.manifest["prompts_total"] == 6
    assert part.manifest["probe"]["limit"]["units"] == ["0", "1"]
    summary = (part.path / "summary.md").read_text()
    assert "PARTIAL RUN (limit=5): 4 of 6 prompts, all those of 2 of the 3 units" in summary
    assert "PARTIAL" not in (full.path / "summary.md").read_text()
    # limit is a resume key: the same folder with another limit is refused in one line
    with pytest.raises(ProbekitError, match="different limit"):
        probekit.run_study("minimal", tiny, out=tmp_path / "part", days=3, limit=4)


SMOKE = [  # (study, options, limit, unit of the headline): one keyword, every study
    ("intergroup", {"setting": "P0S1T0"}, 72, "z-scores"),
    ("isear", {"events": 4}, 6, "probability"),
    ("giebench", {"prompt": ["id"]}, 4, "probability"),
    pytest.param("jaem-st", {"data": str(DATA_ROOT)}, 54, "probability", marks=JAEM),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "options", "limit", "unit"), SMOKE)
def test_a_smoke_run_of_every_study_reads_right(smol, tmp_path, capsys, name, options, limit, unit):
    """`limit` alone makes a smoke run of every study that ends with its statistics, its
    headline in one shape, the files a sample-data run marks as such, and a closing line that
    names report.html."""
    if name not in ("giebench", "jaem-st"):
        from probekit.studies import get_study

        options = {**options, "data": str(get_study(name).dataset.sample)}
    out = tmp_path / name
    run = probekit.run_study(name, smol, out=out, limit=limit, numerics=0, **options)
    headline = run.headline
    assert isinstance(headline, probekit.Headline) and headline.unit == unit
    assert headline.primary and headline.meaning.endswith(".") and headline.value is not None
    assert headline.low <= headline.value <= headline.high
    assert str(headline).startswith(f"{headline.label} ({headline.view}): ")
    assert f" {unit} " in str(headline)
    assert len(run.scores) <= limit and run.manifest["limit"] == limit
    assert "PARTIAL RUN" in (out / "summary.md").read_text()
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert closing.startswith(f"files: {out.resolve()}/ (report.html, summary.csv, summary.md")
    sample = name != "jaem-st"  # JaEm-ST has no probekit sample: the real files
    assert (out / "summary.md").read_text().startswith("**SAMPLE DATA") == sample
    data = pd.read_csv(out / "summary.csv")["data"]
    assert data.str.startswith("probekit's own sample").all() == sample
    assert ("Sample data, not the study" in (out / "report.html").read_text()) == sample
    if name == "giebench":  # the run's own tables too
        assert pd.read_csv(out / "accuracy.csv")["data"].str.startswith("probekit's own").all()
    if name == "intergroup":
        tables = (out / "paper_tables.md").read_text()
        assert "| HuggingFaceTB/SmolLM2-135M-Instruct (sample data) |" in tables
        assert "default" not in tables
        row = run.summary.iloc[0]
        assert row["refusal_rate"] == pytest.approx(1 - run.scores["valid_mass"].mean())
        assert row["power"] == "not computed: 2 events kept, under 30"


def test_numerics_sample_scales_with_the_run(minimal, tiny, tmp_path):
    assert [sample_size(n) for n in (4, 199, 200, 450, 1600, 10**6)] == [0, 0, 1, 2, 8, 8]
    assert sample_size(4, 2) == 2 and sample_size(4, 9) == 4 and sample_size(10**6, 0) == 0
    run = probekit.run_study("minimal", tiny, out=tmp_path / "n", days=2, numerics=2)
    figure = run.manifest["numerics"]
    assert figure["sample"] == 2 and figure["reference_dtype"] == "float64"
    skipped = probekit.run_study("minimal", tiny, out=tmp_path / "s", days=2, numerics=0)
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
    with pytest.raises(ProbekitError) as info:
        RUN.execute(minimal, RUN.parse(argv[2:], "probekit run minimal", minimal))
    assert "different dtype ('float32', now 'bfloat16')" in str(info.value)
    assert "\n" not in str(info.value) and not loaded
    assert (out / "manifest.json").read_bytes() == before
    assert cli.main(argv) == 2 and not loaded
    # the same settings resume (nothing left to score)
    again = probekit.run_study("minimal", smol, out=out, days=2)
    assert len(again.scores) == 4


def test_every_manifest_field_is_declared_or_a_resume_key(minimal, tiny, tmp_path):
    """A field no declaration names is a resume key, so a new setting cannot be forgotten."""
    run = probekit.run_study("minimal", tiny, out=tmp_path / "run", days=2)
    keys = resume_keys(run.manifest)
    for name in ("dtype", "model", "weights", "view", "epsilon", "limit", "probe", "seed"):
        assert name in keys
    for name in ("command", "versions", "numerics", "model_source"):
        assert name not in keys
    assert "a_new_option" in resume_keys({**run.manifest, "a_new_option": 1})
    assert not RECORDED_ONLY & {"device", "engine", "data_sha256"}


def test_the_views_are_named_one_way(minimal):
    """`exact` and `generate`; the old name `ev` and the old flag `--mode` are gone."""
    with pytest.raises(ProbekitError, match="^view: unknown view 'ev'; choose one of exact, gen"):
        probekit.run_study(minimal, view="ev")
    with pytest.raises(ProbekitError, match="unrecognized arguments: --mode"):
        RUN.parse(["--mode", "generate"], "probekit run minimal", minimal)


def test_a_generate_run_reports_both_views(minimal, tiny, tmp_path):
    generated = probekit.run_study("minimal", tiny, out=tmp_path / "gen", days=2, view="generate")
    assert list(generated.summary["view"]) == ["generate", "exact"]
    assert {"response", "parsed", "most_probable"} <= set(generated.scores.columns)


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


def test_run_headline_is_the_studys_one_primary_headline(tmp_path):
    from probekit.reporting.headline import Headline

    first = Headline("Δ", "exact", 0.5, primary=True, unit="z-scores")
    other = Headline("Δ", "generate", 0.4)
    run = probekit.Run(tmp_path, pd.DataFrame(), {}, None, headlines=[other, first])
    assert run.headline is first
    several = probekit.Run(tmp_path, pd.DataFrame(), {}, None, headlines=[first, first])
    with pytest.raises(ProbekitError, match="has 2 headlines; read .headlines"):
        _ = several.headline
    with pytest.raises(ProbekitError, match="has no headline"):
        _ = probekit.Run(tmp_path, pd.DataFrame(), {}, None).headline
    assert probekit.Run(tmp_path, pd.DataFrame(), {}, None, headlines=[other]).headline is other
