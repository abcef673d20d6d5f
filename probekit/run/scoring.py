"""How a run's chunks of prompts become rows (`Scoring`): in this process (`local_scoring`), or
on a pool of engines loaded elsewhere (`EnginePool`: `probekit.run.ray.RayPool`, whose
`RayScoring` streams chunks to Ray actors); the run loop around them is one
(`probekit.run.loop.run_rows`). Each also says the pace it expects, before the first batch, so
that a run's first line says how long it will take on this device.

The pace (prompts a second) is that of the last run of the same model (its weights, dtype and
precision tier), device, answer set and view on this machine, kept in a small record in the
user cache (`pace.json`: written at the end of every run that scored prompts, one entry per
such key); where there is none, a short sample measures it (`sample_pace`)
and the record keeps that until a run replaces it. The line names where its pace comes from;
after the first batch the progress says how long the run takes at the pace it actually goes
(`probekit.core.progress`).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import platform
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.io import row_bytes, write_text
from probekit.core.items import PROMPT_ID, Item
from probekit.core.paths import user_cache_dir
from probekit.core.progress import progress
from probekit.core.store import INDEX
from probekit.engines.base import Engine, Scorer
from probekit.studies.base import VIEWS, Probe

RECORD = "pace.json"


def record_path() -> Path:
    """The per-machine record of measured paces: `pace.json` in the user cache."""
    return user_cache_dir() / RECORD


@dataclass(frozen=True)
class Pace:
    """Prompts scored a second, and where that figure comes from (a phrase: "measured by the last
    run of this model on this machine (432 prompts, 2026-11-28)", "measured on 16 prompts after
    a warm-up")."""

    per_second: float
    source: str

    def seconds(self, prompts: int) -> float:
        return prompts / self.per_second


def pace_key(described: Mapping[str, Any], answers: AnswerSet, view: str) -> str:
    """What a pace is the pace of: this machine, the model as `described` (`Engine.describe`:
    engine, spec, weights, dtype, precision tier, device), the answer set and the view."""
    tier = (described.get("precision") or {}).get("tier")
    answer_text = "\n".join(answers.answers).encode()
    fields = [
        platform.node(),
        described.get("engine"),
        described.get("model"),
        described.get("weights"),
        described.get("dtype"),
        tier,
        str(described.get("device")),
        hashlib.sha256(answer_text).hexdigest()[:16],
        view,
    ]
    return json.dumps(fields, default=str)


def _read() -> dict[str, Any]:
    """The record; empty when there is none or it cannot be read (it is only a hint)."""
    try:
        found = json.loads(record_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def recorded_pace(key: str) -> Pace | None:
    """The pace the record holds for `key`, None when it holds none."""
    entry = _read().get(key)
    try:
        per_second = float(entry["per_second"])
        source = str(entry["source"])
    except (TypeError, KeyError, ValueError):
        return None
    return Pace(per_second, source) if per_second > 0 else None


def record_pace(key: str, pace: Pace) -> None:
    """Keep `pace` for `key`. A record that cannot be written is left as it is: it is only a
    hint."""
    found = _read()
    found[key] = {"per_second": pace.per_second, "source": pace.source}
    try:
        write_text(record_path(), json.dumps(found, indent=1))
    except ProbekitError:  # a read-only cache, a full disk
        return


EXPLAIN = VIEWS[2]
"""Generate until the probe's `answer_cue`, then read the answer distribution there exactly."""
CHUNK_BATCHES = 2
"""Scorer batches per chunk (a part): a kill loses at most one finished batch besides the one in
flight."""
SAMPLE_PROMPTS = 16
"""A pace sample's prompts where the scorer sizes its batches itself: enough to fill a batch of
the small models' plans on a CPU."""
Chunk = list[tuple[int, Item]]  # (prompt index, item) pairs scored together


@dataclass
class Scoring:
    """Turns chunks of a run's prompts into rows (one per prompt: `prompt_index`, `prompt_id`,
    the probe's key columns, the scores), and says the pace it expects. Made with `score`, one
    chunk's rows (moving the progress `bar`); a scoring of its own kind overrides `rows`."""

    desc: str
    """The run's name in progress lines."""
    chunk_size: int
    """Prompts a chunk: a part of the run."""
    key: str
    """What its pace is the pace of (`pace_key`)."""
    score: Callable[[Chunk, Any], pd.DataFrame] | None = None
    batch_size: int | None = None
    """The scorer's batch, recorded in the run's manifest (None: not one batch)."""
    row_bytes: int = 0
    """About the bytes of a row on disk (`probekit.core.io.row_bytes`; 0: not known)."""
    measures: bool = False
    """Whether a pace is measured on a sample where none is recorded (scoring in this
    process)."""

    def rows(self, chunks: Iterator[Chunk], bar: Any) -> Iterator[pd.DataFrame]:
        """Each chunk's rows, as it is scored (`bar`, the progress, moved as prompts are)."""
        assert self.score is not None
        for chunk in chunks:
            yield self.score(chunk, bar)

    def expected_pace(self, first: Chunk) -> Pace | None:
        """The pace recorded for this run's key, else (where the scoring `measures`) one
        measured on the prompts of `first` and recorded; None when there is none."""
        found = recorded_pace(self.key)
        if found is None and self.measures:
            found = sample_pace(lambda chunk: self.rows(iter([chunk]), None), first)
            record_pace(self.key, found)
        return found

    def close(self) -> None:
        """Let go of what scoring held (Ray's actors)."""


class EnginePool(ABC):
    """Engines loaded somewhere else (Ray actors), given to `probekit.run.loop.run_probe` in
    place of an engine of this process: the run is the same, its chunks are scored there."""

    @abstractmethod
    def scoring(self, probe: Probe, view: str, **settings: Any) -> Scoring:
        """The `Scoring` of `probe`'s run in `view` on this pool's engines; `settings`: the
        scorer's, as `local_scoring` takes them (`epsilon`, `batch_size`, `seed`,
        `chunk_size`)."""


def local_scoring(
    probe: Probe, model: Engine, view: str, chunk_size: int | None = None, **settings: Any
) -> Scoring:
    """A run's chunks scored in this process by one scorer of `model` (`run_chunk`);
    `settings`: the scorer's (`epsilon`, `batch_size`, `seed`)."""
    scorer = model.scorer(
        probe.answers,
        max_new_tokens=probe.max_new_tokens if view == "generate" else 0,
        settled=probe.settled,
        temperature=probe.temperature,
        **settings,
    )
    batch = getattr(scorer, "batch_size", None)  # the plan's, or batch_size
    return Scoring(
        probe.name,
        chunk_size or CHUNK_BATCHES * max(1, batch or 16),
        pace_key(model.describe(), probe.answers, view),
        functools.partial(run_chunk, probe, model, scorer, view),
        batch,
        probe_row_bytes(probe),
        measures=True,
    )


def probe_row_bytes(probe: Probe) -> int:
    """About the bytes of one of `probe`'s rows on disk: a number per answer and key column."""
    return row_bytes(len(probe.answers.answers) + len(probe.key_columns))


def sample_pace(
    score: Callable[[Chunk], Iterator[pd.DataFrame]],
    prompts: Chunk,
    clock: Callable[[], float] = time.monotonic,
) -> Pace:
    """The pace of `score` on a batch of `prompts` (a whole batch of the run's), timed after a
    warm-up call on the first prompt: the first call pays for loading kernels and filling caches,
    which a pace from it alone multiplies by the run's length. The rows are not kept (which
    prompts share a batch decides the last digits of every number)."""
    for _ in score(prompts[:1]):  # the warm-up, not timed
        pass
    started = clock()
    for _ in score(prompts):
        pass
    seconds = max(clock() - started, 1e-6)
    unit = "prompt" if len(prompts) == 1 else "prompts"
    return Pace(len(prompts) / seconds, f"measured on {len(prompts)} {unit} after a warm-up")


def run_chunk(probe: Probe, model: Engine, scorer: Scorer, view: str, chunk: Chunk, bar: Any):
    """The rows of one chunk of (prompt index, item), scored by `scorer` in `view`."""
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
