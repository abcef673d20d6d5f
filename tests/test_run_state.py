"""The state around a run, on the run loop with a counting fake engine (no model): rows are reused
only where the settings and prompts they were scored under are the run's, whatever manifest lies
beside them; a finished run is not scored again when its parts are gone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from probekit.core.answers import AnswerSet
from probekit.core.items import Item
from probekit.core.progress import silenced
from probekit.core.store import INDEX
from probekit.engines.base import Engine, ScoreResult, ScorerStats
from probekit.run.loop import run_probe
from probekit.run.parts import scan_parts
from probekit.studies.base import Probe

ANSWERS = AnswerSet.range(0, 3)
MISMATCHED = ".mismatched"  # the suffix of set-aside rows (probekit.run.parts.MISMATCHED)


class GroupProbe(Probe):
    """`events` prompts for each of `groups`, ids `<group>|<event>`; `config` records the groups
    unless `forgetful` (a study whose config misses an option: only the ids tell)."""

    name = "groups"
    answers = ANSWERS
    key_columns = ("group", "event")

    def __init__(self, groups=("a man", "a woman"), events: int = 6, forgetful: bool = False):
        self.groups, self.events, self.forgetful = list(groups), events, forgetful

    def items(self) -> Iterator[Item]:
        for group in self.groups:
            for event in range(self.events):
                text = f"How does {group} feel after event {event}?"
                yield Item(
                    f"{group}|{event}",
                    key={"group": group, "event": event},
                    messages=({"role": "user", "content": text},),
                )

    def parse(self, response: str) -> Any:
        return response

    def config(self) -> dict[str, Any]:
        return {"events": self.events, **({} if self.forgetful else {"groups": self.groups})}


class CountingEngine(Engine):
    """Scores every prompt with one fixed distribution that depends on `dtype` (so rows scored
    under one dtype are told from another's), counting the prompts it scores; an engine without
    precision tiers (`Engine`'s answers)."""

    engine = name = "fake"

    def __init__(self, dtype: str = "float32") -> None:
        self.dtype = dtype
        self.scored = 0

    def describe(self) -> dict[str, Any]:
        return {
            "model": "fake",
            "model_source": "fake",
            "weights": "fake",
            "dtype": self.dtype,
            "device": "cpu",
            "engine": "fake",
        }

    def encode(self, item: Item, as_string: bool = False) -> SimpleNamespace:
        return SimpleNamespace(input_ids=[len(item.id)])

    def scorer(self, answers: AnswerSet, **options: Any) -> SimpleNamespace:
        n = len(answers.answers)
        probs = np.full(n, 1 / n)  # bfloat16: uniform; float32: 1/2, 1/4, ..., the last twice
        if self.dtype == "float32":
            probs = 0.5 ** np.arange(1, n + 1)
            probs[-1] *= 2

        def score(prompts, window: int = 4096, progress: Any = None):
            prompts = list(prompts)
            for start in range(0, len(prompts), 4):  # batches of 4, as a scorer's
                batch = prompts[start : start + 4]
                self.scored += len(batch)
                if progress is not None:
                    progress.update(len(batch))
                for _ in batch:
                    yield ScoreResult(probs, 0.9, 0.0, "0", "0", expected=1.0, std=1.0)

        return SimpleNamespace(score=score, batch_size=4, stats=ScorerStats(), answers=answers)

    def decode(self, tokens: Any) -> list[str]:  # the Engine protocol's; no run here generates
        raise NotImplementedError

    def hookable(self) -> Any:
        raise NotImplementedError


def manifest(probe: GroupProbe, dtype: str = "float32") -> dict[str, Any]:
    return {"model": "fake", "dtype": dtype, "probe": probe.config(), "view": "exact"}


def run(probe: GroupProbe, engine: CountingEngine, out: Path) -> pd.DataFrame:
    """The run, quiet: no first line, so no pace sample, and `engine.scored` counts the run's
    own prompts (the lines about its state are said all the same)."""
    with silenced():
        path = run_probe(probe, engine, out, manifest(probe, engine.dtype), chunk_size=4)
    assert path is not None
    return pd.read_parquet(path)


def remove_manifest_and_scores(out: Path) -> None:
    """What the damaged-manifest message advises: the parts stay."""
    (out / "manifest.json").unlink()
    (out / "scores.parquet").unlink()


def test_parts_of_another_dtype_are_set_aside_and_scored_again(tmp_path, capsys):
    out = tmp_path / "run"
    run(GroupProbe(), CountingEngine("float32"), out)
    remove_manifest_and_scores(out)
    capsys.readouterr()
    engine = CountingEngine("bfloat16")
    scores = run(GroupProbe(), engine, out)
    err = capsys.readouterr().err
    assert "already done" not in err
    (line,) = [line for line in err.splitlines() if "set aside" in line]
    assert "scored under another dtype ('float32', now 'bfloat16')" in line
    assert engine.scored == 12  # every prompt scored again, under the new dtype
    assert (scores["p::0"] == 0.25).all()
    assert json.loads((out / "manifest.json").read_text())["dtype"] == "bfloat16"
    assert len(list((out / "parts").glob(f"*{MISMATCHED}"))) == 3


def test_parts_of_other_groups_are_set_aside_and_scored_again(tmp_path, capsys):
    out = tmp_path / "run"
    run(GroupProbe(["a man", "a woman"]), CountingEngine(), out)
    remove_manifest_and_scores(out)
    capsys.readouterr()
    engine = CountingEngine()
    scores = run(GroupProbe(["a woman", "a man"]), engine, out)
    err = capsys.readouterr().err
    assert "already done" not in err and "scored under another probe" in err
    assert engine.scored == 12
    assert list(scores["group"]) == ["a woman"] * 6 + ["a man"] * 6
    assert list(scores["prompt_id"].str.split("|").str[0]) == list(scores["group"])


def test_the_prompt_ids_are_checked_when_the_settings_do_not_tell(tmp_path, capsys):
    out = tmp_path / "run"
    run(GroupProbe(["a man", "a woman"], forgetful=True), CountingEngine(), out)
    remove_manifest_and_scores(out)
    capsys.readouterr()
    engine = CountingEngine()
    scores = run(GroupProbe(["a man", "a person"], forgetful=True), engine, out)
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "set aside" in line]
    assert "2 parts hold 8 rows of other prompts (prompt 6 has another id)" in line
    # Parts of 4 prompts: 0-3 are this run's rows; 4-7 mixes both groups and is redone whole.
    assert engine.scored == 8
    assert list(scores["prompt_id"]) == [f"a man|{i}" for i in range(6)] + [
        f"a person|{i}" for i in range(6)
    ]


def test_a_finished_run_without_its_parts_is_not_scored_again(tmp_path, capsys):
    out = tmp_path / "run"
    first = run(GroupProbe(), CountingEngine(), out)
    for part in (out / "parts").iterdir():
        part.unlink()
    capsys.readouterr()
    engine = CountingEngine()
    again = run(GroupProbe(), engine, out)
    assert engine.scored == 0 and "nothing to score" in capsys.readouterr().err
    pd.testing.assert_frame_equal(again, first)


def test_scores_of_other_settings_are_not_taken_for_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    run(GroupProbe(), CountingEngine("float32"), out)
    for part in (out / "parts").iterdir():
        part.unlink()
    (out / "manifest.json").unlink()
    capsys.readouterr()
    engine = CountingEngine("bfloat16")
    scores = run(GroupProbe(), engine, out)
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "set aside" in line]
    assert "scores.parquet holds rows scored under another dtype ('float32', now" in line
    assert engine.scored == 12 and (scores["p::0"] == 0.25).all()
    assert (out / f"scores.parquet{MISMATCHED}").is_file()


