"""Every place a command writes is checked before any work, and a final write that fails keeps
what was computed: a folder where a file is written, a file where a folder is written, a path
under a file, each refused in one line naming the path before a model loads or a prompt is
scored (the command line and the Python functions); a failed last write names where the rows
are kept and how to finish. (The tests run as root, so unwritable folders are made by kind.)"""

from __future__ import annotations

import errno
import json

import minimal_study
import pandas as pd
import pytest
from test_run_state import CountingEngine

import probekit
import probekit.run.parts
from probekit import cli
from probekit.core import io
from probekit.core.errors import ProbekitError
from probekit.core.progress import silenced

STUDY = minimal_study.STUDY.name
WRONG_KIND = {  # command: (a name it writes in its folder, made as the other kind)
    "run": "scores.parquet/",
    "patch": "patching.parquet/",
    "capture": "shards",
    "steer": "steer.parquet/",
    "lens": "parts",
}


def no_load(*args, **kwargs):
    raise AssertionError("a model was loaded before the output path was checked")


@pytest.fixture(autouse=True)
def no_model(monkeypatch, minimal):
    """No model loads, and the minimal study is registered (the command line's)."""
    monkeypatch.setattr("probekit.engines.load_engine", no_load)


def made(folder, name):
    """`folder` with `name` in it: a folder when it ends in "/", else a file."""
    path = folder / name.rstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    path.mkdir() if name.endswith("/") else path.write_text("x")
    return path


def refused(argv, capsys):
    """The one line the command line refuses `argv` with."""
    assert cli.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("command", sorted(WRONG_KIND))
def test_a_study_command_refuses_a_wrong_kind_in_its_folder_before_any_model(
    command, tmp_path, capsys
):
    path = made(tmp_path / "out", WRONG_KIND[command])
    line = refused([command, STUDY, "--out", tmp_path / "out"], capsys)
    kind = "folder where a file" if path.is_dir() else "file where a folder"
    assert f"{path} is a {kind} is written" in line


@pytest.mark.parametrize("command", sorted(WRONG_KIND))
def test_a_study_command_refuses_a_folder_under_a_file(command, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    line = refused([command, STUDY, "--out", tmp_path / "file" / "out"], capsys)
    assert f"{tmp_path / 'file'} is a file, not a folder" in line


@pytest.mark.parametrize("command", sorted(WRONG_KIND))
def test_a_study_function_refuses_the_same_before_the_engine_scores(command, tmp_path):
    engine = CountingEngine()
    path = made(tmp_path / "out", WRONG_KIND[command])
    function = getattr(probekit, "run_study" if command == "run" else f"{command}_study")
    with pytest.raises(ProbekitError, match=f"{path} is a (folder|file) where"):
        function(minimal_study.STUDY, engine, out=tmp_path / "out")
    assert engine.scored == 0


def test_score_refuses_a_folder_as_its_file_before_any_work(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "Day?"}\n')
    (tmp_path / "DIR").mkdir()
    argv = ["score", "--prompts", prompts, "--answers", "0-3", "--scores", tmp_path / "DIR"]
    assert f"--scores {tmp_path / 'DIR'} is a folder" in refused(argv, capsys)
    (tmp_path / "file").write_text("x")
    argv[-1] = tmp_path / "file" / "o.parquet"
    assert f"--scores {tmp_path / 'file'} is a file, not a folder" in refused(argv, capsys)
    engine = CountingEngine()
    with pytest.raises(ProbekitError, match=r"^scores .*DIR is a folder"):
        probekit.score_file(engine, prompts, tmp_path / "DIR", "0-3")
    with pytest.raises(ProbekitError, match=r"^scores .*file is a file, not a folder"):
        probekit.score_file(engine, prompts, tmp_path / "file" / "o.parquet", "0-3")
    assert engine.scored == 0


def test_report_refuses_a_folder_where_its_page_goes(tmp_path, capsys):
    with silenced():
        probekit.run_study(minimal_study.STUDY, CountingEngine(), out=tmp_path / "run")
    page = made(tmp_path / "out", "report.html/")
    line = refused(["report", tmp_path / "run", "--out", tmp_path / "out"], capsys)
    assert f"{page} is a folder where a file is written" in line
    with pytest.raises(ProbekitError, match="report.html is a folder where a file"):
        probekit.report(tmp_path / "run", tmp_path / "out")


def fail_on(monkeypatch, target):
    """`os.replace` in `probekit.core.io` fails (an I/O error) for `target` only."""
    real = io.os.replace

    def replace(source, destination):
        if str(destination) == str(target):
            raise OSError(errno.EIO, "Input/output error")
        return real(source, destination)

    monkeypatch.setattr(io.os, "replace", replace)


def test_a_scores_file_that_cannot_be_renamed_into_place_keeps_its_rows(tmp_path, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    lines = [json.dumps({"id": f"d{i}", "text": "Day?"}) + "\n" for i in range(9)]
    prompts.write_text("".join(lines))
    target = tmp_path / "o.parquet"
    fail_on(monkeypatch, target)
    with pytest.raises(ProbekitError) as refusal:
        probekit.score_file(CountingEngine(), prompts, target, "0-3", quiet=True)
    kept = tmp_path / "o.partial.parquet"
    assert f"cannot write {target}" in str(refusal.value)
    assert f"the rows are kept in {kept}: move it to {target}" in str(refusal.value)
    assert pd.read_parquet(kept)["id"].tolist() == [f"d{i}" for i in range(9)]


class Resumable(CountingEngine):
    """A counting engine that a run given it resumes: one that says it is the engine the call
    names (a given engine's own name is not yet compared with the folder's before it loads)."""

    def describe(self):
        return {**super().describe(), "engine": "hf"}


def test_a_run_whose_last_write_fails_keeps_its_parts_and_the_same_call_finishes(
    tmp_path, monkeypatch
):
    out, engine = tmp_path / "run", Resumable()

    def fail(path, table):
        return io.atomic_write(path, lambda tmp: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))

    monkeypatch.setattr(probekit.run.parts, "write_table", fail)
    with silenced(), pytest.raises(ProbekitError) as refusal:
        probekit.run_study(minimal_study.STUDY, engine, out=out)
    assert f"cannot write {out / 'scores.parquet'}" in str(refusal.value)
    assert f"what was finished is kept in {out}: once that is fixed" in str(refusal.value)
    scored = engine.scored
    assert scored and not (out / "scores.parquet").exists() and any((out / "parts").iterdir())
    monkeypatch.undo()
    monkeypatch.setattr("probekit.engines.load_engine", no_load)
    with silenced():
        probekit.run_study(minimal_study.STUDY, engine, out=out)
    assert engine.scored == scored  # nothing scored again
    assert len(pd.read_parquet(out / "scores.parquet")) == scored


def test_score_refuses_a_disk_without_room_for_its_rows(tmp_path, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "Day?"}\n')
    usage = io.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(io.shutil, "disk_usage", lambda path: usage._replace(free=10))
    engine = CountingEngine()
    with pytest.raises(ProbekitError, match=r"^scores .*: its disk has 0 MiB free, the work"):
        probekit.score_file(engine, prompts, tmp_path / "o.parquet", "0-3")
    assert engine.scored == 0 and not (tmp_path / "o.parquet").exists()
