"""The part store of a run folder: finished rows as checksummed Parquet parts, compacted level by
level as the run goes, and merged into `scores.parquet` once every prompt has a row (see
`probekit.run.loop` for why parts and how big).

A part's name comes from its prompt indices (the first and a digest of them all), so writing
the same rows again gives the same part (`write_part`, for workers that score batches of prompt
indices elsewhere). A part whose rows all sit in a higher-level part (a compaction cut short) is
deleted on resume; a truncated or damaged part is renamed `*.damaged`, one line says so, and
its prompts are redone.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from probekit.core.errors import ProbekitError
from probekit.core.io import atomic_write, read_verified, write_table

INDEX = "prompt_index"
FANOUT = 16  # parts of one level that a process merges into one part a level up
PARTS = "parts"
DAMAGED = ".damaged"
_PART_NAME = re.compile(r"^part-L(\d+)-\d+-[0-9a-f]+\.parquet$")


def say(message: str) -> None:
    """A line about the run's state (resumed, part set aside) on stderr, beside the progress."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Part:
    """A finished part: its file, its compaction level and the prompt indices of its rows."""

    path: Path
    level: int
    indices: np.ndarray


def part_path(out: str | Path, indices: Iterable[int], level: int = 0) -> Path:
    """The file of the part holding exactly these prompt indices: the first and a digest of them
    all, so that the same rows always land in the same file."""
    ordered = np.sort(
        np.asarray(list(indices) if not isinstance(indices, np.ndarray) else indices, dtype="<i8")
    )
    digest = hashlib.sha256(ordered.tobytes()).hexdigest()[:12]
    return Path(out) / PARTS / f"part-L{level}-{int(ordered[0]):010d}-{digest}.parquet"


def write_part(out: str | Path, frame: pd.DataFrame, level: int = 0) -> Path:
    """Write the rows of `frame` (one per prompt index, column `prompt_index`) as a finished
    part of the run in `out`, atomically, rows in prompt order.

    Idempotent: the same prompt indices always give the same file, so a batch written twice
    (a retried worker) leaves one part and no duplicate rows. Workers that score batches of
    prompt indices outside the run loop call this; the loop's scan, compaction and merge take
    their parts like its own."""
    if frame.empty:
        raise ProbekitError("a part needs at least one row")
    indices = frame[INDEX].to_numpy(dtype=np.int64)
    if len(np.unique(indices)) != len(indices):
        raise ProbekitError("a part holds each prompt index once; this batch repeats some")
    frame = frame.sort_values(INDEX, kind="stable")
    path = part_path(out, indices, level)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_table(path, pa.Table.from_pandas(frame, preserve_index=False))


def _level(path: Path) -> int:
    found = _PART_NAME.match(path.name)
    return int(found.group(1)) if found else 0  # parts of older probekit versions: level 0


def part_files(out: Path) -> list[Path]:
    return sorted((out / PARTS).glob("part-*.parquet"))


