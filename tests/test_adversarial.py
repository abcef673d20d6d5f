"""What an adversarial user meets (issue 62): a report never writes into another run's folder, no
command writes over a file it reads, an option that cannot apply is refused (not ignored), and
every mistake is one line naming the thing, never a traceback or a line that blames the wrong
thing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import minimal_study
import numpy as np
import pandas as pd
import pytest
from test_combined_report import finished_run
from test_lens import lens_minimal
from test_run_state import CountingEngine

import probekit
from probekit import cli
from probekit.core.errors import ProbekitError, StatisticsError
from probekit.core.rundir import RESULTS_FORMAT, RunDir
from probekit.run import lens as run_lens
from probekit.run.command import stop_on_sigterm
from probekit.stats import bootstrap_ci, bootstrap_mean


@pytest.fixture
def no_report_work(monkeypatch):
    """Any study lookup fails the test: the refusal must come before any work."""

    def work(name):
        pytest.fail(f"the study {name} was reported before the folders were checked")

    monkeypatch.setattr("probekit.studies.base.get_study", work)


def one_line(capsys) -> str:
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


# ---------------------------------------------------------------- a report writes into a run


def test_a_report_of_several_studies_never_writes_into_a_run_named_after_its_study(
    tmp_path, no_report_work, capsys
):
    """`probekit run` names a run's folder after its study: a report over their parent folder
    would put the isear runs' combined summary into the isear run's own folder."""
    runs = tmp_path / "runs"
    isear = finished_run(runs / "isear")
    finished_run(runs / "more" / "isear-b")  # a second isear run
    finished_run(runs / "giebench", study="giebench")
    before = (isear / "summary.csv").read_bytes()
    assert cli.main(["report", str(runs)]) == 2
    line = one_line(capsys)
    assert f"{isear} holds a run of its own: the combined summary and page of 2 runs" in line
    assert (isear / "summary.csv").read_bytes() == before
    with pytest.raises(ProbekitError, match="isear holds a run of its own.*give another out"):
        probekit.report(runs, out=runs)


def test_a_run_named_after_its_study_is_rewritten_only_from_itself(tmp_path, monkeypatch):
    """The one run of its study in a folder of several studies: its summary is its own."""
    runs = tmp_path / "runs"
    finished_run(runs / "isear")
    finished_run(runs / "giebench", study="giebench")
    seen = []

    def stop(name):
        seen.append(name)
        raise ProbekitError("stop")  # the folders passed their checks: no report needed here

    monkeypatch.setattr("probekit.studies.base.get_study", stop)
    with pytest.raises(ProbekitError, match="^stop$"):
        probekit.report(runs)
    assert seen


def test_a_report_of_no_folder_is_one_line():
    with pytest.raises(ProbekitError, match="no run folder to report"):
        probekit.report([])


def test_a_run_folder_the_report_cannot_write_is_named_not_out(tmp_path, monkeypatch):
    """A read-only run reported into a writable out: the line names the run folder."""
    run = finished_run(tmp_path / "run")
    real = Path.write_bytes

    def read_only(self, data):
        if self.parent.resolve() == run.resolve():
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", read_only)
    with pytest.raises(ProbekitError) as info:
        probekit.report(run, out=tmp_path / "out", studies=[minimal_study.STUDY])
    said = str(info.value)
    assert f"the run folder {run} is not writable" in said and "out" not in said.split(";")[0]


# ---------------------------------------------------------------- outputs over inputs


@pytest.mark.parametrize("how", ["same", "relative", "link"])
def test_scores_over_their_prompts_are_refused_before_work(tmp_path, monkeypatch, capsys, how):
    prompts = tmp_path / "p.jsonl"
    text = '{"id": "a", "text": "x"}\n'
    prompts.write_text(text)
    scores = {"same": prompts, "relative": Path("sub/../p.jsonl"), "link": tmp_path / "l"}[how]
    (tmp_path / "sub").mkdir()
    if how == "link":
        scores.symlink_to(prompts)
    monkeypatch.chdir(tmp_path)

    def load(*args, **kwargs):
        pytest.fail("a model was loaded")

    monkeypatch.setattr("probekit.engines.load_engine", load)
    argv = ["score", "--prompts", str(prompts), "--scores", str(scores), "--answers", "A,B"]
    assert cli.main(argv) == 2
    line = one_line(capsys)
    assert "--scores" in line and "is the prompts file" in line
    assert prompts.read_text() == text
    with pytest.raises(ProbekitError, match="scores .* is the prompts file"):
        probekit.score_file(CountingEngine(), prompts, scores, "A,B")


# ---------------------------------------------------------------- options that do nothing


LOAD_OPTIONS = [
    dict(dtype="bf16"),
    dict(tolerance=0.01),
    dict(device="cpu"),
    dict(device_map="auto"),
]


@pytest.mark.parametrize("load", LOAD_OPTIONS)
def test_load_options_with_a_loaded_model_are_refused_not_ignored(tmp_path, load):
    name = next(iter(load))
    said = f"{name}=.* cannot apply to a model loaded already"
    with pytest.raises(ProbekitError, match=said):
        probekit.run_study(minimal_study.STUDY, CountingEngine(), out=tmp_path / "r", **load)
    with pytest.raises(ProbekitError, match=said):
        probekit.lens_study(minimal_study.STUDY, CountingEngine(), out=tmp_path / "l", **load)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "x"}\n')
    with pytest.raises(ProbekitError, match=said):
        probekit.score_file(CountingEngine(), prompts, tmp_path / "s.parquet", "A,B", **load)
    assert not any((tmp_path / d).exists() for d in ("r", "l", "s.parquet"))


def test_a_loaded_model_with_its_default_options_runs(tmp_path):
    run = probekit.run_study(
        minimal_study.STUDY, CountingEngine(), out=tmp_path / "r", engine="hf", days=2, quiet=True
    )
    assert run.summary["gap"].tolist() == [0.0]


# ---------------------------------------------------------------- tracebacks


def test_an_abstract_contract_is_one_line_naming_what_to_subclass():
    with pytest.raises(
        ProbekitError, match="cannot make a Probe: config, items, parse not defined"
    ):
        probekit.Probe()
    with pytest.raises(ProbekitError, match="subclass Study and define them"):
        probekit.Study()

    class Half(probekit.Probe):
        def items(self):
            return iter(())

        def config(self):
            return {}

    with pytest.raises(ProbekitError, match="cannot make a Half: parse not defined; subclass "):
        Half()


UNITS = pd.DataFrame({"unit": [1, 2, 3, 4], "value": [1.0, 2.0, 3.0, 4.0]})


@pytest.mark.parametrize("returned", ["abc", "1.5", None, [1, 2]])
def test_a_statistic_that_returns_no_number_is_one_line(returned):
    with pytest.raises(ProbekitError, match="a statistic must return a number, not "):
        bootstrap_ci(UNITS, "unit", lambda rows: returned, n=5)


def test_a_batched_statistic_of_text_is_one_line():
    from probekit.stats.bootstrap import bootstrap_units

    with pytest.raises(ProbekitError, match="a batched statistic must return numbers"):
        bootstrap_units(4, lambda drawn: np.array(["x"] * len(drawn)), n=5, batched=True)


def test_a_mean_over_an_infinite_value_gives_no_half_nan_interval():
    infinite = UNITS.assign(value=[1.0, 2.0, np.inf, 3.0])
    for make in (
        lambda: bootstrap_mean(infinite, "unit", "value"),
        lambda: bootstrap_ci(infinite, "unit", lambda rows: rows["value"].mean()),
    ):
        with pytest.raises(StatisticsError, match="the statistic is inf on the whole table"):
            make()
    finite = bootstrap_mean(UNITS, "unit", "value", n=50)
    assert np.isfinite([finite.low, finite.high]).all()


def minimal_run(out: Path) -> Path:
    probekit.run_study(minimal_study.STUDY, CountingEngine(), out=out, days=2, quiet=True)
    return out


@pytest.mark.parametrize(
    ("key", "record"),
    [
        ("numerics", {"dtype": "float32", "max_abs_diff": "big", "score": 1}),
        ("numerics", {"dtype": "float32", "max_abs_diff": 0.1}),
        ("precision", {"tier": "float32", "tolerance": "x", "tried": 3}),
    ],
)
def test_a_manifest_with_wrong_types_under_numerics_is_reported_in_one_line(tmp_path, key, record):
    out = minimal_run(tmp_path / "run")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, key: record}))
    probekit.report(out, studies=[minimal_study.STUDY])
    markdown = (out / "summary.md").read_text()
    assert f"- run: {key}: not as probekit records it (" in markdown


def test_a_lens_folder_whose_layer_folder_is_a_file_is_refused_before_work(tmp_path, monkeypatch):
    out = tmp_path / "lens"
    (out / "layers").mkdir(parents=True)
    (out / "layers" / "L0").write_text("x")
    monkeypatch.setattr(run_lens, "logit_lens", lambda *a, **k: pytest.fail("scored"))
    with pytest.raises(ProbekitError, match=r"layers/L0 is a file where the lens writes a folder"):
        lens_minimal(CountingEngine(), out, layers=[0])
    (out / "layers" / "L0").unlink()
    (out / "layers").rmdir()
    (out / "layers").write_text("x")
    with pytest.raises(ProbekitError, match=r"lens/layers is a file where the lens writes"):
        lens_minimal(CountingEngine(), out, layers=[0])


# ---------------------------------------------------------------- misleading lines


def test_a_resume_with_another_seed_names_the_seed(tmp_path):
    """A probe whose configuration holds the seed: the line names the seed, not the probe."""
    folder = RunDir(tmp_path)
    probe = {"events": list(range(50)), "seed": 0}
    old = {"results_format": RESULTS_FORMAT, "study": "s", "probe": probe, "seed": 0}
    folder.write_manifest(old)
    new = {**old, "probe": {**probe, "seed": 5}, "seed": 5}
    with pytest.raises(ProbekitError, match=r"a run with a different seed \(0, now 5\); use"):
        folder.check_resume(new)
    other = {**old, "probe": {"events": [0], "seed": 0}}
    with pytest.raises(ProbekitError, match=r"different probe.events \(\[0, 1, .*\], now \[0\]\)"):
        folder.check_resume(other)


def test_answers_from_a_folder_say_it_is_a_folder(tmp_path, capsys):
    argv = ["score", "--prompts", "p.jsonl", "--scores", str(tmp_path / "s.parquet")]
    assert cli.main([*argv, "--answers", f"@{tmp_path}"]) == 2
    assert "is a folder, not a file of one answer a line" in one_line(capsys)


class Unhandled(Exception):
    """A SIGTERM that no handler of probekit's caught."""


@pytest.fixture
def sigterm_caught():
    """A SIGTERM that probekit leaves to the default handler raises `Unhandled`, not a kill."""

    def caught(signum, frame):
        raise Unhandled

    previous = signal.signal(signal.SIGTERM, caught)
    yield
    signal.signal(signal.SIGTERM, previous)


def sigterm_now(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    raise AssertionError("SIGTERM did not stop the lens")


def test_a_lens_stopped_by_sigterm_says_where_its_parts_are(
    tiny, tmp_path, monkeypatch, sigterm_caught
):
    monkeypatch.setattr(run_lens, "logit_lens", sigterm_now)
    out = tmp_path / "lens"
    with pytest.raises(ProbekitError, match="stopped by SIGTERM; the finished parts are kept in"):
        lens_minimal(tiny, out, layers=[0])
    assert not list(out.glob(".lock-shard-*"))


def test_parts_are_said_kept_only_where_the_folder_exists(tmp_path, sigterm_caught):
    never = tmp_path / "never"
    said = f"stopped by SIGTERM before {never} was made"
    with pytest.raises(ProbekitError, match=said), stop_on_sigterm(never):
        sigterm_now()
    assert not never.exists()
