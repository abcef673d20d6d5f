"""The part store of a run folder: finished rows as checksummed Parquet parts, compacted level by
level as the run goes, and merged into `scores.parquet` once every prompt has a row (see
`probekit.run.loop` for why parts and how big).

A part's name comes from its prompt indices (the first and a digest of them all), so writing
the same rows again gives the same part (`write_part`, for workers that score batches of prompt
indices elsewhere). Every part, and the merged `scores.parquet`, records the settings its rows
were scored under (`probekit.core.rundir.RowKey`), and each row its prompt id.

On resume a part whose rows all sit in a higher-level part (a compaction cut short) is deleted;
a truncated or damaged part is renamed `*.damaged`; parts scored under other settings or for
other prompts (a manifest deleted and the folder run again with another `--dtype`) are renamed
`*.mismatched`: one line says so, and their prompts are redone. A `scores.parquet` that matches
the run is kept as it is (its parts may be gone); one that does not is set aside the same way.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from probekit.core.errors import ProbekitError
from probekit.core.io import atomic_write, write_table
from probekit.core.items import PROMPT_ID
from probekit.core.rundir import SCORED_UNDER, RowKey
from probekit.core.store import (
    INDEX,
    Damaged,
    Unusable,
    damage,
    read_rows,
    read_table,
    row_groups,
    set_aside,
    set_aside_all,
    take_rows,
    write_rows,
)

FANOUT = 16  # parts of one level that a process merges into one part a level up
PARTS = "parts"
SCORES = "scores.parquet"
REDONE = "its prompts will be scored again"
_PART_NAME = re.compile(r"^part-L(\d+)-\d+-[0-9a-f]+\.parquet$")


@dataclass(frozen=True)
class Part:
    """A finished part: its file, its compaction level and the prompt indices of its rows."""

    path: Path
    level: int
    indices: np.ndarray


def part_path(out: str | Path, indices: Iterable[int], level: int = 0) -> Path:
    """The file of the part holding exactly these prompt indices: the first and a digest of them
    all, so that the same rows always land in the same file."""
    ordered = np.sort(np.asarray(indices, dtype="<i8"))
    digest = hashlib.sha256(ordered.tobytes()).hexdigest()[:12]
    return Path(out) / PARTS / f"part-L{level}-{int(ordered[0]):010d}-{digest}.parquet"


def write_part(out: str | Path, frame: pd.DataFrame, key: RowKey, level: int = 0) -> Path:
    """Write the rows of `frame` (one per prompt index, column `prompt_index`) as a finished
    part of the run in `out` (`probekit.core.store.write_rows`), rows in prompt order, recording
    the settings of `key` (the run's) that they were scored under.

    Idempotent: the same prompt indices always give the same file, so a batch written twice
    (a retried worker) leaves one part and no duplicate rows. Workers that score batches of
    prompt indices outside the run loop call this; the loop's scan, compaction and merge take
    their parts like its own."""
    frame = frame.sort_values(INDEX, kind="stable")
    return write_rows(part_path(out, frame[INDEX], level), frame, key)


def part_files(out: Path) -> list[Path]:
    """The files named as `part_path` names them, in name order."""
    return sorted(p for p in (out / PARTS).glob("part-*.parquet") if _PART_NAME.match(p.name))


def scan_parts(out: str | Path, key: RowKey | None = None) -> list[Part]:
    """Every finished part of the run in `out`, each read once with its checksums verified
    (`probekit.core.store.read_rows`).

    A damaged part is set aside (one line), and so are parts whose settings or prompt ids are
    not those of `key` (one line for all of them); a part whose rows all sit in a part of a
    higher level (a compaction cut short) is deleted. Linear in the rows held."""
    out = Path(out)
    found, unusable = [], []
    for path in part_files(out):
        try:
            indices = read_rows(path, key, require=(INDEX,)).indices
        except FileNotFoundError:
            continue  # compacted away by the shard that wrote it: its rows are in a newer part
        except Unusable as why:
            unusable.append(why)
            continue
        level = int(path.name.split("-")[1].removeprefix("L"))  # part-L<level>-...
        found.append(Part(path, level, np.asarray(indices, dtype=np.int64)))
    set_aside_all(out / PARTS, unusable, REDONE)
    return _drop_superseded(found)


def finished_scores(out: str | Path, key: RowKey, merged: str = SCORES) -> Path | None:
    """The run's merged rows (`scores.parquet`, or the `merged` file) when they hold one row
    for each prompt of `key`, scored under its settings (then nothing needs scoring, whether or
    not its parts are still there); else None, with a file that does not match set aside
    (`*.mismatched` or `*.damaged`, one line), so that the folder never shows a finished run
    whose rows are not its own."""
    path = Path(out) / merged
    columns = [INDEX, PROMPT_ID]
    found = take_rows(path, key, "the run goes on from its parts", columns=columns, complete=True)
    return None if found is None else path


def _drop_superseded(parts: list[Part]) -> list[Part]:
    if not parts:
        return parts
    size = max(int(p.indices.max(initial=0)) for p in parts) + 1
    seen = np.zeros(size, dtype=bool)
    kept = []
    for part in sorted(parts, key=lambda p: (-p.level, p.path.name)):
        if len(part.indices) and seen[part.indices].all():
            part.path.unlink(missing_ok=True)
            continue
        seen[part.indices] = True
        kept.append(part)
    return sorted(kept, key=lambda p: p.path.name)


def done_mask(parts: list[Part], total: int) -> np.ndarray:
    """A boolean per prompt index: True where a finished part holds its row."""
    done = np.zeros(total, dtype=bool)
    for part in parts:
        done[part.indices[part.indices < total]] = True
    return done


class Compactor:
    """Merges a process's parts level by level: `FANOUT` parts of one level become one part a
    level up, rows streamed row group by row group (flat memory), sources deleted after."""

    def __init__(self, out: Path, parts: list[Part], key: RowKey) -> None:
        self.out = out
        self.key = key
        self.levels: dict[int, list[Part]] = defaultdict(list)
        for part in parts:
            self.levels[part.level].append(part)

    def write(self, frame: pd.DataFrame) -> None:
        """Write the rows of `frame` as a part (`write_part`) and take it; compact when due."""
        path = write_part(self.out, frame, self.key)
        level = 0
        self.levels[level].append(Part(path, level, frame[INDEX].to_numpy(dtype=np.int64)))
        while len(self.levels[level]) >= FANOUT:
            group = sorted(self.levels.pop(level), key=lambda p: int(p.indices.min()))
            merged = self._merge(group, level + 1)
            if merged is not None:
                self.levels[level + 1].append(merged)
            level += 1

    def _merge(self, group: list[Part], level: int) -> Part | None:
        """One part of `level` holding the rows of `group`; a damaged source is set aside and
        left out (its prompts are redone: the run looks for missing rows before it ends)."""
        while group:
            try:
                return self._write(group, level)
            except Damaged as damaged:
                set_aside(damaged, REDONE)
                group = [p for p in group if p.path != damaged.path]
        return None

    def _write(self, group: list[Part], level: int) -> Part:
        indices = np.concatenate([p.indices for p in group])
        target = part_path(self.out, indices, level)
        schemas = []
        for part in group:
            try:
                schemas.append(pq.read_schema(part.path))
            except (OSError, pa.ArrowException) as exc:
                raise damage(part.path, exc) from None
        schema = pa.unify_schemas(schemas, promote_options="permissive")
        schema = schema.with_metadata({**(schema.metadata or {}), **self.key.metadata()})

        def write(tmp: Path) -> None:
            with pq.ParquetWriter(tmp, schema, write_page_checksum=True) as writer:
                for part in group:
                    for table in row_groups(part.path):
                        writer.write_table(table.select(schema.names).cast(schema))

        atomic_write(target, write)
        for part in group:
            if part.path != target:
                part.path.unlink(missing_ok=True)
        return Part(target, level, indices)


# ---------------------------------------------------------------------- merge


def merge_if_complete(out: Path, total: int, merged: str = SCORES) -> Path | None:
    """Write `scores.parquet` (or the `merged` file; rows in prompt order) if every prompt has
    exactly one row.

    Every part is read with its checksums verified (a damaged one is set aside and None
    returned: its prompts are redone); a shard that is not last reads them all too (about half a
    second for a 3,456-row run). The parts were checked against the run when it (re)started
    (`scan_parts`), so they all record one run's settings, which `scores.parquet` records too;
    parts that record different settings are refused in one line."""
    out = Path(out)
    target = out / merged
    files = part_files(out)
    if not files:
        return target if target.is_file() else None
    tables = []
    for path in files:
        try:
            tables.append(read_table(path))
        except FileNotFoundError:
            return None
        except Damaged as damaged:
            set_aside(damaged, REDONE)
            return None
        if INDEX not in tables[-1].column_names:
            set_aside(Damaged(path, f"no {INDEX} column"), REDONE)
            return None
    records = {(t.schema.metadata or {}).get(SCORED_UNDER) for t in tables}
    if len(records) != 1:
        raise ProbekitError(
            f"the parts in {out / PARTS} were scored under different settings; run the same "
            "command again to set aside those that are not this run's"
        )
    plain = [t.replace_schema_metadata(tables[0].schema.metadata) for t in tables]
    table = pa.concat_tables(plain, promote_options="permissive").sort_by(INDEX)
    indices = table[INDEX].to_numpy()
    first = np.ones(len(indices), dtype=bool)
    first[1:] = indices[1:] != indices[:-1]  # one row per prompt (a part written twice)
    table = table.filter(pa.array(first))
    if table.num_rows != total:
        return None
    return write_table(target, table)  # the parts' record of their settings kept
