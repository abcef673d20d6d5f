"""Faults a long run meets: a kill at any moment, damaged state, a read-only or full disk, the
same shard started twice, two first loads of a GGUF, and bad input files and answer specs.
Each ends in a resumable state or one line (exit status 2) and nothing half-written."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import DATA_ROOT, REPO
from transformers import AutoTokenizer

from probekit import cli
from probekit.core.answers import MAX_ANSWERS, AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.io import write_parquet, write_text
from probekit.core.rundir import RowKey, RunDir
from probekit.core.store import DAMAGED, INDEX
from probekit.datasets.crowd_envent import SAMPLE_ROOT, load_crowd_envent
from probekit.run.loop import Shard, prepare_run_dir, run_probe
from probekit.run.parts import (
    FANOUT,
    Compactor,
    merge_if_complete,
    part_path,
    scan_parts,
    write_part,
)
from probekit.studies.intergroup import IntergroupProbe, get_category, get_setting
from probekit.studies.isear.evaluator import PUNKT_FILES

SCRIPT = REPO / "experiments" / "intergroup_gap.py"
SETTING = "P0S1T0"  # the 10-point scale: a small answer trie, seconds per chunk

# A run in a subprocess, to be killed: argv = out, events, chunk size ("auto": timed chunks).
RUNNER = f"""
import sys
from pathlib import Path
from probekit.datasets.crowd_envent import SAMPLE_ROOT, load_crowd_envent
from probekit.engines.hf.model import load_model
from probekit.run.loop import run_probe
from probekit.studies.intergroup import IntergroupProbe, get_category, get_setting
out, events, chunk = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
probe = IntergroupProbe(
    get_category("religion"), get_setting({SETTING!r}), load_crowd_envent(SAMPLE_ROOT).head(events)
)
manifest = {{"model": "default", "probe": probe.config(), "view": "exact", "epsilon": 1e-4}}
size = None if chunk == "auto" else int(chunk)
run_probe(probe, load_model("default"), out, manifest, chunk_size=size)
"""


def small_probe(n_events: int) -> IntergroupProbe:
    events = load_crowd_envent(SAMPLE_ROOT).head(n_events)
    return IntergroupProbe(get_category("religion"), get_setting(SETTING), events)


def manifest(probe: IntergroupProbe) -> dict:
    return {"model": "default", "probe": probe.config(), "view": "exact", "epsilon": 1e-4}


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def part_files(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("part-*.parquet")}


def indices_of(out: Path) -> set[int]:
    return {int(i) for part in scan_parts(out) for i in part.indices}


def assert_same_scores(a: pd.DataFrame, b: pd.DataFrame) -> None:
    keys = [INDEX, "prompt_id", "perceiver", "experiencer", "event_id", "greedy", "most_probable"]
    assert a[keys].equals(b[keys])
    # Prompts batched differently (a resumed chunk, timed chunks) share KV prefixes differently:
    # fp32 computation-path noise of ~1e-5 per probability, times the 0-10 scale in `expected`.
    probs = [c for c in a.columns if c.startswith("p::")] + ["valid_mass"]
    np.testing.assert_allclose(a[probs], b[probs], atol=1e-5)
    np.testing.assert_allclose(a["expected"], b["expected"], atol=1e-4)


# ---------------------------------------------------------------------- kills and resumes


@pytest.fixture(scope="module")
def reference(smol, tmp_path_factory) -> pd.DataFrame:
    """The uninterrupted run of the 72 prompts the killed runs score."""
    probe = small_probe(2)
    out = tmp_path_factory.mktemp("reference")
    return pd.read_parquet(run_probe(probe, smol, out, manifest(probe), chunk_size=8))


def start_run(out: Path, chunk: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(out), "2", chunk],
        cwd=REPO,
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def kill_when(proc: subprocess.Popen, ready) -> None:
    """SIGKILL `proc` as soon as `ready()` holds (polled every 20 ms)."""
    while not ready() and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def resume(out: Path, chunk: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RUNNER, str(out), "2", chunk],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
@pytest.mark.parametrize("chunk", ["8", "auto"])
def test_kill_after_the_first_part_redoes_nothing_written(tmp_path, reference, chunk):
    out = tmp_path / "run"
    proc = start_run(out, chunk)
    kill_when(proc, lambda: len(part_files(out)) >= 1)
    before = part_files(out)
    done = indices_of(out)
    assert 0 < len(done) < 72 and not (out / "scores.parquet").exists()
    resumed = resume(out, chunk)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{len(done)} of 72 prompts of this shard already done" in resumed.stderr
    after = part_files(out)
    assert all(after[name] == mtime for name, mtime in before.items()), "a written part redone"
    redone = [
        set(pq.read_table(out / "parts" / name, columns=[INDEX])[INDEX].to_pylist())
        for name in after.keys() - before.keys()
    ]
    assert all(not (rows & done) for rows in redone), "a prompt that had a row was scored again"
    scores = pd.read_parquet(out / "scores.parquet")
    assert list(scores[INDEX]) == list(range(72))  # every prompt exactly once
    assert_same_scores(scores, reference)


@pytest.mark.slow
def test_kill_before_any_part(tmp_path, reference):
    out = tmp_path / "run"
    proc = start_run(out, "8")
    kill_when(proc, lambda: (out / "manifest.json").is_file())
    assert not part_files(out)
    resumed = resume(out, "8")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "already done" not in resumed.stderr
    assert_same_scores(pd.read_parquet(out / "scores.parquet"), reference)


# ---------------------------------------------------------------------- damaged state


def test_truncated_part_is_set_aside_and_redone(tiny, tmp_path, capsys):
    probe = small_probe(1)
    out = tmp_path / "run"
    assert run_probe(probe, tiny, out, manifest(probe), shard=Shard(0, 2), chunk_size=6) is None
    victim = sorted((out / "parts").glob("part-*.parquet"))[1]
    lost = set(pq.read_table(victim, columns=[INDEX])[INDEX].to_pylist())
    victim.write_bytes(victim.read_bytes()[:200])
    capsys.readouterr()
    prepare_run_dir(out)  # before a model loads: the truncated part is set aside
    RunDir(out).release(0, 1)
    line = one_line(capsys.readouterr().err)
    assert str(victim) in line and "set aside" in line
    assert (victim.parent / (victim.name + DAMAGED)).is_file() and not victim.exists()
    done = indices_of(out)
    assert not (lost & done) and len(done) == 18 - len(lost)
    scores = pd.read_parquet(run_probe(probe, tiny, out, manifest(probe), chunk_size=6))
    assert list(scores[INDEX]) == list(range(36))
    assert f"{len(done)} of 36 prompts" in capsys.readouterr().err
    single = run_probe(probe, tiny, tmp_path / "single", manifest(probe), chunk_size=6)
    assert_same_scores(scores, pd.read_parquet(single))


def synthetic(indices, value: float = 0.5) -> pd.DataFrame:
    indices = list(indices)
    return pd.DataFrame(
        {INDEX: indices, "prompt_id": [f"p{i}" for i in indices], "x": [value] * len(indices)}
    )


def synthetic_key(total: int) -> RowKey:
    """The settings and prompt ids of a synthetic run of `total` prompts."""
    return RowKey.of({"model": "synthetic"}, [f"p{i}" for i in range(total)])


def test_a_flipped_byte_is_caught_by_the_page_checksums(tmp_path, capsys):
    path = write_part(tmp_path, synthetic(range(500)), synthetic_key(500))
    data = bytearray(path.read_bytes())
    data[len(data) // 4] ^= 0xFF  # inside the first column's data pages
    path.write_bytes(bytes(data))
    assert scan_parts(tmp_path) == []
    assert "is damaged" in one_line(capsys.readouterr().err)
    assert list((tmp_path / "parts").glob(f"*{DAMAGED}"))


def test_write_part_is_idempotent_and_a_cut_short_compaction_is_undone(tmp_path):
    key = synthetic_key(8)
    first = write_part(tmp_path, synthetic(range(0, 4)), key)
    assert write_part(tmp_path, synthetic(range(0, 4)), key) == first  # a retried batch: one part
    write_part(tmp_path, synthetic([7, 5, 6, 4]), key)
    # A compaction killed after writing its part and before deleting its sources:
    write_part(tmp_path, synthetic(range(8)), key, level=1)
    parts = scan_parts(tmp_path, key)
    assert [p.level for p in parts] == [1] and len(part_files(tmp_path)) == 1
    merged = pd.read_parquet(merge_if_complete(tmp_path, 8))
    assert list(merged[INDEX]) == list(range(8))


def test_compaction_keeps_every_row_once(tmp_path):
    key = synthetic_key(3 * FANOUT * FANOUT)
    compactor = Compactor(tmp_path, [], key)
    for k in range(FANOUT * FANOUT):
        rows = range(3 * k, 3 * k + 3)
        compactor.write(synthetic(rows, value=k))
    files = part_files(tmp_path)
    assert list(files) == [part_path(tmp_path, range(3 * FANOUT * FANOUT), level=2).name]
    assert len(scan_parts(tmp_path, key)) == 1  # the compacted part records the run's settings
    merged = pd.read_parquet(merge_if_complete(tmp_path, 3 * FANOUT * FANOUT))
    assert list(merged[INDEX]) == list(range(3 * FANOUT * FANOUT))
    assert list(merged["x"]) == [i // 3 for i in range(3 * FANOUT * FANOUT)]


@pytest.mark.slow
def test_corrupt_manifest_is_one_line_naming_it(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "manifest.json").write_text('{"model": "default", "probe": {')
    with pytest.raises(ProbekitError) as info:
        prepare_run_dir(out)
    message = str(info.value)
    assert str(out / "manifest.json") in message and "\n" not in message
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--setting", SETTING, "--events", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "manifest.json" in one_line(result.stderr)


# ---------------------------------------------------------------------- read-only and full disks


@contextmanager
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder that not even root can write: a read-only bind mount, else `chattr +i`."""
    target = tmp_path / "ro"
    target.mkdir()
    (target / "existing.txt").write_text("x")
    if os.geteuid() == 0 and shutil.which("mount"):
        mounted = subprocess.run(["mount", "--bind", str(target), str(target)]).returncode == 0
        if mounted:
            try:
                cmd = ["mount", "-o", "remount,bind,ro", str(target)]
                if subprocess.run(cmd).returncode == 0:
                    yield target
                    return
            finally:
                subprocess.run(["umount", str(target)])
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(target)]).returncode == 0:
        try:
            yield target
        finally:
            subprocess.run(["chattr", "-i", str(target)])
        return
    pytest.skip("neither a read-only bind mount nor chattr +i is possible here (root writes)")


