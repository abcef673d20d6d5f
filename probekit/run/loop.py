"""The run loop shared by every probe: shard, score or generate, checkpoint, resume, merge.

Layout of a run directory:
    manifest.json         what was run (study, model, probe, mode, data hash, versions, command,
                          results_format)
    parts/part-L<level>-<first index>-<digest>.parquet
                          finished rows, each part written atomically with a CRC on every page
    .lock-shard-<i>-of-<n>  the process running that shard now (PID and host; deleted when it
                          ends)
    scores.parquet        all rows in prompt order, written once every prompt has a row

A row holds `prompt_index`, `prompt_id` (the item id, shared with capture and patching tables),
the probe's key columns, the summary columns of the exact scores (`valid_mass`, `argmax`, `mode`,
`error_bound`, and `expected`, `std` for numeric answers), one `p::<answer>` column per answer
(normalised over the answer set; times `valid_mass` it is the unnormalised probability), and in
generate mode `response` (the generated text up to where its parsed answer was fixed: end of
sequence, `Probe.settled`, or the budget) and `parsed`.

Checkpoints. The loop scores the prompts in chunks of `CHUNK_BATCHES` (2) of the scorer's batches
(32 prompts on a CPU, 128 on a GPU; `chunk_size` overrides it) and writes each chunk as a part as
soon as it is scored, so a run killed at any moment (SIGKILL included) loses at most the batch in
flight and the one finished before it in its chunk (with the default model on 2 CPU cores, a batch
is 5-30 s of scoring, the longest for JaEm-ST's long A-E prompts). Started again, it reads the
parts, says how many prompts it found done, and scores only the others: nothing written is
redone, and every prompt gets exactly one row. Chunks are counted in prompts, never in seconds:
which prompts share a batch decides the last digits of every number (padding and batch shape
change the float32 sums by ~1e-6), so a resumed run, a run on a busy machine and an
uninterrupted one write the same bits; two batches per chunk leave the scorer room to group
prompts of similar length.

Why small parts compacted as the run goes, rather than one append-only file: a Parquet file is
readable only once its footer is written, so an append-only store would need its own log format
and recovery; a part renamed into place is complete or absent, needs no recovery, and lets
shards and workers on other machines add rows to one folder without sharing a file. Left alone,
one part per chunk per process would grow to hundreds of thousands of files at the paper's scale
(tens of millions of prompts), so a process that holds `FANOUT` (16) parts of one level merges
them, streaming row groups, into one part a level up (a log-structured merge): a row is
rewritten at most log16 of (rows / rows per chunk) times (3 for 10 million prompts at 3,000 a
chunk), a process keeps at most 15 parts per level, and nothing finished is re-read except to
compact it. A resume reads every part once: linear in the rows, never quadratic.

A part's name comes from its prompt indices (the first and a digest of them all), so writing
the same rows again gives the same part (`write_part`, for workers that score batches of prompt
indices elsewhere). A part whose rows all sit in a higher-level part (a compaction cut short)
is deleted on resume.

Damaged state. A resume reads every part with its page checksums verified; a truncated or
damaged part is renamed `*.damaged`, one line says so, and its prompts are redone. A manifest
that is not JSON stops the run with one line naming it. `prepare_run_dir` checks all of this,
that the folder is writable and takes the shard's lock before the model loads.

Shards (`--shard i/n`, or the processes of a `torchrun` / `accelerate launch`) take every n-th
prompt, write parts into the same directory, and whoever finds the last prompt done merges. The
same shard of a run started twice is refused with one line naming the process that holds it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from probekit.core.errors import ProbekitError
from probekit.core.io import (
    FileLock,
    LockHeld,
    atomic_write,
    check_writable,
    read_verified,
    write_error,
    write_table,
    write_text,
)
from probekit.core.items import PROMPT_ID, Item
from probekit.engines.base import DEFAULT_EPSILON, Engine, Scorer
from probekit.studies.base import MODES, Probe, check_mode

EXPLAIN = "explain"
"""Generate until the probe's `answer_cue`, then read the answer distribution there exactly."""
RUN_MODES = (*MODES, EXPLAIN)
INDEX = "prompt_index"
RESULTS_FORMAT = 2
"""Version of the scores table: 1 dropped the `p::` columns; 2 keeps them and adds `prompt_id`."""
# Manifest fields that must match for a run directory to be resumed.
RESUME_KEYS = (
    "results_format",
    "model",
    "weights",
    "probe",
    "mode",
    "data_sha256",
    "epsilon",
    "max_new_tokens",
    "temperature",
)
CHUNK_BATCHES = 2
"""Scorer batches per chunk (a part): a kill loses at most one finished batch besides the one in
flight."""
FANOUT = 16  # parts of one level that a process merges into one part a level up
PARTS = "parts"
DAMAGED = ".damaged"
Chunk = list[tuple[int, Item]]  # (prompt index, item) pairs scored together
_PART_NAME = re.compile(r"^part-L(\d+)-\d+-[0-9a-f]+\.parquet$")


