"""The run loop shared by every probe: shard, score or generate, checkpoint, resume, merge.

Layout of a run directory:
    manifest.json         what was run (study, model, probe, view, limit, data hash, versions,
                          command, results_format; `probekit.core.rundir.RunDir` reads and
                          writes it and says which fields are resume keys)
    parts/part-L<level>-<first index>-<digest>.parquet
                          finished rows, each part written atomically with a CRC on every page
    .lock-shard-<i>-of-<n>  the process running that shard now (PID and host; deleted when it
                          ends)
    scores.parquet        all rows in prompt order, written once every prompt has a row

A row holds `prompt_index`, `prompt_id` (the item id, shared with capture and patching tables),
the probe's key columns, the summary columns of the exact scores (`valid_mass`, `greedy`,
`most_probable`, `error_bound`, and `expected`, `std` for numeric answers), one `p::<answer>`
column per answer (normalised over the answer set; times `valid_mass` it is the unnormalised
probability), and in the generate view `response` (the generated text up to where its parsed
answer was fixed: end of sequence, `Probe.settled`, or the budget) and `parsed`.

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

The part store (naming, compaction, the merge) is `probekit.run.parts`, over the store of every
kind of finished work (`probekit.core.store`: checksums, the row key, setting aside); the shards
are `Shard`s; how chunks become rows, in this process or on Ray, is
`probekit.run.scoring` (one loop, `run_rows`, runs both); `probekit.run.study` runs a whole
study over this loop. Before the first batch a run says how many prompts it will score and how
long that takes on this device (`probekit.run.scoring`).

Damaged and foreign state. A resume reads every part with its page checksums verified; a
truncated or damaged part is renamed `*.damaged`, one line says so, and its prompts are redone.
Every part and `scores.parquet` record the settings their rows were scored under
(`probekit.core.rundir.RowKey`): rows whose settings or prompt ids are not this run's are renamed
`*.mismatched` (one line) and redone, whatever manifest lies beside them; a `scores.parquet`
that matches is the run's result even when its parts are gone. A manifest that is not JSON stops
the run with one line naming it. `prepare_run_dir` checks all of this,
that the folder is writable and takes the shard's lock before the model loads.

Shards (`--shard i/n`, or the processes of a `torchrun` / `accelerate launch`) take every n-th
prompt, write parts into the same directory, and whoever finds the last prompt done merges. The
same shard of a run started twice is refused with one line naming the process that holds it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from probekit.core.errors import ProbekitError
from probekit.core.io import check_room, check_writable
from probekit.core.items import Item
from probekit.core.kinds import Kind, int_value, non_negative_int, positive_int, refuse, text
from probekit.core.options import option
from probekit.core.progress import duration, is_quiet, note, progress
from probekit.core.public import public
from probekit.core.rundir import RESULTS_FORMAT, RowKey, RunDir
from probekit.core.shared_options import BatchSizeOption, LimitOption, OutOption, SeedOption
from probekit.core.store import DAMAGED, damage, say, set_aside
from probekit.engines.base import Engine
from probekit.engines.options import EpsilonOption
from probekit.run.parts import (
    PARTS,
    REDONE,
    SCORES,
    Compactor,
    done_mask,
    finished_scores,
    merge_if_complete,
    part_files,
    scan_parts,
)
from probekit.run.scoring import (
    SAMPLE_PROMPTS,
    Chunk,
    EnginePool,
    Pace,
    Scoring,
    local_scoring,
    record_pace,
)
from probekit.studies.base import Probe, check_view


@dataclass(frozen=True)
class Shard:
    """This process's share of the prompts: those with `index % count == index_`."""

    index: int = 0
    count: int = 1

    def split(self, rank: int, world: int) -> Shard:
        """Subdivide this shard among the `world` processes of a distributed launch."""
        return Shard(self.index * world + rank, self.count * world)

    def mask(self, total: int) -> np.ndarray:
        """A boolean per prompt index of a probe of `total` prompts: True for this shard's."""
        return np.arange(total) % self.count == self.index

    def owns_all(self, indices: np.ndarray) -> bool:
        return bool(np.all(indices % self.count == self.index))


