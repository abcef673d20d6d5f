"""The run loop shared by every probe: shard, score or generate, stream parts, resume, merge.

Layout of a run directory:
    manifest.json            what was run (study, model, probe, mode, data hash, versions, command,
                             results_format)
    parts/part-<first>.parquet  finished chunks, each written atomically (temp name + rename)
    scores.parquet           all rows in prompt order, written once every prompt has a row

A row holds `prompt_index`, `prompt_id` (the item id, shared with capture and patching tables),
the probe's key columns, the summary columns of the exact scores (`valid_mass`, `argmax`, `mode`,
`error_bound`, and `expected`, `std` for numeric answers), one `p::<answer>` column per answer
(normalised over the answer set; times `valid_mass` it is the unnormalised probability), and in
generate mode `response` (the generated text up to where its parsed answer was fixed: end of
sequence, `Probe.settled`, or the budget) and `parsed`.

A run killed at any moment (even SIGKILL) and started again skips the prompts that already have
a row, so nothing is lost, duplicated or redone. Shards (`--shard i/n`, or the processes of a
`torchrun` / `accelerate launch`) take every n-th prompt, write parts into the same directory,
and whoever finds the last part in place merges them.
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from probekit.engines.hf.model import LoadedModel
from probekit.engines.hf.scorer import DEFAULT_EPSILON, Scorer
from probekit.errors import ProbekitError
from probekit.io import write_parquet, write_text
from probekit.items import Item
from probekit.studies.base import MODES, Probe, check_mode

EXPLAIN = "explain"
"""Generate until the probe's `answer_cue`, then read the answer distribution there exactly."""
RUN_MODES = (*MODES, EXPLAIN)
INDEX = "prompt_index"
PROMPT_ID = "prompt_id"
RESULTS_FORMAT = 2
"""Version of the scores table: 1 dropped the `p::` columns; 2 keeps them and adds `prompt_id`."""
# Manifest fields that must match for a run directory to be resumed.
RESUME_KEYS = (
    "results_format", "model", "weights", "probe", "mode", "data_sha256", "epsilon",
    "max_new_tokens", "temperature",
)  # fmt: skip


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


def run_probe(
    probe: Probe,
    model: LoadedModel,
    out: Path,
    manifest: dict[str, Any],
    mode: str = "ev",
    shard: Shard = Shard(),
    batch_size: int | None = None,
    epsilon: float = DEFAULT_EPSILON,
    chunk_size: int = 256,
) -> Path | None:
    """Run this shard of `probe` into `out`; return the merged scores path once complete."""
    check_mode(mode, RUN_MODES)
    out.mkdir(parents=True, exist_ok=True)
    check_manifest(out, {**manifest, "results_format": RESULTS_FORMAT})
    parts = out / "parts"
    parts.mkdir(exist_ok=True)
    total = len(probe)
    done = completed_indices(parts)
    todo = sum(1 for i in range(total) if shard.owns(i) and i not in done)
    scorer = Scorer(
        model, probe.answers, epsilon=epsilon, batch_size=batch_size,
        max_new_tokens=probe.max_new_tokens if mode == "generate" else 0,
        settled=probe.settled, temperature=probe.temperature, seed=manifest.get("seed", 0),
    )  # fmt: skip
    with tqdm(total=todo, unit="prompt", desc=probe.name, mininterval=_bar_interval()) as bar:
        chunk: list[tuple[int, Item]] = []
        for i, item in enumerate(probe.items()):
            if shard.owns(i) and i not in done:
                chunk.append((i, item))
            if len(chunk) == chunk_size:
                _write_part(parts, _run_chunk(chunk, probe, model, scorer, mode, bar))
                chunk = []
        if chunk:
            _write_part(parts, _run_chunk(chunk, probe, model, scorer, mode, bar))
    return merge_if_complete(out, total)


def _run_chunk(chunk, probe: Probe, model: LoadedModel, scorer: Scorer, mode: str, bar):
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
        responses = model.tokenizer.batch_decode(
            [r.generated for r in results], skip_special_tokens=True
        )
        frame["response"] = responses
        frame["parsed"] = [probe.parse(r) for r in responses]
    for column, values in explained.items():
        frame[column] = values
    return frame


def _explain_until_cue(chunk, probe: Probe, model: LoadedModel, scorer: Scorer):
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
        total=len(ids), unit="prompt", desc="explanations", mininterval=_bar_interval()
    ) as bar:
        generated = writer.generate(ids, progress=bar)
    responses = model.tokenizer.batch_decode(generated, skip_special_tokens=True)
    cut = [r.find(cue) for r in responses]
    explanations = [r if at < 0 else r[:at] for r, at in zip(responses, cut, strict=True)]
    items = [
        (i, replace(item, prefill=item.prefill + text + cue))
        for (i, item), text in zip(chunk, explanations, strict=True)
    ]
    return items, {"explanation": explanations, "cue_missing": [at < 0 for at in cut]}


def _bar_interval() -> float:
    """Seconds between progress updates: live in a terminal; in a log (a background run), every
    30 s."""
    return 0.1 if sys.stderr.isatty() else 30.0


def _write_part(parts: Path, frame: pd.DataFrame) -> None:
    write_parquet(parts / f"part-{int(frame[INDEX].iloc[0]):010d}.parquet", frame)


def completed_indices(parts: Path) -> set[int]:
    """Prompt indices that already have a row in a finished part."""
    done: set[int] = set()
    for part in sorted(parts.glob("part-*.parquet")):
        done.update(pq.read_table(part, columns=[INDEX]).column(INDEX).to_pylist())
    return done


def merge_if_complete(out: Path, total: int) -> Path | None:
    """Write `scores.parquet` (rows in prompt order) if every prompt has exactly one row."""
    target = out / "scores.parquet"
    files = sorted((out / "parts").glob("part-*.parquet"))
    if not files:
        return target if target.is_file() else None
    if len(completed_indices(out / "parts")) < total:
        return None
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    frame = frame.sort_values(INDEX, kind="stable").drop_duplicates(INDEX, keep="first")
    if len(frame) != total:
        return None
    return write_parquet(target, frame.reset_index(drop=True))


def check_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest, or refuse to resume a directory that holds a different run."""
    path = out / "manifest.json"
    if path.is_file():
        old = json.loads(path.read_text())
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
    write_text(path, json.dumps(manifest, indent=1, default=str))
