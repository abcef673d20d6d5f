"""Writing result files so that a reader never sees half of one, and every write failure as one
line: a hidden temporary name in the same folder, renamed into place once complete
(`atomic_write`, `ParquetStream`); a disk without room for what a command will write is refused
before the work (`check_room`); a full disk or a read-only folder is a `ProbekitError` naming
the file, and leaves nothing behind (a stream's complete rows are kept beside their target:
`keep_or_replace`). `check_outputs` tries an output folder, and the names a command writes in
it, before any work, and `FileLock` keeps two processes out of the same work (a run's shard, a
model conversion)."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from probekit.core.errors import MARK, ProbekitError, named


def temporary_name(path: Path) -> Path:
    """A hidden name beside `path`, unique to this process (parquet readers skip dot files)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


WRITE_HINTS = {
    (errno.ENOSPC, errno.EDQUOT): "the disk is full; free some space (or give another {out}) and "
    "run it again",
    (errno.EROFS, errno.EACCES, errno.EPERM): "the folder is not writable; give a writable {out}",
    (errno.EEXIST, errno.ENOTDIR): "a file stands where a folder must be; move it, or give "
    "another {out}",
}
"""What to do about a failed write, by its errno."""


class WriteFailed(ProbekitError):
    """A write that failed (`write_error`): what was finished before it can still be kept."""


def write_error(path: Path, exc: OSError) -> ProbekitError:
    """One line for a failed write: what failed, why, and what to do. (Arrow's IO errors carry
    the errno only in their text, `[Errno 28] ...`.)"""
    found = re.search(r"\[Errno (\d+)\]", str(exc))
    code = exc.errno or (int(found.group(1)) if found else None)
    reason = exc.strerror or (os.strerror(code) if code else str(exc).splitlines()[0])
    hint = next(
        (h for codes, h in WRITE_HINTS.items() if code in codes), "check the path and the disk"
    )
    return WriteFailed(f"cannot write {path}: {reason}; {hint.format(out=named('out'))}")


def _discard(path: Path) -> None:
    """Remove a temporary file if possible: a read-only folder must not raise a second error."""
    with suppress(OSError):
        path.unlink(missing_ok=True)


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call `write(tmp)` to write the file, then rename it to `path` (its folder made first),
    removing it on failure. An OSError (full disk, read-only folder) becomes a ProbekitError
    naming `path`."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        _discard(tmp)
    return path


def write_parquet(path: str | Path, frame: pd.DataFrame) -> Path:
    """Write `frame` (without its index) to `path` atomically."""
    return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def write_table(path: str | Path, table: pa.Table) -> Path:
    """Write an Arrow table to `path` atomically, with a CRC checksum on every page (and the
    Arrow schema, which `probekit.core.store` checks the file's schema against)."""
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, write_page_checksum=True))


