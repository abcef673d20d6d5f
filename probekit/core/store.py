"""Finished work on disk, one implementation for every kind of it: a run's parts and
`scores.parquet` (one process, shards or Ray), a steering run's α folders, a capture's shards and
JaEm-ST's free responses.

A finished file is a Parquet table written atomically with a CRC on every page (`write_rows`).
Its schema records the settings its rows were made under (`probekit.core.rundir.RowKey`) and,
where the table commits another file (a capture's tensor shard), that file's SHA-256; every row
carries its prompt id (`prompt_id`), a run's rows their prompt index as well.

Read back (`read_rows`), a file is used only if every page verifies, its schema is the one
written (its columns' names and types and its records, as the Arrow schema the writer stored
beside them says: the pages' checksums do not cover them), the file it commits is the one
written, its settings are the run's and its rows are the run's prompts (at their prompt index,
or located by their ids). A file that fails is set aside, never deleted: renamed `*.damaged` (it
cannot be read whole) or `*.mismatched` (its rows are not this run's), with one line on stderr
saying so and what happens next (`set_aside`, `set_aside_all`); its work is done again. A resume
is then the rows that were taken (`take_rows`).
"""

from __future__ import annotations

import base64
import binascii
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from probekit.core.errors import ProbekitError
from probekit.core.io import write_table
from probekit.core.items import PROMPT_ID
from probekit.core.paths import file_sha256
from probekit.core.progress import echo
from probekit.core.rundir import RowKey

INDEX = "prompt_index"
"""The column of a run's rows that holds each row's prompt index."""
DAMAGED = ".damaged"
MISMATCHED = ".mismatched"
COMMITTED_SHA256 = b"probekit.shard_sha256"
"""The Parquet metadata key of the SHA-256 of the file a table commits (a capture's shard)."""
ARROW_SCHEMA = b"ARROW:schema"
"""The Parquet metadata key under which pyarrow's writer stores the Arrow schema it wrote."""
READ_ERRORS = (OSError, pa.ArrowException, KeyError, ValueError, binascii.Error)
"""What reading a file that is not whole raises."""


def say(message: str) -> None:
    """A line about the state of finished work (resumed, set aside) on stderr, quiet or not."""
    echo(message, file=sys.stderr, flush=True)


class Unusable(Exception):
    """A finished file that cannot be used: `Damaged` or `Mismatched`; `describe` is a phrase
    that follows the file's name."""

    suffix, phrase = "", "{}"

    def __init__(self, path: Path, reason: str, rows: int = 0) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.rows = Path(path), reason, rows

    def describe(self) -> str:
        return self.phrase.format(self.reason)


class Damaged(Unusable):
    """A file that cannot be read whole: truncated, a page, its schema or a committed file that
    does not match what was written, a column missing."""

    suffix, phrase = DAMAGED, "is damaged ({})"


class Mismatched(Unusable):
    """A whole file whose rows are not this run's: other settings, other prompts."""

    suffix, phrase = MISMATCHED, "holds rows {}"


@dataclass(frozen=True, eq=False)
class Rows:
    """A finished file that verified: its rows' prompt indices in the run (None where the key
    takes rows of any prompts), their prompt ids, and the rows themselves when asked for."""

    path: Path
    indices: np.ndarray | None
    ids: list[str]
    table: pa.Table | None = None


def stamped(table: pa.Table, key: RowKey, commits: Path | None = None) -> pa.Table:
    """`table` with the settings of `key` (and the SHA-256 of the file it `commits`) added to its
    schema's metadata, pandas' own record kept."""
    metadata = {**(table.schema.metadata or {}), **key.metadata()}
    if commits is not None:
        metadata[COMMITTED_SHA256] = file_sha256(commits).encode()
    return table.replace_schema_metadata(metadata)