def test_the_same_run_resumes_its_parts(tmp_path, capsys):
    out = tmp_path / "run"
    first = run(GroupProbe(), CountingEngine(), out)
    remove_manifest_and_scores(out)
    capsys.readouterr()
    engine = CountingEngine()
    again = run(GroupProbe(), engine, out)
    assert engine.scored == 0 and "12 of 12 prompts of this shard already done" in (
        capsys.readouterr().err
    )
    pd.testing.assert_frame_equal(again, first)


def test_parts_without_a_record_of_their_settings_are_not_reused(tmp_path, capsys):
    """Parts written before parts recorded their settings cannot be told apart: redone."""
    import pyarrow.parquet as pq

    out = tmp_path / "run"
    run(GroupProbe(), CountingEngine(), out)
    remove_manifest_and_scores(out)
    for part in (out / "parts").glob("*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.replace_schema_metadata({}), part, write_page_checksum=True)
    capsys.readouterr()
    engine = CountingEngine()
    run(GroupProbe(), engine, out)
    assert engine.scored == 12 and "written by an older probekit" in capsys.readouterr().err


def test_a_key_names_the_setting_that_differs():
    from probekit.core.rundir import RowKey

    ids = [f"p{i}" for i in range(3)]
    key = RowKey.of({"dtype": "float32", "probe": {"events": list(range(500))}}, ids)
    other = RowKey.of({"dtype": "float32", "probe": {"events": list(range(501))}}, ids)
    indices = np.arange(3)
    assert key.mismatch(key.metadata(), indices, ids) is None
    reason = key.mismatch(other.metadata(), indices, ids)
    assert reason.startswith("scored under another probe (sha256 ")  # long values: their hash
    assert key.mismatch(key.metadata(), np.array([5]), ["p5"]).startswith("of prompt indices")
    assert len(key.metadata()[b"probekit.settings"]) < 400
    assert scan_parts(Path("/nonexistent"), key) == []


@pytest.mark.parametrize("field", ["limit", "epsilon", "seed"])
def test_every_resume_key_is_recorded(field):
    from probekit.core.rundir import RowKey

    key = RowKey.of({"model": "m", field: 1}, ["a"])
    assert field in key.settings
    assert "command" not in RowKey.of({"command": "probekit run x"}, ["a"]).settings
    assert RowKey.of({"model": "m", INDEX: 1}, ["a"]).settings  # an undeclared field counts too


# ---------------------------------------------------------------------- writes beside the run


class FigureStudy:
    """The minimal study of the docs, drawing a figure in its report (a study's report writes
    figures beside the run), and meeting a statistic's limit when `too_few`."""

    @staticmethod
    def make(too_few: bool = False):
        from minimal_study import MinimalStudy

        from probekit.core.errors import StatisticsError
        from probekit.reporting.figures import new_figure, save_figure

        class Study(MinimalStudy):
            def report_view(self, scores, run_dir, manifest, view, suffix):
                if too_few:
                    raise StatisticsError("paired t-tests need at least 2 kept units")
                fig = new_figure(2, 2)
                fig.add_subplot().plot([0, 1], [0, 1])
                save_figure(fig, run_dir / "gap.png", scores[["valid_mass"]])
                return super().report_view(scores, run_dir, manifest, view, suffix)

        return Study()


def test_a_full_disk_while_writing_figures_is_a_disk_error(tmp_path, monkeypatch):
    """ENOSPC while the figures of a partial run are written: one line naming the figure and the
    full disk, not "too few prompts for the statistics"."""
    import errno
    import os

    from matplotlib.figure import Figure

    from probekit import run_study
    from probekit.core.errors import ProbekitError

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", full)
    out = tmp_path / "run"
    with pytest.raises(ProbekitError) as info:
        run_study(FigureStudy.make(), CountingEngine(), out=out, limit=4, days=3)
    message = str(info.value)
    assert "\n" not in message and "too few" not in message
    assert f"cannot write {out / 'gap.png'}: No space left on device" in message
    assert "the disk is full" in message
    assert not [p for p in out.iterdir() if p.name.startswith(".gap.png")]  # no temporary left


def test_a_partial_run_too_small_for_a_statistic_says_so(tmp_path):
    """A balanced smoke run whose statistics still find too little: the statistic's own line."""
    from probekit import run_study
    from probekit.core.errors import StatisticsError

    with pytest.raises(StatisticsError, match=r"^paired t-tests need at least 2 kept units$"):
        run_study(FigureStudy.make(too_few=True), CountingEngine(), out=tmp_path, limit=4, days=3)


def test_scores_are_not_read_under_a_manifest_of_other_settings(tmp_path):
    """A manifest written anew beside finished scores (by hand, or an older probekit's rerun):
    reading the run says so instead of labelling the rows with the wrong settings."""
    from probekit.core.errors import ProbekitError
    from probekit.core.rundir import RunDir

    out = tmp_path / "run"
    scores = run(GroupProbe(), CountingEngine("float32"), out)
    pd.testing.assert_frame_equal(RunDir(out).scores(), scores)
    stored = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**stored, "dtype": "bfloat16"}))
    with pytest.raises(ProbekitError) as info:
        RunDir(out).scores()
    assert "holds rows scored under dtype 'float32', but manifest.json says 'bfloat16'" in str(
        info.value
    )


