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

The part store (naming, checksummed reads, compaction, the merge) is `probekit.run.parts`; the
shards are `probekit.run.shards`; `probekit.run.study` runs a whole study over this loop.

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

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from probekit.core.errors import ProbekitError
from probekit.core.io import check_writable
from probekit.core.items import PROMPT_ID, Item
from probekit.core.progress import progress
from probekit.core.public import public
from probekit.core.rundir import RESULTS_FORMAT, RowKey, RunDir
from probekit.engines.base import Engine, Scorer
from probekit.run.options import RunOptions
from probekit.run.parts import (
    DAMAGED,
    FANOUT,
    INDEX,
    PARTS,
    Compactor,
    DamagedPart,
    Part,
    done_mask,
    finished_scores,
    merge_if_complete,
    part_files,
    part_path,
    say,
    scan_parts,
    set_aside,
    write_part,
)
from probekit.run.shards import WHOLE, Shard
from probekit.studies.base import VIEWS, Probe, check_view

__all__ = [  # the part store and shards moved to their own modules; these names still import
    "DAMAGED",
    "FANOUT",
    "INDEX",
    "PARTS",
    "RESULTS_FORMAT",
    "Compactor",
    "Part",
    "Shard",
    "hold_shard",
    "merge_if_complete",
    "part_path",
    "prepare_run_dir",
    "release_shard",
    "run_probe",
    "scan_parts",
    "write_part",
]

EXPLAIN = VIEWS[2]
"""Generate until the probe's `answer_cue`, then read the answer distribution there exactly."""
CHUNK_BATCHES = 2
"""Scorer batches per chunk (a part): a kill loses at most one finished batch besides the one in
flight."""
Chunk = list[tuple[int, Item]]  # (prompt index, item) pairs scored together


def prompt_count(probe: Probe, limit: int | None) -> int:
    """How many prompts a run of `probe` scores: all, or the first `limit`."""
    total = len(probe)
    return total if limit is None else min(total, limit)


@public(RunOptions, skip=("shard", "out", "limit"))  # limit: the first N prompts here
def run_probe(
    probe: Probe,
    model: Engine,
    out: str | Path,
    manifest: dict[str, Any],
    *,
    view: str,
    shard: Shard = WHOLE,
    batch_size: int | None,
    epsilon: float,
    chunk_size: int | None = None,
    limit: int | None = None,
    hint: str | None = None,
) -> Path | None:
    """Run this shard of `probe` (its first `limit` prompts, else all) into `out`, in `view`
    (exact, generate or explain); return the merged scores path once complete.

    Each chunk of prompts (`chunk_size`, else `CHUNK_BATCHES` of the scorer's batches) is
    written as a part once scored; a part found damaged at the merge is set aside and its
    prompts redone. Progress goes to stderr (`probekit.core.progress`): after the first batch,
    the time the run will take on this device, with `hint` on how to make it smaller."""
    view = check_view(view)
    if limit is not None and limit < 1:
        raise ProbekitError(f"limit must be at least 1 (got {limit})")
    if chunk_size is not None and chunk_size < 1:
        raise ProbekitError(f"chunk size must be at least 1, not {chunk_size}")
    out = Path(out)
    with open_run(out, shard, {**manifest, "limit": limit}) as started:
        key = row_key(probe, started, prompt_count(probe, limit))
        if (finished := finished_scores(out, key)) is not None:
            say(f"{probe.name}: {finished} holds every row of this run; nothing to score")
            return finished
        scorer = model.scorer(
            probe.answers,
            epsilon=epsilon,
            batch_size=batch_size,
            max_new_tokens=probe.max_new_tokens if view == "generate" else 0,
            settled=probe.settled,
            temperature=probe.temperature,
            seed=manifest.get("seed", 0),
        )
        size = chunk_size or CHUNK_BATCHES * max(1, getattr(scorer, "batch_size", 16))
        for attempt in range(3):  # again if the merge set a damaged part of this shard aside
            compactor, wanted = pending(out, shard, key, probe.name)
            todo = int(wanted.sum())
            if attempt and not todo:
                return None  # the part set aside held other shards' rows
            with progress(todo, "prompt", probe.name, hint) as bar:
                for chunk in chunks(probe, wanted, size):
                    compactor.write(run_chunk(chunk, probe, model, scorer, view, bar))
            batch = getattr(scorer, "batch_size", None)  # the plan's, or --batch-size
            if todo and batch:
                RunDir(out).update_manifest(batch_size=batch)
            aside = len(list((out / PARTS).glob(f"*{DAMAGED}")))
            merged = merge_if_complete(out, len(key.ids))
            if merged is not None or len(list((out / PARTS).glob(f"*{DAMAGED}"))) == aside:
                return merged  # None: other shards' prompts are still missing
        return None