WHOLE = Shard()
"""The whole run: one process scores every prompt."""


def _shard_value(value: Any) -> tuple[int, int]:
    if isinstance(value, str):
        try:
            value = [int(x) for x in value.split("/")]
        except ValueError:
            refuse(f"'{value}' must look like i/n, e.g. 0/4")
    if not isinstance(value, Sequence) or len(value) != 2:
        refuse(f"{value!r} must look like i/n, e.g. 0/4 (or a pair (i, n))")
    index, count = (int_value(x) for x in value)
    if count < 1 or not 0 <= index < count:
        refuse(f"'{index}/{count}': need 0 <= i < n")
    return index, count


shard_kind = Kind("shard", str, _shard_value)
"""`i/n` (or a pair from Python): every n-th prompt from the i-th (0 <= i < n)."""


def _numerics(value: Any) -> int | str:
    return value if value == "auto" else non_negative_int.check(value)


numerics_sample = Kind(
    "numerics", lambda value: value if value == "auto" else non_negative_int.parse(value), _numerics
)
"""`auto` or a count of prompts (0: no noise figure)."""


def _ray(value: Any) -> str:
    return "" if value is True else text.check(value)


ray_address = Kind("address", str, _ray)
"""A Ray cluster's address (`HOST:PORT`), or "" (True from Python): the one found here."""


@dataclass(frozen=True)
class RunOptions(LimitOption, EpsilonOption, BatchSizeOption, SeedOption, OutOption):
    """Run options: the view, which prompts, how they are scored, where."""

    view: str = option(
        "exact",
        help="exact (the scores from the logits, the default), generate (the authors' "
        "generation and parse, exact scores beside them) or explain (giebench)",
        kind=text,
    )
    shard: tuple[int, int] = option(
        (0, 1), help="i/n: run every n-th prompt from the i-th (default 0/1)", kind=shard_kind
    )
    numerics: int | str = option(
        "auto",
        help="prompts re-scored in float64 for the noise figure: auto (1 per 200 prompts, at "
        "most 8, none below 200), N, or 0 (skip)",
        kind=numerics_sample,
    )
    ray: str | None = option(
        None,
        help="score on Ray actors, one engine each: the cluster at ADDRESS (HOST:PORT; with "
        "token authentication also RAY_AUTH_MODE=token), else $RAY_ADDRESS, else the cluster "
        "`ray start` runs here, else a local instance (./setup.sh --ray)",
        kind=ray_address,
        const="",
        metavar="ADDRESS",
    )
    ray_actors: int | None = option(
        None,
        help="engines on Ray (default: one per GPU of the cluster, else one per node)",
        kind=positive_int,
        metavar="N",
    )


ATTEMPTS = 3
"""Rounds of scoring a run makes: again after its merge set a damaged part aside."""


@public(RunOptions, skip=("shard", "out"))
def run_probe(
    probe: Probe,
    model: Engine | EnginePool,
    out: str | Path,
    manifest: dict[str, Any],
    *,
    view: str = "exact",
    shard: Shard = WHOLE,
    batch_size: int | None = None,
    epsilon: float = 1e-4,
    chunk_size: int | None = None,
    limit: int | None = None,
    hint: str | None = None,
) -> Path | None:
    """Run this shard of `probe` into `out`, in `view` (exact, generate or explain), scored by
    `model`: an engine of this process, or a pool of engines elsewhere (`EnginePool`, e.g.
    `probekit.run.ray.RayPool`); return the merged scores path once complete (`run_rows`).

    `limit`: a smoke run, as `probekit run --limit` makes it: the whole units of every group
    whose prompts fit in `limit` (`Probe.limited`; recorded in the manifest). Each chunk of
    prompts (`chunk_size`, else the scoring's own: `CHUNK_BATCHES` of the scorer's batches in
    this process) is written as a part once scored. Progress goes to stderr
    (`probekit.core.progress`): first how many prompts are to be scored and how long that will
    take on this device, then the progress, with `hint` on how to make the run smaller."""
    view = check_view(view)
    if chunk_size is not None and chunk_size < 1:
        raise ProbekitError(f"chunk size must be at least 1, not {chunk_size}")
    probe = probe if limit is None else probe.limited(limit)  # `limit` checked by its kind
    settings = {
        "epsilon": epsilon,
        "batch_size": batch_size,
        "seed": manifest.get("seed", 0),
        "chunk_size": chunk_size,
    }

    def start() -> Scoring:
        if isinstance(model, EnginePool):
            return model.scoring(probe, view, **settings)
        return local_scoring(probe, model, view, **settings)

    return run_rows(probe, Path(out), {**manifest, "limit": limit}, start, shard, hint)