def test_run_probes_limit_is_the_runs_smoke_run(tmp_path):
    """`limit` means one thing: `run_probe(..., limit=N)` keeps the whole units of every group
    that fit in N prompts, as `probekit run --limit N` does, and records the limit."""
    from minimal_study import MinimalProbe

    from probekit.core.errors import ProbekitError

    probe = MinimalProbe(3)  # 3 days (units) of 2 prompts
    with silenced():
        path = run_probe(probe, CountingEngine(), tmp_path / "run", manifest(probe), limit=5)
    scores = pd.read_parquet(path)
    assert scores["day"].tolist() == [0, 0, 1, 1]  # two whole days, not the first 5 prompts
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["limit"] == 5
    with pytest.raises(ProbekitError, match="too small for minimal"):
        run_probe(probe, CountingEngine(), tmp_path / "small", manifest(probe), limit=1)


def test_a_run_on_an_engine_of_ones_own_resumes(tmp_path):
    """A loaded engine whose name is not `hf` (`describe()["engine"]`, here `fake`): the second
    call resumes the run, scoring nothing again (its engine is known from the engine given, not
    from the `engine=` option, whose default is `hf`)."""
    from probekit import run_study

    first, again = CountingEngine(), CountingEngine()
    run_study(FigureStudy.make(), first, out=tmp_path, days=3, quiet=True)
    run_study(FigureStudy.make(), again, out=tmp_path, days=3, quiet=True)
    assert first.scored > 0 and again.scored == 0