def say(message: str) -> None:
    """A line about the run's state (resumed, part set aside) on stderr, beside the progress."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Shard:
    """This process's share of the prompts: those with `index % count == index_`."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise ProbekitError(f"--shard '{text}' must look like i/n, e.g. 0/4") from None
        if n < 1 or not 0 <= i < n:
            raise ProbekitError(f"--shard '{text}': need 0 <= i < n")
        return cls(i, n)

    def split(self, rank: int, world: int) -> Shard:
        """Subdivide this shard among the `world` processes of a distributed launch."""
        return Shard(self.index * world + rank, self.count * world)

    def owns(self, prompt_index: int) -> bool:
        return prompt_index % self.count == self.index

    def mask(self, total: int) -> np.ndarray:
        """A boolean per prompt index of a probe of `total` prompts: True for this shard's."""
        return np.arange(total) % self.count == self.index

    def owns_all(self, indices: np.ndarray) -> bool:
        return bool(np.all(indices % self.count == self.index))


class RunOptions(TypedDict, total=False):
    """`run_probe`'s keywords after its probe, model, folder and manifest, for the runners made
    in its shape (`probekit.run.ray`): `**options: Unpack[RunOptions]`."""

    mode: str
    shard: Shard
    batch_size: int | None
    epsilon: float
    chunk_size: int | None


@dataclass(frozen=True)
class Part:
    """A finished part: its file, its compaction level and the prompt indices of its rows."""

    path: Path
    level: int
    indices: np.ndarray


def run_probe(
    probe: Probe,
    model: Engine,
    out: Path,
    manifest: dict[str, Any],
    mode: str = "ev",
    shard: Shard = Shard(),
    batch_size: int | None = None,
    epsilon: float = DEFAULT_EPSILON,
    chunk_size: int | None = None,
) -> Path | None:
    """Run this shard of `probe` into `out`; return the merged scores path once complete.

    Each chunk of prompts (`chunk_size`, else `CHUNK_BATCHES` of the scorer's batches) is
    written as a part once scored; a part found damaged at the merge is set aside and its
    prompts redone.
    """
    check_mode(mode, RUN_MODES)
    out = Path(out)
    with open_run(out, shard, manifest):
        scorer = model.scorer(
            probe.answers,
            epsilon=epsilon,
            batch_size=batch_size,
            max_new_tokens=probe.max_new_tokens if mode == "generate" else 0,
            settled=probe.settled,
            temperature=probe.temperature,
            seed=manifest.get("seed", 0),
        )
        if chunk_size is not None and chunk_size < 1:
            raise ProbekitError(f"chunk size must be at least 1, not {chunk_size}")
        size = chunk_size or CHUNK_BATCHES * max(1, getattr(scorer, "batch_size", 16))
        total = len(probe)
        for attempt in range(3):  # again if the merge set a damaged part of this shard aside
            compactor, wanted = pending(out, shard, total, probe.name)
            todo = int(wanted.sum())
            if attempt and not todo:
                return None  # the part set aside held other shards' rows
            with tqdm(
                total=todo, unit="prompt", desc=probe.name, mininterval=bar_interval()
            ) as bar:
                for chunk in chunks(probe, wanted, size):
                    compactor.write(run_chunk(chunk, probe, model, scorer, mode, bar))
            aside = len(list((out / PARTS).glob(f"*{DAMAGED}")))
            merged = merge_if_complete(out, total)
            if merged is not None or len(list((out / PARTS).glob(f"*{DAMAGED}"))) == aside:
                return merged  # None: other shards' prompts are still missing
        return None


