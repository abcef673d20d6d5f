"""One store of finished work (`probekit.core.store`), tried adversarially on every kind of it: a
run's parts and its `scores.parquet`, a steering run's α folder, a capture's index part and
shard, JaEm-ST's responses. Each is written and read back by its own code, which goes through
the store: a truncated file, a flipped byte, rows of other settings or other prompts are set
aside with one line and their work redone; a temporary left by a killed writer is never read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from safetensors.torch import save_file

from probekit.core.io import temporary_name
from probekit.core.items import PROMPT_ID, Item
from probekit.core.rundir import RowKey
from probekit.core.store import INDEX, Damaged, Mismatched, read_rows, write_rows

IDS = [f"p{i}" for i in range(6)]
MANIFEST = {"model": "m", "dtype": "float32", "probe": {"events": 3}}


def rows(ids: list[str]) -> pd.DataFrame:
    return pd.DataFrame(
        {INDEX: range(len(ids)), PROMPT_ID: ids, "p::0": np.linspace(0, 1, len(ids))}
    )


@dataclass(frozen=True)
class Kind:
    """A kind of finished work: `write(folder, manifest, ids)` writes it as its code does and
    returns the file; `take(folder, manifest, ids)` reads it back as its code does and returns
    the prompt ids it takes as done."""

    name: str
    write: Callable[[Path, dict, list[str]], Path]
    take: Callable[[Path, dict, list[str]], set[str]]
    per_prompt: bool = True  # False: rows of any prompts are taken (a capture folder grows)


def _run_part(folder: Path, manifest: dict, ids: list[str]) -> Path:
    from probekit.run.parts import write_part

    return write_part(folder, rows(ids), RowKey.of(manifest, ids))


def _run_parts_taken(folder: Path, manifest: dict, ids: list[str]) -> set[str]:
    from probekit.run.parts import scan_parts

    done = [int(i) for part in scan_parts(folder, RowKey.of(manifest, ids)) for i in part.indices]
    return {ids[i] for i in done}


def _scores(folder: Path, manifest: dict, ids: list[str]) -> Path:
    from probekit.run.parts import merge_if_complete

    _run_part(folder, manifest, ids)
    merged = merge_if_complete(folder, len(ids))
    for part in (folder / "parts").iterdir():
        part.unlink()  # a finished run whose parts are gone: its scores stand alone
    return merged


def _scores_taken(folder: Path, manifest: dict, ids: list[str]) -> set[str]:
    from probekit.run.parts import finished_scores

    return set(ids) if finished_scores(folder, RowKey.of(manifest, ids)) else set()


def _alpha(folder: Path, manifest: dict, ids: list[str]) -> Path:
    from probekit.run.steer import ROWS

    frame = rows(ids).assign(alpha=4.0)  # an α's rows, merged by the run loop
    return write_rows(
        folder / "alphas" / "resid_pre-L1-steer-a4" / ROWS, frame, RowKey.of(manifest, ids)
    )


def _alpha_taken(folder: Path, manifest: dict, ids: list[str]) -> set[str]:
    from probekit.run.parts import finished_scores
    from probekit.run.steer import ROWS

    step = folder / "alphas" / "resid_pre-L1-steer-a4"
    return set(ids) if finished_scores(step, RowKey.of(manifest, ids), ROWS) else set()


def _capture(folder: Path, manifest: dict, ids: list[str]) -> Path:
    import torch

    shard = folder / "shards" / "shard-00000.safetensors"
    shard.parent.mkdir(parents=True, exist_ok=True)
    save_file({"blocks.1.hook_resid_pre": torch.arange(12.0).reshape(6, 2)}, shard)
    index = rows(ids).drop(columns=INDEX).assign(shard="shards/shard-00000.safetensors")
    key = RowKey.of(manifest, None, "captured")
    return write_rows(folder / "index" / "shard-00000.parquet", index, key, commits=shard)


def _capture_taken(folder: Path, manifest: dict, ids: list[str]) -> set[str]:
    from probekit.mechanism.capture import scan_capture

    return scan_capture(folder, manifest)


def _items(ids: list[str]) -> list[Item]:
    return [Item(i, key={"sample": n}, unit=str(n), text="Carl:") for n, i in enumerate(ids)]


def _responses(folder: Path, manifest: dict, ids: list[str]) -> Path:
    frame = pd.DataFrame({"sample": range(len(ids)), PROMPT_ID: ids, "response": ["Fine."] * 6})
    key = RowKey.of({**manifest, "response_tokens": 8}, ids, "generated")
    return write_rows(folder / "responses.parquet", frame, key)


def _responses_taken(folder: Path, manifest: dict, ids: list[str]) -> set[str]:
    from probekit.studies.jaem_st.responses import _resume

    key = RowKey.of({**manifest, "response_tokens": 8}, ids, "generated")
    samples = pd.DataFrame({"sample": range(len(ids))})
    frame = _resume(folder / "responses.parquet", samples, _items(ids), key, 8)
    return set(frame.loc[frame["response"].notna(), PROMPT_ID])


KINDS = [
    Kind("run part", _run_part, _run_parts_taken),
    Kind("scores.parquet", _scores, _scores_taken),
    Kind("steering α", _alpha, _alpha_taken),
    Kind("capture shard", _capture, _capture_taken, per_prompt=False),
    Kind("JaEm-ST responses", _responses, _responses_taken),
]
by_name = pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])


def set_aside_line(capsys, suffix: str) -> str:
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "set aside" in line]
    assert f"{suffix}" in line
    return line


@by_name
def test_finished_work_is_taken_back_whole(kind, tmp_path):
    kind.write(tmp_path, MANIFEST, IDS)
    assert kind.take(tmp_path, MANIFEST, IDS) == set(IDS)


@by_name
def test_a_truncated_file_is_set_aside_and_redone(kind, tmp_path, capsys):
    path = kind.write(tmp_path, MANIFEST, IDS)
    path.write_bytes(path.read_bytes()[:-40])
    assert kind.take(tmp_path, MANIFEST, IDS) == set()
    line = set_aside_line(capsys, ".damaged")
    assert f"{path} is damaged (" in line
    assert path.with_name(path.name + ".damaged").is_file() and not path.exists()


@by_name
def test_a_flipped_byte_is_caught_by_the_page_checksums(kind, tmp_path, capsys):
    path = kind.write(tmp_path, MANIFEST, IDS)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    last = chunk.data_page_offset + chunk.total_compressed_size - 1  # a data page's last byte
    if chunk.dictionary_page_offset:
        last = chunk.dictionary_page_offset + chunk.total_compressed_size - 1
    data = bytearray(path.read_bytes())
    data[last] ^= 0x01
    path.write_bytes(bytes(data))
    assert kind.take(tmp_path, MANIFEST, IDS) == set()
    line = set_aside_line(capsys, ".damaged")
    assert "is damaged (" in line and "checksum" in line


@by_name
def test_rows_of_other_settings_are_set_aside_and_redone(kind, tmp_path, capsys):
    path = kind.write(tmp_path, MANIFEST, IDS)
    now = {**MANIFEST, "dtype": "bfloat16"}
    assert kind.take(tmp_path, now, IDS) == set()
    line = set_aside_line(capsys, ".mismatched")
    assert "under another dtype ('float32', now 'bfloat16')" in line
    assert path.with_name(path.name + ".mismatched").is_file()
    assert kind.take(tmp_path, now, IDS) == set()  # set aside once, not read again


@by_name
def test_rows_of_other_prompts_are_not_taken(kind, tmp_path, capsys):
    kind.write(tmp_path, MANIFEST, IDS)
    other = [*IDS[:3], "q3", "q4", "q5"]
    taken = kind.take(tmp_path, MANIFEST, other)
    if not kind.per_prompt:
        assert taken == set(IDS)  # a capture takes the prompts it holds, whichever they are
        return
    assert taken == set()
    assert "of other prompts" in set_aside_line(capsys, ".mismatched")


@by_name
def test_a_killed_writers_temporary_is_never_read(kind, tmp_path):
    """A process killed while writing leaves a hidden temporary beside the file, never the file
    half written: the finished file is taken, the temporary ignored."""
    path = kind.write(tmp_path, MANIFEST, IDS)
    half = temporary_name(path)
    half.write_bytes(path.read_bytes()[:100])
    assert kind.take(tmp_path, MANIFEST, IDS) == set(IDS)
    assert half.is_file()  # not taken for a part, not set aside


@by_name
def test_a_second_write_of_the_same_work_leaves_one_file(kind, tmp_path):
    first = kind.write(tmp_path, MANIFEST, IDS)
    second = kind.write(tmp_path, MANIFEST, IDS)
    assert first == second and kind.take(tmp_path, MANIFEST, IDS) == set(IDS)


def test_the_store_reads_rows_by_index_or_by_id_and_checks_completeness(tmp_path):
    key = RowKey.of(MANIFEST, IDS)
    indexed = write_rows(
        tmp_path / "a.parquet", rows(IDS[::-1]).assign(**{INDEX: range(5, -1, -1)}), key
    )
    assert read_rows(indexed, key).indices.tolist() == [5, 4, 3, 2, 1, 0]
    by_id = write_rows(tmp_path / "b.parquet", rows(IDS[2:4]).drop(columns=INDEX), key)
    found = read_rows(by_id, key, keep=True)
    assert found.indices.tolist() == [2, 3] and found.table.num_rows == 2
    with pytest.raises(Mismatched, match="not one for each of the 6 prompts"):
        read_rows(by_id, key, complete=True)
    with pytest.raises(Damaged, match="no prompt_index column"):
        read_rows(by_id, key, require=(INDEX,))
    with pytest.raises(Mismatched, match="without prompt ids"):
        read_rows(write_rows(tmp_path / "c.parquet", rows(IDS).drop(columns=PROMPT_ID), key), key)
    pd.read_parquet(indexed).to_parquet(tmp_path / "d.parquet")  # no record of its settings
    with pytest.raises(Mismatched, match="settings they do not record"):
        read_rows(tmp_path / "d.parquet", key)
    assert read_rows(tmp_path / "d.parquet", None).ids == IDS[::-1]  # no key: the file only
    with pytest.raises(FileNotFoundError):
        read_rows(tmp_path / "missing.parquet", key)


def test_every_kind_of_finished_work_uses_the_store():
    """No reader of finished work of its own: the modules that write and read finished rows
    do it through `probekit.core.store` (no Parquet reads with checksums, SHA-256 or
    set-aside suffixes of their own)."""
    import probekit

    root = Path(probekit.__file__).parent
    readers = ("run/parts", "run/steer", "mechanism/capture", "studies/jaem_st/responses")
    own = ("page_checksum_verification", "def _sha256", '".damaged"', '".mismatched"')
    for name in readers:
        text = (root / f"{name}.py").read_text()
        assert "probekit.core.store import" in text, name
        assert not [word for word in own if word in text], name