class DamagedPart(Exception):
    """A part that cannot be read back whole (truncated, a checksum that does not match)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _read_part(path: Path, columns: list[str] | None = None) -> pa.Table:
    """A part read with its page checksums verified; DamagedPart if it cannot be."""
    try:
        table = read_verified(path, columns)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise DamagedPart(path, str(exc).splitlines()[0]) from None
    if INDEX not in table.column_names:
        raise DamagedPart(path, f"no {INDEX} column")
    return table


def _part_indices(path: Path) -> np.ndarray:
    """The prompt indices of a part, read row group by row group so that every page is
    verified with flat memory; DamagedPart if it cannot be read."""
    try:
        source = pq.ParquetFile(path, page_checksum_verification=True)
        groups = [source.read_row_group(k) for k in range(source.num_row_groups)]
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise DamagedPart(path, str(exc).splitlines()[0]) from None
    if groups and INDEX not in groups[0].column_names:
        raise DamagedPart(path, f"no {INDEX} column")
    return np.concatenate([g.column(INDEX).to_numpy() for g in groups] or [np.zeros(0, np.int64)])


def set_aside(damage: DamagedPart) -> Path:
    """Rename a damaged part `*.damaged` (kept for inspection, no longer read) and say so."""
    target = damage.path.with_name(damage.path.name + DAMAGED)
    try:
        damage.path.replace(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise ProbekitError(
            f"{damage.path} is damaged ({damage.reason}) and cannot be renamed ({exc.strerror}); "
            "delete it and run the same command again to redo its prompts"
        ) from None
    say(
        f"{damage.path} is damaged ({damage.reason}); set aside as {target.name}, its prompts "
        "will be scored again"
    )
    return target


def scan_parts(out: str | Path) -> list[Part]:
    """Every finished part of the run in `out`, each read once with its checksums verified.

    A damaged part is set aside (one line); a part whose rows all sit in a part of a higher
    level (a compaction cut short) is deleted. Linear in the rows held."""
    out = Path(out)
    found = []
    for path in part_files(out):
        try:
            found.append(Part(path, _level(path), _part_indices(path)))
        except FileNotFoundError:
            continue  # compacted away by the shard that wrote it: its rows are in a newer part
        except DamagedPart as damage:
            set_aside(damage)
    return _drop_superseded(found)


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

    def __init__(self, out: Path, parts: list[Part]) -> None:
        self.out = out
        self.levels: dict[int, list[Part]] = defaultdict(list)
        for part in parts:
            self.levels[part.level].append(part)

    def write(self, frame: pd.DataFrame) -> Path:
        """Write the rows of `frame` as a part (`write_part`) and take it; compact when due."""
        path = write_part(self.out, frame)
        self.add(path, frame[INDEX].to_numpy())
        return path

    def add(self, path: Path, indices: np.ndarray) -> None:
        """Take a part this process has just written (`write_part`); compact when due."""
        part = Part(path, _level(path), np.asarray(indices, dtype=np.int64))
        self.levels[part.level].append(part)
        level = part.level
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
            except DamagedPart as damage:
                set_aside(damage)
                group = [p for p in group if p.path != damage.path]
        return None

    def _write(self, group: list[Part], level: int) -> Part:
        indices = np.concatenate([p.indices for p in group])
        target = part_path(self.out, indices, level)
        schemas = []
        for part in group:
            try:
                schemas.append(pq.read_schema(part.path))
            except (OSError, pa.ArrowException) as exc:
                raise DamagedPart(part.path, str(exc).splitlines()[0]) from None
        schema = pa.unify_schemas(schemas, promote_options="permissive")

        def write(tmp: Path) -> None:
            with pq.ParquetWriter(tmp, schema, write_page_checksum=True) as writer:
                for part in group:
                    try:
                        source = pq.ParquetFile(part.path, page_checksum_verification=True)
                        tables = (source.read_row_group(k) for k in range(source.num_row_groups))
                        for table in tables:
                            writer.write_table(table.select(schema.names).cast(schema))
                    except (OSError, pa.ArrowException) as exc:
                        raise DamagedPart(part.path, str(exc).splitlines()[0]) from None

        atomic_write(target, write)
        for part in group:
            if part.path != target:
                part.path.unlink(missing_ok=True)
        return Part(target, level, indices)


# ---------------------------------------------------------------------- merge


def merge_if_complete(out: Path, total: int) -> Path | None:
    """Write `scores.parquet` (rows in prompt order) if every prompt has exactly one row.

    Coverage is checked from the index columns first, so a shard that is not last reads little;
    the merge then reads every part with its checksums verified (a damaged one is set aside and
    None returned: its prompts are redone)."""
    out = Path(out)
    target = out / "scores.parquet"
    files = part_files(out)
    if not files:
        return target if target.is_file() else None
    covered = np.zeros(total, dtype=bool)
    try:
        for path in files:
            indices = pq.read_table(path, columns=[INDEX])[INDEX].to_numpy()
            covered[indices[(indices >= 0) & (indices < total)]] = True
    except FileNotFoundError:
        return None  # another shard is compacting: it is alive and merges when it ends
    except (OSError, pa.ArrowException, KeyError):
        pass  # the verified read below sets the damaged part aside
    if not covered.all():
        return None
    tables = []
    for path in files:
        try:
            tables.append(_read_part(path))
        except FileNotFoundError:
            return None
        except DamagedPart as damage:
            set_aside(damage)
            return None
    table = pa.concat_tables(tables, promote_options="permissive").sort_by(INDEX)
    indices = table[INDEX].to_numpy()
    first = np.ones(len(indices), dtype=bool)
    first[1:] = indices[1:] != indices[:-1]  # one row per prompt (a part written twice)
    table = table.filter(pa.array(first))
    if table.num_rows != total:
        return None
    return write_table(target, table)