@contextmanager
def open_run(out: Path, shard: Shard, manifest: dict[str, Any]) -> Iterator[None]:
    """This shard of the run in `out`, held for the `with` block: `prepare_run_dir`, the parts
    folder, the shard's lock (released at the end) and the manifest (written, or checked against
    the run the folder holds, with `results_format` added)."""
    try:
        prepare_run_dir(out, shard)
        _make_dir(out)
        hold_shard(out, shard)
        check_manifest(out, {**manifest, "results_format": RESULTS_FORMAT})
        yield
    finally:
        release_shard(out, shard)


def pending(out: Path, shard: Shard, total: int, name: str) -> tuple[Compactor, np.ndarray]:
    """What this shard of the run in `out` (`total` prompts, of the probe `name`) has left: a
    `Compactor` holding the shard's finished parts, and a boolean per prompt index, True where
    this shard's prompt has no row yet. Says how many prompts were found done when resuming."""
    found = scan_parts(out)
    mine = shard.mask(total)
    wanted = mine & ~done_mask(found, total)
    todo = int(wanted.sum())
    if todo < mine.sum():
        say(
            f"{name}: resuming {out}: {int(mine.sum()) - todo} of "
            f"{int(mine.sum())} prompts of this shard already done, {todo} to go"
        )
    return Compactor(out, [p for p in found if shard.owns_all(p.indices)]), wanted


def chunks(probe: Probe, wanted: np.ndarray, size: int) -> Iterator[Chunk]:
    """The items whose index is `wanted`, in prompt order, in chunks of `size` (the last may be
    shorter)."""
    chunk: Chunk = []
    for i, item in enumerate(probe.items()):
        if wanted[i]:
            chunk.append((i, item))
            if len(chunk) == size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def run_chunk(chunk, probe: Probe, model: Engine, scorer: Scorer, mode: str, bar):
    explained = {}
    if mode == EXPLAIN:
        chunk, explained = _explain_until_cue(chunk, probe, model, scorer)
    ids = [model.encode(item, probe.as_string).input_ids for _, item in chunk]
    results = list(scorer.score(ids, window=len(ids), progress=bar))  # the bar moves per batch
    frame = pd.DataFrame(
        [
            {INDEX: i, PROMPT_ID: item.id, **item.key, **result.row(probe.answers)}
            for (i, item), result in zip(chunk, results, strict=True)
        ]
    )
    if mode == "generate":
        responses = model.decode([r.generated for r in results])
        frame["response"] = responses
        frame["parsed"] = [probe.parse(r) for r in responses]
    for column, values in explained.items():
        frame[column] = values
    return probe.add_columns(frame)


def _explain_until_cue(chunk, probe: Probe, model: Engine, scorer: Scorer):
    """Explain mode: generate each response greedily (up to `probe.max_new_tokens`), cut it
    after the first `probe.answer_cue`, and return the items with that text as their prefill,
    so that the exact scores are read where the model gives its answer. A response without the
    cue gets it appended and is flagged `cue_missing`; `explanation` is the text before it."""
    cue = getattr(probe, "answer_cue", None)
    if not cue:
        raise ProbekitError(f"mode {EXPLAIN} needs a probe with an answer cue ({probe.name})")
    writer = copy.copy(scorer)  # same model, answers and settings, with a generation budget
    writer.max_new_tokens = probe.max_new_tokens
    ids = [model.encode(item, probe.as_string).input_ids for _, item in chunk]
    with tqdm(
        total=len(ids), unit="prompt", desc="explanations", mininterval=bar_interval()
    ) as bar:
        generated = writer.generate(ids, progress=bar)
    responses = model.decode(generated)
    cut = [r.find(cue) for r in responses]
    explanations = [r if at < 0 else r[:at] for r, at in zip(responses, cut, strict=True)]
    items = [
        (i, replace(item, prefill=item.prefill + text + cue))
        for (i, item), text in zip(chunk, explanations, strict=True)
    ]
    return items, {"explanation": explanations, "cue_missing": [at < 0 for at in cut]}