def write_text(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; a file names options as Python keywords
    (`probekit.core.errors.MARK` dropped)."""
    return atomic_write(path, lambda tmp: tmp.write_text(text.replace(MARK, ""), encoding="utf-8"))


def check_writable(folder: str | Path, option: str = "out", needs: int = 0) -> Path:
    """Refuse, in one line naming the `option` that gives it, an output folder that cannot be
    created or written: a real write in its nearest existing folder (permissions alone miss
    read-only file systems), removed at once; or whose disk has less free than the `needs`
    bytes the work will write. Run before any work, so a bad folder fails in seconds."""
    target = Path(folder).expanduser()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        where = "" if existing == target else f": {existing}"
        raise ProbekitError(f"{named(option)} {folder}{where} is a file, not a folder")
    probe = temporary_name(existing / ".write-check")
    try:
        probe.write_bytes(b"")
    except OSError as exc:
        raise ProbekitError(f"{named(option)} {folder}: {write_error(existing, exc)}") from None
    finally:
        _discard(probe)
    check_room(folder, needs, option=option)
    return target


def check_room(folder: str | Path, needs: int, what: str = "", option: str = "out") -> None:
    """Refuse, in one line naming the `option` and its `folder`, a disk with less free than the
    `needs` bytes that the work (`what`: the activation shards, ...) will write there; run
    before the work, so that a disk that cannot hold it fails in seconds rather than hours in."""
    existing = next(p for p in (Path(folder).expanduser(), *Path(folder).parents) if p.exists())
    if needs > 0 and (free := shutil.disk_usage(existing).free) < needs:
        raise ProbekitError(
            f"{named(option)} {folder}: its disk has {free / 2**20:.0f} MiB free, the work "
            f"writes about {needs / 2**20:.0f} MiB{f' ({what})' if what else ''}; free some "
            f"space or give another {named(option)}"
        )


def row_bytes(numbers: int) -> int:
    """About the bytes on disk of a row of `numbers` numbers and the summary columns of a score
    (8 more), at 8 bytes each: what Parquet writes of floats at most."""
    return 8 * (numbers + 8)


def check_outputs(folder: str | Path, names: Iterable[str] = (), option: str = "out") -> Path:
    """`check_writable(folder, option)`, and each of `names` (what a command writes in `folder`;
    a folder when it ends in "/") not there as the other kind: one line naming the path."""
    target = check_writable(folder, option)
    for name in names:
        path, wanted = target / name.rstrip("/"), "folder" if name.endswith("/") else "file"
        if path.exists() and path.is_dir() != (wanted == "folder"):
            found = "folder" if wanted == "file" else "file"
            raise ProbekitError(
                f"{named(option)} {folder}: {path} is a {found} where a {wanted} is written; "
                f"move it, or give another {named(option)}"
            )
    return target


def keep_or_replace(tmp: Path, path: Path) -> None:
    """Rename the complete file `tmp` to `path`; where that fails, keep it beside `path` (as
    `<stem>.partial<suffix>`) and say so in one line, with how to finish (moving it to `path`)."""
    try:
        os.replace(tmp, path)
    except OSError as exc:
        kept = path.with_name(f"{path.stem}.partial{path.suffix}")
        os.replace(tmp, kept)  # the same folder: where this fails too, the rows are lost
        raise WriteFailed(
            f"{write_error(path, exc).marked}; the rows are kept in {kept}: move it to {path} to "
            "finish"
        ) from None


class ParquetStream:
    """Append DataFrames as row groups, with a CRC on every page; the file appears under its
    name only once closed cleanly.

    Memory stays flat however many rows pass through, and a failure (a full disk included)
    leaves no half-written file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.tmp = temporary_name(self.path)
        self._writer: pq.ParquetWriter | None = None

    def write(self, frame: pd.DataFrame, metadata: dict[bytes, bytes] | None = None) -> None:
        """Append `frame`; `metadata` (the file's, given with the first frame) is added to the
        schema's."""
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if metadata and self._writer is None:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
        try:
            if self._writer is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._writer = pq.ParquetWriter(self.tmp, table.schema, write_page_checksum=True)
            self._writer.write_table(table.cast(self._writer.schema))
        except OSError as exc:
            raise write_error(self.path, exc) from None

    def __enter__(self) -> ParquetStream:
        return self

    def __exit__(self, failed: type[BaseException] | None, *rest: object) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
                if failed is None:
                    keep_or_replace(self.tmp, self.path)
        except OSError as err:
            if failed is None:
                raise write_error(self.path, err) from None
        finally:
            _discard(self.tmp)


class LockHeld(ProbekitError):
    """Another live process holds the lock; its message says which (`PID 123 on host h`)."""


class FileLock:
    """An exclusive lock on `path` that names its holder (PID and host) inside the file.

    The kernel's `flock` does the locking, so a killed holder (SIGKILL included) releases it at
    once: a lock file left behind by a dead process on this host is stale and taken over. A
    lock file naming a process on another host (a shared filesystem, where `flock` may not
    reach across machines) is honoured until that file is deleted. `blocking=False` raises
    `LockHeld` instead of waiting.

    Released by its holder, the lock file is deleted (while still locked). A process that opened
    the file before then and gets its `flock` after finds it no longer at `path`, and opens the
    new one: whoever holds the lock holds the file that is at `path`.
    """

    def __init__(self, path: str | Path, blocking: bool = False) -> None:
        self.path = Path(path)
        self.blocking = blocking
        self._fd: int | None = None

    def __enter__(self) -> FileLock:
        fd = None
        while fd is None:
            fd = self._lock()
        try:
            holder = _holder(fd)
            if holder and holder[1] != socket.gethostname() and not self.blocking:
                raise _held(holder)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _lock(self) -> int | None:
        """The file at `path`, opened (created if absent) and `flock`ed; None when it was deleted
        or replaced while this process waited for its lock (its holder released it)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise write_error(self.path, exc) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                raise _held(_holder(fd)) from None
        except BaseException:
            os.close(fd)
            raise
        if self._at_path(fd):
            return fd
        os.close(fd)
        return None

    def _at_path(self, fd: int) -> bool:
        """Whether `fd` is the file that `path` names now."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except OSError:
            return False

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            with suppress(OSError):
                if self._at_path(self._fd):  # not deleted by hand and replaced meanwhile
                    try:
                        self.path.unlink()  # under the lock: no other process holds this file
                    except OSError:
                        os.ftruncate(self._fd, 0)  # cannot delete: empty means nobody holds it
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _holder(fd: int) -> tuple[str, str] | None:
    """(pid, host) written in a lock file, or None when it is empty or unreadable."""
    text = os.pread(fd, 512, 0).decode("utf-8", "replace").split()
    return (text[0], text[1]) if len(text) >= 2 else None


def _held(holder: tuple[str, str] | None) -> LockHeld:
    return LockHeld(f"PID {holder[0]} on host {holder[1]}" if holder else "another process")
