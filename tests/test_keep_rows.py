"""Nothing computed is lost: `probekit score` stopped mid-stream keeps the rows scored and the
same call finishes from them; `probekit patch` keeps its sweep's rows when cut short or when its
last write fails; every
command that writes much refuses, before the work, a disk without room for it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import minimal_study
import pandas as pd
import pytest
from test_out_paths import fail_on, no_load
from test_run_state import CountingEngine

import probekit
import probekit.mechanism.patching
from probekit import cli
from probekit.core import io
from probekit.core.errors import ProbekitError
from probekit.core.progress import silenced

PROMPTS = 20


class Failing(CountingEngine):
    """A counting engine whose scorer batches 2 prompts (a part: 4) and fails with `error` once
    it has scored more than `after` prompts."""

    def __init__(self, after: int | None = None, error: Exception | None = None) -> None:
        super().__init__()
        self.after, self.error = after, error or RuntimeError("device lost")

    def scorer(self, answers, **options):
        scorer = super().scorer(answers, **options)
        scorer.batch_size, plain = 2, scorer.score

        def score(prompts, window=4096, progress=None):
            for result in plain(prompts, window, progress):
                if self.after is not None and self.scored > self.after:
                    if self.error == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    raise self.error
                yield result

        scorer.score = score
        return scorer


def prompts_file(tmp_path, count=PROMPTS):
    path = tmp_path / "p.jsonl"
    lines = [json.dumps({"id": f"d{i}", "text": "Day?"}) + "\n" for i in range(count)]
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize("error", [RuntimeError("device lost"), ProbekitError("out of memory")])
def test_score_stopped_mid_stream_keeps_its_rows_and_the_same_call_finishes(tmp_path, error):
    prompts, target = prompts_file(tmp_path), tmp_path / "o.parquet"
    folder = tmp_path / "o.parts"
    with pytest.raises(type(error)) as stopped:
        probekit.score_file(Failing(8, error), prompts, target, "0-3", quiet=True)
    said = str(stopped.value) + "".join(getattr(stopped.value, "__notes__", []))
    assert f"the 8 of {PROMPTS} rows scored are kept in {folder}: run the same command" in said
    assert not target.exists() and any((folder / "parts").iterdir())
    again = Failing()
    probekit.score_file(again, prompts, target, "0-3", quiet=True)
    assert again.scored == PROMPTS - 8  # the kept rows are not scored again
    whole = probekit.score_file(Failing(), prompts, tmp_path / "whole.parquet", "0-3", quiet=True)
    pd.testing.assert_frame_equal(pd.read_parquet(target), pd.read_parquet(whole))
    assert pd.read_parquet(target)["id"].tolist() == [f"d{i}" for i in range(PROMPTS)]
    assert not folder.exists()


@pytest.mark.slow  # a Python process of its own, killed
def test_score_killed_mid_stream_keeps_its_rows_and_the_same_call_finishes(tmp_path):
    prompts, target = prompts_file(tmp_path), tmp_path / "o.parquet"
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import probekit; "
        "from test_keep_rows import Failing; "
        f"probekit.score_file(Failing(8, 'kill'), {str(prompts)!r}, {str(target)!r}, '0-3', "
        "quiet=True)"
    )
    assert subprocess.run([sys.executable, "-c", script]).returncode == -signal.SIGKILL
    again = Failing()
    probekit.score_file(again, prompts, target, "0-3", quiet=True)
    assert again.scored == PROMPTS - 8
    assert pd.read_parquet(target)["id"].tolist() == [f"d{i}" for i in range(PROMPTS)]


def test_score_refuses_to_go_on_from_rows_of_other_inputs(tmp_path, capsys, monkeypatch):
    prompts, target = prompts_file(tmp_path), tmp_path / "o.parquet"
    with pytest.raises(RuntimeError):
        probekit.score_file(Failing(8), prompts, target, "0-3", quiet=True)
    engine = Failing()
    with pytest.raises(ProbekitError, match=r"o.parts holds a run with a different probe.answers"):
        probekit.score_file(engine, prompts, target, "0-4", quiet=True)
    (tmp_path / "other").mkdir()
    other = prompts_file(tmp_path / "other", PROMPTS + 1)
    with pytest.raises(ProbekitError, match=r"o.parts holds a run with a different data_sha256"):
        probekit.score_file(engine, other, target, "0-3", quiet=True)
    monkeypatch.setattr("probekit.engines.load_engine", no_load)
    argv = ["score", "--prompts", prompts, "--scores", target, "--answers", "0-3"]
    assert cli.main([str(a) for a in argv]) == 2
    line = capsys.readouterr().err.strip()
    assert "holds a run with a different model" in line and "use another --scores" in line
    assert engine.scored == 0


def test_patch_keeps_its_rows_when_its_last_write_fails_and_finishes_from_them(
    tmp_path, monkeypatch, tiny
):
    out, study = tmp_path / "patch", minimal_study.MinimalStudy()
    options = dict(layers=[0], sites=["resid_pre"], bootstrap=20, out=out, days=2, quiet=True)
    fail_on(monkeypatch, out / "patching.parquet")
    with pytest.raises(ProbekitError) as refusal:
        probekit.patch_study(study, tiny, **options)
    kept = out / "patching" / "sweep"
    assert f"the measured rows are kept in {kept}: once that is fixed" in str(refusal.value)
    monkeypatch.undo()
    monkeypatch.setattr(probekit.mechanism.patching, "sweep", lambda *a, **k: pytest.fail("again"))
    result = probekit.patch_study(study, tiny, **options)
    assert len(result.table) and (out / "patching_summary.csv").is_file() and not kept.exists()


def test_patch_cut_short_measures_only_what_it_lacks_and_writes_the_same_table(
    tmp_path, monkeypatch, tiny
):
    study, plain = minimal_study.MinimalStudy(), probekit.mechanism.patching.sweep
    options = dict(layers=[0, 1], sites=["resid_pre"], bootstrap=20, days=3, quiet=True)
    options |= dict(batch_size=1, skip_direction=True)  # a chunk: one pair's two rows
    whole = probekit.patch_study(study, tiny, out=tmp_path / "whole", **options)
    measured: list[int] = []

    def sweep(*args, rows, **keywords):
        if len(measured) == 2 and fail:
            raise RuntimeError("device lost")
        measured.extend(rows)
        return plain(*args, rows=rows, **keywords)

    monkeypatch.setattr(probekit.mechanism.patching, "sweep", sweep)
    out, fail = tmp_path / "patch", True
    with pytest.raises(RuntimeError, match="device lost"):
        probekit.patch_study(study, tiny, out=out, **options)
    first = len(measured)
    assert 0 < first < len(whole.table)
    with pytest.raises(ProbekitError, match=r"holds a run with a different layers"):
        probekit.patch_study(study, tiny, out=out, **{**options, "layers": [1]})
    fail = False
    result = probekit.patch_study(study, tiny, out=out, **options)
    assert len(measured) - first == len(whole.table) - first  # only the rows it lacked
    assert sorted(measured) == list(range(len(whole.table)))
    pd.testing.assert_frame_equal(result.table, whole.table)
    assert not (out / "patching" / "sweep").exists()


def no_room(monkeypatch, tmp_path):
    """The disk of `tmp_path` has 10 bytes free."""
    usage = io.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(io.shutil, "disk_usage", lambda path: usage._replace(free=10))


def test_run_refuses_a_disk_without_room_for_its_scores(tmp_path, monkeypatch):
    no_room(monkeypatch, tmp_path)
    engine = CountingEngine()
    with silenced(), pytest.raises(ProbekitError, match=r"its disk has 0 MiB free, the work wr"):
        probekit.run_study(minimal_study.STUDY, engine, out=tmp_path / "run")
    assert engine.scored == 0


def test_capture_refuses_a_disk_without_room_for_its_shards(tmp_path, monkeypatch, tiny):
    no_room(monkeypatch, tmp_path)
    said = r"its disk has 0 MiB free, the work writes about .* \(the activation shards\)"
    with pytest.raises(ProbekitError, match=said):
        probekit.capture_study(minimal_study.MinimalStudy(), tiny, out=tmp_path / "c", days=2)
    assert not any((tmp_path / "c").glob("shards/*"))