def bar_interval() -> float:
    """Seconds between progress updates: live in a terminal; in a log (a background run), every
    30 s."""
    return 0.1 if sys.stderr.isatty() else 30.0


# ---------------------------------------------------------------------- parts


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


def _part_files(out: Path) -> list[Path]:
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
    for path in _part_files(out):
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


def completed_indices(parts: Path) -> set[int]:
    """Prompt indices that already have a row in a finished part (of the run in `parts/..`)."""
    return {int(i) for part in scan_parts(Path(parts).parent) for i in part.indices}


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
    files = _part_files(out)
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


# ---------------------------------------------------------------------- manifest and locks


def _make_dir(out: Path) -> None:
    try:
        (out / PARTS).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(out, exc) from None


def read_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest of the run in `out`, None if there is none; one line if it is damaged."""
    path = Path(out) / "manifest.json"
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        manifest = reason
    except OSError as exc:
        raise ProbekitError(f"cannot read {path}: {exc.strerror}") from None
    if not isinstance(manifest, dict):
        why = manifest if isinstance(manifest, str) else "not a JSON object"
        raise ProbekitError(
            f"{path} is damaged ({why}), so the parts beside it cannot be matched to this run: "
            f"if {out} holds this same run, delete {path.name} and run again to resume it; "
            "otherwise give another --out or delete the folder"
        )
    return manifest


def check_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest, or refuse to resume a directory that holds a different run."""
    old = read_manifest(out)
    if old is not None:
        if old.get("results_format", 1) != manifest.get("results_format"):
            raise ProbekitError(
                f"{out} holds a run in results format {old.get('results_format', 1)}, this "
                f"probekit writes format {manifest.get('results_format')} (it keeps every answer "
                "probability); use another --out, or delete the folder to run it again"
            )
        for key in RESUME_KEYS:
            if old.get(key) != manifest.get(key):
                raise ProbekitError(
                    f"{out} holds a run with a different {key} ({old.get(key)!r} vs "
                    f"{manifest.get(key)!r}); use another --out or delete it"
                )
        return
    write_text(Path(out) / "manifest.json", json.dumps(manifest, indent=1, default=str))


_LOCKS: dict[tuple[Path, Shard], FileLock] = {}


def lock_path(out: Path, shard: Shard) -> Path:
    return Path(out) / f".lock-shard-{shard.index}-of-{shard.count}"


def hold_shard(out: Path, shard: Shard) -> None:
    """Take the lock of this shard of the run in `out` for this process (kept until
    `release_shard` or the process ends; taking it again is a no-op). One line naming the
    holder if another process runs the same shard."""
    key = (Path(out).resolve(), shard)
    if key in _LOCKS:
        return
    lock = FileLock(lock_path(out, shard))
    try:
        lock.__enter__()
    except LockHeld as held:
        raise ProbekitError(
            f"shard {shard.index}/{shard.count} of the run in {out} is already running "
            f"({held.holder}); wait for it or stop it (a lock left by a process that has died on "
            f"this host is taken over; one from another host: delete {lock.path})"
        ) from None
    _LOCKS[key] = lock


def release_shard(out: Path, shard: Shard) -> None:
    lock = _LOCKS.pop((Path(out).resolve(), shard), None)
    if lock is not None:
        lock.__exit__(None, None, None)


def prepare_run_dir(out: str | Path, shard: Shard = Shard()) -> None:
    """Checks to run before the model loads, each failing with one line, writing nothing new:
    `out` is writable (or can be created); if it holds a run, its manifest is readable, this
    shard is not running elsewhere (its lock is taken and kept for `run_probe`), and a
    truncated part is set aside (its prompts are redone)."""
    out = Path(out)
    check_writable(out)
    if not out.is_dir():
        return
    read_manifest(out)
    hold_shard(out, shard)
    for path in _part_files(out):
        try:
            pq.read_metadata(path)
        except FileNotFoundError:
            continue
        except (OSError, pa.ArrowException) as exc:
            set_aside(DamagedPart(path, str(exc).splitlines()[0]))