@pytest.mark.slow
def test_read_only_out_is_one_line(tmp_path, capsys):
    with read_only_dir(tmp_path) as ro:
        with pytest.raises(ProbekitError, match="not writable") as info:
            write_text(ro / "summary.md", "text")
        assert "\n" not in str(info.value)
        with pytest.raises(ProbekitError, match="not writable"):
            prepare_run_dir(ro / "run")
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text('{"id": "a", "text": "Hello"}\n')
        args = ["--prompts", str(prompts), "--answers", "0-10", "--scores", str(ro / "o.parquet")]
        code = cli.main(["score", *args])
        assert code == 2 and str(ro) in one_line(capsys.readouterr().err)
        assert sorted(p.name for p in ro.iterdir()) == ["existing.txt"]


@contextmanager
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "tiny"
    target.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(target)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)])


@pytest.mark.slow
def test_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    frame = pd.DataFrame({"x": np.random.default_rng(0).random(100_000)})
    with tiny_disk(tmp_path) as disk:
        with pytest.raises(ProbekitError, match="disk is full") as info:
            write_parquet(disk / "scores.parquet", frame)
        assert "\n" not in str(info.value)
        with pytest.raises(ProbekitError, match="disk is full"):
            rows = frame.assign(**{INDEX: range(len(frame)), "prompt_id": "p"})
            write_part(disk / "run", rows, synthetic_key(len(frame)))
        assert not [p for p in disk.rglob("*") if p.is_file()]