def run_rows(
    probe: Probe,
    out: Path,
    manifest: dict[str, Any],
    start: Callable[[], Scoring],
    shard: Shard = WHOLE,
    hint: str | None = None,
) -> Path | None:
    """This shard of `probe`'s run in the run folder `out` (`open_run`), its rows made by the
    `Scoring` that `start` gives (`fill`); the merged scores path, or None while other shards'
    prompts are missing."""
    with open_run(out, shard, manifest) as started:
        key = RowKey.of(started, (item.id for item in probe.items()))  # the rows reused
        return fill(probe.items, probe.name, out, key, start, shard, hint)


def fill(
    items: Callable[[], Iterable[Item]],
    name: str,
    out: Path,
    key: RowKey,
    start: Callable[[], Scoring],
    shard: Shard = WHOLE,
    hint: str | None = None,
    merged: str = SCORES,
    keep_parts: bool = True,
) -> Path | None:
    """The run loop of every command that scores (a run, in one process or on Ray; a lens; each
    α of a steering run): this shard of the prompts `items` (of `name`, and the ids of `key`)
    into `out`, made by the `Scoring` that `start` gives (called only if there is something to
    score), written as parts as they come, resumed from the parts found, and merged into
    `merged` once every prompt has a row (the parts then removed unless `keep_parts`); the
    merged path, or None while other shards' prompts are missing.

    A disk without room for the rows (`Scoring.row_bytes`, as parts and merged) is refused in
    one line before they are scored. A `merged` file that holds every row ends it at once; a
    part set aside by the merge (damaged) has its prompts scored again (`ATTEMPTS` rounds in
    all)."""
    if (finished := finished_scores(out, key, merged)) is not None:
        say(f"{name}: {finished} holds every row of this run; nothing to score")
        return finished
    scoring: Scoring | None = None
    try:
        for attempt in range(ATTEMPTS):
            compactor, wanted = pending(out, shard, key, name)
            todo = int(wanted.sum())
            if attempt and not todo:
                return None  # the part set aside held other shards' rows
            if todo:
                scoring = scoring or start()
                check_room(out, 2 * todo * scoring.row_bytes, f"the scores of {todo} prompts")
                _score(items, name, scoring, compactor, wanted, out, hint)
                if scoring.batch_size and RunDir(out).manifest_path.is_file():
                    RunDir(out).update_manifest(batch_size=scoring.batch_size)
            aside = len(list((out / PARTS).glob(f"*{DAMAGED}")))
            found = merge_if_complete(out, len(key.ids), merged)
            if found is not None or len(list((out / PARTS).glob(f"*{DAMAGED}"))) == aside:
                if found is not None and not keep_parts:
                    shutil.rmtree(out / PARTS, ignore_errors=True)
                return found  # None: other shards' prompts are still missing
        return None
    finally:
        if scoring is not None:
            scoring.close()