def write_rows(
    path: str | Path, rows: pd.DataFrame | pa.Table, key: RowKey, commits: Path | None = None
) -> Path:
    """Write finished rows to `path` atomically, a CRC on every page, recording the settings of
    `key` they were made under and, when the table `commits` another file (written first), that
    file's SHA-256; the rows carry their prompt ids (`prompt_id`)."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pandas(rows, preserve_index=False)
    return write_table(path, stamped(table, key, commits))


def damage(path: Path, exc: BaseException) -> Damaged:
    """The `Damaged` of a file whose read raised `exc`."""
    return Damaged(path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def schema_of(path: Path) -> pa.Schema:
    """The schema of a finished file, verified against the Arrow schema its writer stored beside
    it (column names, types and the file's records: one changed byte of them is caught);
    `Damaged` if they differ or cannot be read. A missing file raises FileNotFoundError."""
    try:
        footer = pq.read_metadata(path)
        records = dict(footer.metadata or {})
        stored = records.pop(ARROW_SCHEMA, None)
        schema = footer.schema.to_arrow_schema()
        written = stored and pa.ipc.read_schema(pa.py_buffer(base64.b64decode(stored)))
    except FileNotFoundError:
        raise
    except READ_ERRORS as exc:
        raise damage(path, exc) from None
    if not written or written.names != schema.names or (written.metadata or {}) != records:
        raise Damaged(path, "its schema is not the one written")
    if not written.equals(schema):
        raise Damaged(path, "its columns' types are not the ones written")
    return schema


def row_groups(path: Path, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """The row groups of a finished file, each with its page checksums verified (flat memory);
    `Damaged` if one cannot be read. A missing file raises FileNotFoundError."""
    try:
        source = pq.ParquetFile(path, page_checksum_verification=True)
        for k in range(source.num_row_groups):
            yield source.read_row_group(k, columns=list(columns) if columns else None)
    except FileNotFoundError:
        raise
    except READ_ERRORS as exc:
        raise damage(path, exc) from None


def read_table(path: Path, columns: Sequence[str] | None = None) -> pa.Table:
    """A finished file read whole (or its `columns`), its schema and every page verified;
    `Damaged` if it cannot be. A missing file raises FileNotFoundError."""
    schema = schema_of(path)
    groups = list(row_groups(path, columns))
    if not groups:
        names = list(columns) if columns else schema.names
        return pa.schema([schema.field(n) for n in names], schema.metadata).empty_table()
    return pa.concat_tables(groups).replace_schema_metadata(schema.metadata)


def read_rows(
    path: str | Path,
    key: RowKey | None,
    *,
    columns: Sequence[str] | None = None,
    keep: bool = False,
    complete: bool = False,
    require: Sequence[str] = (),
    commits: Path | None = None,
) -> Rows:
    """The rows of a finished file, verified: its schema, every page read (or only `columns`'),
    the `require`d columns present and the file it `commits` as written (else `Damaged`), its
    settings those of `key` and its rows the key's prompts (else `Mismatched`); with `complete`,
    one row for each of the key's prompts, in prompt order. `keep` keeps the rows
    (`Rows.table`). A row's prompt index is its `prompt_index` where the file has one, else
    where its prompt id is in the key. `key` None checks the file only. A missing file raises
    FileNotFoundError."""
    path = Path(path)
    schema = schema_of(path)
    table = read_table(path, columns) if keep else None
    missing = [c for c in require if c not in schema.names]
    if missing:
        raise Damaged(path, f"no {missing[0]} column")
    indices, ids = [], []
    for group in [table] if table is not None else row_groups(path, columns):
        if INDEX in group.column_names:  # one row group at a time: flat memory
            indices.append(group.column(INDEX).to_numpy())
        if PROMPT_ID in group.column_names:
            ids += group.column(PROMPT_ID).to_pylist()
    if commits is not None:
        recorded = (schema.metadata or {}).get(COMMITTED_SHA256, b"").decode()
        if not commits.is_file() or file_sha256(commits) != recorded:
            raise Damaged(path, f"{commits.name}, which it commits, is missing or not as written")
    located = np.concatenate(indices) if indices else None
    rows = len(located) if located is not None else len(ids)
    if key is None:
        return Rows(path, located, ids, table)
    reason = key.mismatch(schema.metadata, located, ids)
    if reason is not None:
        raise Mismatched(path, reason, rows)
    if located is None and key.ids is not None:
        located = key.locate(ids)
    if complete and key.ids is not None:
        n = len(key.ids)
        if located is None or not np.array_equal(located, np.arange(n)):
            raise Mismatched(path, f"that are not one for each of the {n} prompts ({rows})", rows)
    return Rows(path, located, ids, table)


def take_rows(path: str | Path, key: RowKey | None, then: str, **options: Any) -> Rows | None:
    """`read_rows(path, key, **options)`, or None: when there is no file, and when it is
    unusable (then set aside, one line ending with what happens `then`)."""
    try:
        return read_rows(path, key, **options)
    except FileNotFoundError:
        return None
    except Unusable as unusable:
        together = options.get("commits")
        set_aside(unusable, then, [together] if isinstance(together, Path) else [])
        return None


def _rename(path: Path, suffix: str, why: str) -> bool:
    """Rename `path` with `suffix` (False when it is gone already); one line if it cannot be."""
    try:
        path.replace(path.with_name(path.name + suffix))
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ProbekitError(
            f"{path} {why} and cannot be renamed ({exc.strerror}); delete it and run the same "
            "command again to redo its work"
        ) from None
    return True


def set_aside(unusable: Unusable, then: str, together: Sequence[Path] = ()) -> None:
    """Rename an unusable file (and the files `together` with it, e.g. the shard an index
    commits) `*.damaged` or `*.mismatched`, kept for inspection and no longer read, and say so
    in one line ending with what happens `then`."""
    why = unusable.describe()
    if not _rename(unusable.path, unusable.suffix, why):
        return
    for path in together:
        _rename(path, unusable.suffix, why)
    name = unusable.path.name + unusable.suffix
    also = f" with {', '.join(p.name for p in together)}" if together else ""
    say(f"{unusable.path} {why}; set aside as {name}{also}, {then}")


def set_aside_all(folder: Path, found: Sequence[Unusable], then: str) -> None:
    """Set aside many files of `folder` (a run's parts) in one line per kind: damaged ones each
    by name, foreign ones together, by the first one's reason."""
    for unusable in found:
        if not isinstance(unusable, Mismatched):
            set_aside(unusable, then)
    foreign = [u for u in found if isinstance(u, Mismatched)]
    renamed = [u for u in foreign if _rename(u.path, MISMATCHED, u.describe())]
    if renamed:
        rows = sum(u.rows for u in renamed)
        what = "1 part holds" if len(renamed) == 1 else f"{len(renamed)} parts hold"
        say(f"{folder}: {what} {rows} rows {renamed[0].reason}; set aside as *{MISMATCHED}, {then}")