def test_full_disk_during_a_run(tiny, tmp_path, monkeypatch):
    """ENOSPC while a part is written (as a full disk raises it): one line, no temporary file."""
    import probekit.core.io

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(probekit.core.io.pq, "write_table", full)
    probe = small_probe(1)
    out = tmp_path / "run"
    with pytest.raises(ProbekitError, match="disk is full") as info:
        run_probe(probe, tiny, out, manifest(probe), chunk_size=4)
    assert "\n" not in str(info.value) and str(out / "parts") in str(info.value)
    assert not list((out / "parts").iterdir())


# ---------------------------------------------------------------------- locks


HOLDER = """
import sys, time
from pathlib import Path
from probekit.core.rundir import RunDir
RunDir(Path(sys.argv[1])).hold(0, 2)
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_the_same_shard_twice_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ProbekitError) as info:
            prepare_run_dir(out, Shard(0, 2))
        message = str(info.value)
        assert f"PID {holder.pid} on host {socket.gethostname()}" in message
        assert "shard 0/2" in message and "\n" not in message
        prepare_run_dir(out, Shard(1, 2))  # another shard cooperates
        RunDir(out).release(1, 2)
    finally:
        holder.kill()
        holder.wait()
    prepare_run_dir(out, Shard(0, 2))  # the holder died: its lock is stale and taken over
    RunDir(out).release(0, 2)
    assert not list(out.glob(".lock-shard-*"))  # released by its holder: the file is gone


def test_a_lock_from_another_host_is_honoured(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock-shard-0-of-1").write_text("4242 some-other-host\n")
    with pytest.raises(ProbekitError, match="PID 4242 on host some-other-host"):
        prepare_run_dir(out)


LOAD = (
    "import sys; from probekit.engines.hf.model import load_model; "
    "print('source', load_model(sys.argv[1]).source)"
)


@pytest.mark.slow
def test_two_first_loads_of_a_gguf_share_one_conversion(tmp_path):
    """Two processes load two copies of the default GGUF at different paths (two venvs) at once:
    one conversion, one folder, used by both."""
    from probekit.engines.hf.gguf import default_gguf_path

    copies = [tmp_path / "venv-a" / "model.gguf", tmp_path / "venv-b" / "other-name.gguf"]
    for copy in copies:
        copy.parent.mkdir()
        shutil.copy(default_gguf_path(), copy)
    env = {**os.environ, "PROBEKIT_CACHE": str(tmp_path / "cache")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD, str(copy)],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for copy in copies
    ]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    (converted,) = [p for p in (tmp_path / "cache" / "models").iterdir() if p.is_dir()]
    assert (converted / "probekit.json").is_file()
    assert [o.split()[-1] for o in outputs] == [str(converted)] * 2


@pytest.mark.slow
@pytest.mark.default_model
def test_the_kept_tokenizer_is_read_again_from_the_gguf_when_damaged(tmp_path, monkeypatch):
    """The test tokenizer's metadata, kept in the user cache after the first read: a later read
    gives the same tokenizer, and a damaged copy is read again from the GGUF and kept anew."""
    from probekit.testing.synthetic import _default_files

    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path))
    first = _default_files.__wrapped__()[0]
    (kept,) = (tmp_path / "metadata").iterdir()
    (kept / "tokenizer.json").write_text("{ not json", encoding="utf-8")
    again = _default_files.__wrapped__()[0]
    text = "<|im_start|>user\nOn a scale of 0 to 100, 73?<|im_end|>"
    assert again(text).input_ids == first(text).input_ids and len(again) == len(first)
    assert again.padding_side == "left" and again.chat_template == first.chat_template
    assert [p.name for p in (tmp_path / "metadata").iterdir()] == [kept.name]
    assert AutoTokenizer.from_pretrained(kept).get_vocab() == first.get_vocab()


# ---------------------------------------------------------------------- bad input


def score(args: list[str], capsys) -> tuple[int, str]:
    code = cli.main(["score", *args])
    return code, capsys.readouterr().err


def test_prompts_that_are_not_utf8_name_the_line(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    out = tmp_path / "o.parquet"
    code, err = score(
        ["--prompts", str(prompts), "--answers", "0-10", "--scores", str(out)], capsys
    )
    assert code == 2 and f"{prompts}:2: not UTF-8" in one_line(err)
    assert not out.exists()


def test_answers_file_that_is_not_utf8_names_the_line(tmp_path):
    answers = tmp_path / "answers.txt"
    answers.write_bytes(b"yes\nno\nmaybe\xff\n")
    with pytest.raises(ProbekitError, match=f"{answers}:3: not UTF-8"):
        AnswerSet.parse(f"@{answers}")


@pytest.mark.parametrize(
    ("spec", "answers"),
    [("A-E", "ABCDE"), ("a-c", "abc"), ("1-3", "123"), ("A,B", "AB"), (" B - D ", "BCD")],
)
def test_letter_and_number_ranges(spec, answers):
    assert AnswerSet.parse(spec).answers == tuple(answers)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("A-A", "gives one answer"),
        ("Yes-No", "gives one answer"),
        ("yes", "gives one answer"),
        ("0-1000000", f"at most {MAX_ANSWERS}"),
        ("a-E", "mixes cases"),
        ("E-A", "write it as A-E"),
        ("A-E,F", "reads as a range"),
    ],
)
def test_answer_specs_that_could_be_misread_are_refused(spec, message):
    with pytest.raises(ProbekitError, match=message) as info:
        AnswerSet.parse(spec)
    assert "\n" not in str(info.value)


def test_a_huge_answer_range_is_refused_before_any_work(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "text": "Hello"}\n')
    out = tmp_path / "o.parquet"
    args = ["--prompts", str(prompts), "--answers", "0-1000000", "--scores", str(out)]
    code, err = score(args, capsys)
    assert code == 2 and "at most 1000" in one_line(err) and not out.exists()


def test_a_folder_that_is_not_a_model(tmp_path, capsys):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "notes.txt").write_text("weights went elsewhere")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "text": "Hello"}\n')
    args = ["--model", str(folder), "--prompts", str(prompts), "--answers", "0-10"]
    code, err = score([*args, "--scores", str(tmp_path / "o.parquet")], capsys)
    assert code == 2 and "is not a model folder" in one_line(err)


@pytest.mark.default_model
def test_a_truncated_gguf(tmp_path, capsys, monkeypatch):
    from probekit.engines.hf.gguf import default_gguf_path

    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path / "cache"))
    data = default_gguf_path().read_bytes()
    gguf = tmp_path / "cut.gguf"
    gguf.write_bytes(data[: len(data) // 3])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "text": "Hello"}\n')
    args = ["--model", str(gguf), "--prompts", str(prompts), "--answers", "0-10"]
    code, err = score([*args, "--scores", str(tmp_path / "o.parquet")], capsys)
    assert code == 2 and "truncated, damaged or not a GGUF model" in one_line(err)
    assert not list((tmp_path / "cache" / "models").glob("cut-*"))


@pytest.mark.slow
def test_an_unreachable_hub_id_is_one_line_without_retries(tmp_path):
    """An id that cannot exist: offline it fails at once (not after a minute of retries), online
    the Hub says it does not exist; either way one line."""
    name = "probekit-tests/no-such-model-7f3c"
    result = subprocess.run(
        [sys.executable, "-m", "probekit.cli", "setup", "--model", name],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "HF_HOME": str(tmp_path / "hf")},
    )
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert f"could not load model '{name}'" in line and "Retry" not in result.stderr


# ---------------------------------------------------------------------- pinned downloads


@pytest.mark.reference_data(*(f"nltk/{rel}" for rel in PUNKT_FILES))
def test_a_punkt_download_is_used_only_if_it_is_the_pinned_one(tmp_path, monkeypatch):
    import nltk

    from probekit.studies.isear.evaluator import locate_punkt

    shared = DATA_ROOT / "nltk"
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nowhere")])
    monkeypatch.delenv("PROBEKIT_DATA", raising=False)
    monkeypatch.delenv("NLTK_DATA", raising=False)
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path / "cache"))

    def tampered(folder: Path) -> None:
        for rel in PUNKT_FILES:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes((shared / rel).read_bytes() + b"x")

    with pytest.raises(ProbekitError, match="differ from the pinned ones"):
        locate_punkt(download=tampered)
    assert not (tmp_path / "cache" / "nltk").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # no staging folder left

    def pinned(folder: Path) -> None:
        shutil.copytree(shared / "tokenizers", folder / "tokenizers")

    tables = locate_punkt(download=pinned)
    assert tables.pinned and tables.root == tmp_path / "cache" / "nltk"
    again = locate_punkt(download=tampered)  # found in the cache: no second download
    assert again.root == tables.root