def _score(
    items: Callable[[], Iterable[Item]],
    name: str,
    scoring: Scoring,
    compactor: Compactor,
    wanted: np.ndarray,
    out: Path,
    hint: str | None,
) -> None:
    """Score the `wanted` prompts into parts: first one line saying how many and how long they
    will take on this device, then the progress; the pace they went at is recorded, and the
    scorer's batch in the run's manifest."""
    todo = int(wanted.sum())
    if not is_quiet():
        first = next(chunks(items(), wanted, scoring.batch_size or SAMPLE_PROMPTS))
        when = "its time is said after the first batch"
        if pace := scoring.expected_pace(first):  # `about 3 min on this device (at ...)`
            smaller = f"; a smaller run: {hint}" if hint else ""
            when = f"about {duration(pace.seconds(todo))} on this device (at "
            when += f"{pace.per_second:.3g} prompts/s, {pace.source}{smaller})"
        note(f"{name}: {todo} prompts to score into {out}, {when}")
    started = time.monotonic()
    with progress(todo, "prompt", scoring.desc, hint) as bar:
        for frame in scoring.rows(chunks(items(), wanted, scoring.chunk_size), bar):
            compactor.write(frame)
    seconds = max(time.monotonic() - started, 1e-6)
    measured = (
        f"measured by the last run of this model on this machine ({todo} prompts, {date.today()})"
    )
    record_pace(scoring.key, Pace(todo / seconds, measured))


@contextmanager
def open_run(out: Path, shard: Shard, manifest: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """This shard of the run in `out`, held for the `with` block: `prepare_run_dir`, the parts
    folder, the shard's lock (released at the end) and the manifest (written, or checked against
    the run the folder holds, with `results_format` added; the block gets it)."""
    folder = RunDir(out)
    manifest = {**manifest, "results_format": RESULTS_FORMAT}
    try:
        prepare_run_dir(out, shard)
        folder.make()
        folder.hold(shard.index, shard.count)
        folder.start(manifest)
        yield manifest
    finally:
        folder.release(shard.index, shard.count)


def prepare_run_dir(out: str | Path, shard: Shard = WHOLE) -> None:
    """Checks to run before the model loads, each failing with one line, writing nothing new:
    `out` is writable (or can be created); if it holds a run, its manifest is readable, this
    shard is not running elsewhere (its lock is taken and kept for `run_probe`), and a
    truncated part is set aside (its prompts are redone)."""
    out = Path(out)
    check_writable(out)
    if not out.is_dir():
        return
    RunDir(out).read_manifest()
    RunDir(out).hold(shard.index, shard.count)
    for path in part_files(out):
        try:
            pq.read_metadata(path)
        except FileNotFoundError:
            continue
        except (OSError, pa.ArrowException) as exc:
            set_aside(damage(path, exc), REDONE)


def pending(out: Path, shard: Shard, key: RowKey, name: str) -> tuple[Compactor, np.ndarray]:
    """What this shard of the run in `out` (the prompts of `key`, of the probe `name`) has left:
    a `Compactor` holding the shard's finished parts, and a boolean per prompt index, True where
    this shard's prompt has no row yet. Parts that are not this run's rows are set aside
    (`scan_parts`). Says how many prompts were found done when resuming."""
    total = len(key.ids)
    found = scan_parts(out, key)
    mine = shard.mask(total)
    wanted = mine & ~done_mask(found, total)
    todo = int(wanted.sum())
    if todo < mine.sum():
        say(
            f"{name}: resuming {out}: {int(mine.sum()) - todo} of "
            f"{int(mine.sum())} prompts of this shard already done, {todo} to go"
        )
    return Compactor(out, [p for p in found if shard.owns_all(p.indices)], key), wanted


def chunks(items: Iterable[Item], wanted: np.ndarray, size: int) -> Iterator[Chunk]:
    """The items whose index is `wanted`, in prompt order, in chunks of `size` (the last may be
    shorter)."""
    picked = ((i, item) for i, item in zip(range(len(wanted)), items, strict=False) if wanted[i])
    while chunk := list(islice(picked, size)):
        yield chunk