def row_key(probe: Probe, manifest: dict[str, Any], total: int) -> RowKey:
    """What the rows of this run of `probe` (its first `total` prompts) must match to be
    reused: the settings of `manifest` and the prompts' ids."""
    return RowKey.of(manifest, (item.id for item in islice(probe.items(), total)))


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
        hold_shard(out, shard)
        folder.start(manifest)
        yield manifest
    finally:
        release_shard(out, shard)


def hold_shard(out: Path, shard: Shard) -> None:
    """Take the lock of this shard of the run in `out` for this process (`RunDir.hold`)."""
    RunDir(out).hold(shard.index, shard.count)


def release_shard(out: Path, shard: Shard) -> None:
    RunDir(out).release(shard.index, shard.count)


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
    hold_shard(out, shard)
    for path in part_files(out):
        try:
            pq.read_metadata(path)
        except FileNotFoundError:
            continue
        except (OSError, pa.ArrowException) as exc:
            set_aside(DamagedPart(path, str(exc).splitlines()[0]))


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


def chunks(probe: Probe, wanted: np.ndarray, size: int) -> Iterator[Chunk]:
    """The items whose index is `wanted`, in prompt order, in chunks of `size` (the last may be
    shorter)."""
    chunk: Chunk = []
    for i, item in zip(range(len(wanted)), probe.items(), strict=False):
        if wanted[i]:
            chunk.append((i, item))
            if len(chunk) == size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def run_chunk(chunk, probe: Probe, model: Engine, scorer: Scorer, view: str, bar):
    explained = {}
    if view == EXPLAIN:
        chunk, explained = _explain_until_cue(chunk, probe, model, scorer)
    ids = [model.encode(item, probe.as_string).input_ids for _, item in chunk]
    results = list(scorer.score(ids, window=len(ids), progress=bar))  # the bar moves per batch
    frame = pd.DataFrame(
        [
            {INDEX: i, PROMPT_ID: item.id, **item.key, **result.row(probe.answers)}
            for (i, item), result in zip(chunk, results, strict=True)
        ]
    )
    if view == "generate":
        responses = model.decode([r.generated for r in results])
        frame["response"] = responses
        frame["parsed"] = [probe.parse(r) for r in responses]
    for column, values in explained.items():
        frame[column] = values
    return probe.add_columns(frame)


def _explain_until_cue(chunk, probe: Probe, model: Engine, scorer: Scorer):
    """Explain view: generate each response greedily (up to `probe.max_new_tokens`), cut it
    after the first `probe.answer_cue`, and return the items with that text as their prefill,
    so that the exact scores are read where the model gives its answer. A response without the
    cue gets it appended and is flagged `cue_missing`; `explanation` is the text before it."""
    cue = getattr(probe, "answer_cue", None)
    if not cue:
        raise ProbekitError(f"view {EXPLAIN} needs a probe with an answer cue ({probe.name})")
    writer = copy.copy(scorer)  # same model, answers and settings, with a generation budget
    writer.max_new_tokens = probe.max_new_tokens
    ids = [model.encode(item, probe.as_string).input_ids for _, item in chunk]
    with progress(len(ids), "prompt", f"{probe.name} explanations") as bar:
        generated = writer.generate(ids, progress=bar)
    responses = model.decode(generated)
    cut = [r.find(cue) for r in responses]
    explanations = [r if at < 0 else r[:at] for r, at in zip(responses, cut, strict=True)]
    items = [
        (i, replace(item, prefill=item.prefill + text + cue))
        for (i, item), text in zip(chunk, explanations, strict=True)
    ]
    return items, {"explanation": explanations, "cue_missing": [at < 0 for at in cut]}
