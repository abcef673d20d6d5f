"""The run loop shared by every probe: shard, score or generate, stream parts, resume, merge.

Layout of a run directory:
    manifest.json            what was run (model, probe, mode, data hash, versions, command)
    parts/part-<first>.parquet  finished chunks, each written atomically (temp name + rename)
    scores.parquet           all rows in prompt order, written once every prompt has a row

A run killed at any moment (even SIGKILL) and started again skips the prompts that already have
a row, so nothing is lost, duplicated or redone. Shards (`--shard i/n`, or the processes of a
`torchrun` / `accelerate launch`) take every n-th prompt, write parts into the same directory,
and whoever finds the last part in place merges them.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from probekit.errors import ProbekitError
from probekit.models import LoadedModel
from probekit.scoring.engine import DEFAULT_EPSILON, Scorer
from probekit.studies.probe import Probe

INDEX = "prompt_index"
MODES = ("ev", "generate")
SCORE_COLUMNS = ("valid_mass", "expected", "std", "argmax", "mode", "error_bound")
# Manifest fields that must match for a run directory to be resumed.
RESUME_KEYS = ("model", "weights", "probe", "mode", "data_sha256", "epsilon", "max_new_tokens")


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
    if mode not in MODES:
        raise ProbekitError(f"unknown mode '{mode}'; choose one of {', '.join(MODES)}")
    out.mkdir(parents=True, exist_ok=True)
    check_manifest(out, manifest)
    parts = out / "parts"
    parts.mkdir(exist_ok=True)
    total = len(probe)
    done = completed_indices(parts)
    todo = sum(1 for i in range(total) if shard.owns(i) and i not in done)
    scorer = Scorer(
        model, probe.answers, epsilon=epsilon, batch_size=batch_size,
        max_new_tokens=probe.max_new_tokens if mode == "generate" else 0,
    )  # fmt: skip
    # In a terminal a live bar; redirected to a log (a background run), an update every 30 s.
    interval = 0.1 if sys.stderr.isatty() else 30.0
    with tqdm(total=todo, unit="prompt", desc=probe.name, mininterval=interval) as bar:
        chunk: list[tuple[int, dict[str, Any], list[dict[str, str]]]] = []
        for i, (key, messages) in enumerate(probe.prompts()):
            if shard.owns(i) and i not in done:
                chunk.append((i, key, messages))
            if len(chunk) == chunk_size:
                _write_part(parts, _run_chunk(chunk, probe, model, scorer, mode, bar))
                chunk = []
        if chunk:
            _write_part(parts, _run_chunk(chunk, probe, model, scorer, mode, bar))
    return merge_if_complete(out, total)


def _run_chunk(chunk, probe: Probe, model: LoadedModel, scorer: Scorer, mode: str, bar):
    ids = [
        model.tokenizer.encode(model.render(messages), add_special_tokens=False)
        for _, _, messages in chunk
    ]
    results = list(scorer.score(ids, window=len(ids)))
    rows = []
    for (i, key, _), result in zip(chunk, results, strict=True):
        row = {INDEX: i, **key, **result.row(probe.answers)}
        rows.append({k: v for k, v in row.items() if not k.startswith("p::")})
    frame = pd.DataFrame(rows)
    if mode == "generate":
        responses = model.tokenizer.batch_decode(
            [r.generated for r in results], skip_special_tokens=True
        )
        frame["response"] = responses
        frame["parsed"] = [probe.parse(r) for r in responses]
    bar.update(len(chunk))
    return frame


def _write_part(parts: Path, frame: pd.DataFrame) -> None:
    path = parts / f"part-{int(frame[INDEX].iloc[0]):010d}.parquet"
    tmp = parts / f".{path.name}.tmp{os.getpid()}"
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


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
    tmp = out / f".scores.parquet.tmp{os.getpid()}"
    frame.reset_index(drop=True).to_parquet(tmp, index=False)
    os.replace(tmp, target)
    return target


def check_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest, or refuse to resume a directory that holds a different run."""
    path = out / "manifest.json"
    if path.is_file():
        old = json.loads(path.read_text())
        for key in RESUME_KEYS:
            if old.get(key) != manifest.get(key):
                raise ProbekitError(
                    f"{out} holds a run with a different {key} ({old.get(key)!r} vs "
                    f"{manifest.get(key)!r}); use another --out or delete it"
                )
        return
    tmp = out / f".manifest.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1, default=str))
    os.replace(tmp, path)
