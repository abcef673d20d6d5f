"""`probekit score` (`probekit.score_file`): the prompts of a JSONL file scored on the one run
loop (`probekit.run.loop.run_rows`), so that nothing scored is lost mid-stream.

The rows go, as they are scored, into parts in a run folder beside the target (`<stem>.parts/`:
a manifest and `parts/`, as a study run's); once every prompt has a row they are written to the
scores file and the folder removed. Stopped by an error or a kill, the same command resumes from
the parts and scores only the prompts without a row; run with other inputs (another prompts
file, answers, prefill, epsilon or model) on that folder, it is refused in one line.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from probekit import engines
from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError, named
from probekit.core.io import ParquetStream, check_writable, row_bytes
from probekit.core.items import PROMPT_ID, Item
from probekit.core.paths import file_sha256
from probekit.core.progress import silenced
from probekit.core.prompts import read_prompts
from probekit.core.public import public
from probekit.core.rundir import RESULTS_FORMAT, RunDir
from probekit.core.signal import prefill_trap, weak_signal
from probekit.core.store import INDEX, row_groups
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions, ScoreOptions, loaded_engine
from probekit.engines.score import settle_and_say
from probekit.run.loop import run_rows
from probekit.run.parts import part_files
from probekit.run.scoring import Scoring, local_scoring
from probekit.studies.base import Probe

WINDOW = 4096
"""The first prompts, on which a model whose precision tier is not chosen yet gets it."""
PRECISION_KEY = b"probekit.precision"
"""The Parquet metadata key of the precision record in `probekit score`'s output (JSON)."""
LOADED = ("engine", "weights", "device", "dtype", "device_map")
"""The manifest fields of the model that only loading it gives."""


class PromptsFile(Probe):
    """The prompts of a JSONL file as the run loop's probe: `probekit score`'s rows."""

    key_columns = ()

    def __init__(self, path: Path, prefill: str, answers: AnswerSet) -> None:
        self.path, self.prefill, self.answers, self.name = path, prefill, answers, "score"

    def items(self) -> Iterator[Item]:
        return read_prompts(self.path, self.prefill)

    def parse(self, response: str) -> Any:
        return response  # the exact view only: nothing is generated

    def config(self) -> dict[str, Any]:
        return {"answers": [str(a) for a in self.answers.answers], "prefill": self.prefill}


@public(ScoreOptions, ModelOptions, skip=("model",))
def score_file(
    model: str | Path | Engine,
    prompts: str | Path,
    scores: str | Path,
    answers: AnswerSet | str | Sequence[str | float],
    *,
    epsilon: float = 1e-4,
    prefill: str = "",
    batch_size: int | None = None,
    quiet: bool = False,
    **load: Any,
) -> Path:
    """`probekit score` as a function: the prompts of a JSONL file (`{"id", "messages"}` or
    `{"id", "text"}` a line) scored as `probekit.score` scores them, the columns of `score`,
    written to the Parquet file `scores` (it appears whole or not at all). Every line is checked
    before the model loads, and the disk's room for the rows.

    The rows are kept as they are scored, in parts in `<stem>.parts/` beside `scores`: stopped
    (an error, a kill), the same call goes on from them, scoring only the prompts without a row;
    other inputs on that folder are refused in one line.

    `model`: a loaded model, or a spec loaded with `load` (`load_engine`'s keywords: `device`,
    `dtype`, ...). The tier the rows were scored in is said on stderr and recorded in the file's
    metadata (`PRECISION_KEY`, JSON). A prefill ending in whitespace and a mean valid mass below
    `WEAK_SIGNAL_VALID_MASS` are warned about (`warnings.warn`). Returns `scores`.

    Args:
        load: `load_engine`'s keywords for a model spec."""
    if trap := prefill_trap(prefill):
        warnings.warn(trap, UserWarning, stacklevel=3)  # the caller of @public
    scores, prompts = Path(scores), Path(prompts)
    if scores.resolve() == prompts.resolve():  # links followed
        raise ProbekitError(
            f"{named('scores')} {scores} is the prompts file {prompts}: the scores would "
            "replace the prompts; give another file"
        )
    loaded = loaded_engine(model, **load)  # load options refused with a loaded model
    total = sum(1 for _ in read_prompts(prompts))  # every line checked before any work
    if total == 0:
        raise ProbekitError(f"prompt file '{prompts}' has no prompts")
    probe = PromptsFile(prompts, prefill, answers)
    check_scores_file(scores, total, len(probe.answers.answers))
    folder = RunDir(scores.with_name(f"{scores.stem}.parts"))  # its rows while they are scored
    manifest = {
        "results_format": RESULTS_FORMAT,
        "model": loaded.describe()["model"] if loaded else str(model),
        "probe": probe.config(),
        "epsilon": epsilon,
        "data_sha256": file_sha256(prompts),
        **{key: str(value) for key, value in load.items() if value is not None},
    }
    folder.check_resume(manifest, LOADED, option="scores")  # before the model loads
    given = {key: value for key, value in load.items() if value is not None}
    engine = loaded or engines.load_engine(model, **given)
    described = engine.describe()
    manifest |= {key: described[key] for key in LOADED if key in described}
    folder.check_resume(manifest, option="scores")

    def start() -> Scoring:
        first = [engine.encode(item).input_ids for item in islice(probe.items(), WINDOW)]
        settle_and_say(engine, probe.answers, first)
        return local_scoring(probe, engine, "exact", epsilon=epsilon, batch_size=batch_size, seed=0)

    with silenced(quiet):
        try:
            merged = run_rows(probe, folder.path, {"command": "score", **manifest}, start)
        except Exception as exc:
            raise stopped(exc, folder.path, total) from None
    if merged is None:
        raise ProbekitError(f"{folder.path}: rows are missing; run the same command again")
    masses = write_scores(merged, scores, engine.precision)
    shutil.rmtree(folder.path, ignore_errors=True)
    if weak := weak_signal(sum(masses) / len(masses)):
        warnings.warn(weak, UserWarning, stacklevel=3)
    return scores


def check_scores_file(scores: str | Path, rows: int = 0, answers: int = 0) -> None:
    """Before any work: refuse, in one line naming it, a `scores` file that cannot be written (a
    folder there, its folder not writable or under a file, or its disk short of the `rows` of
    `answers` probabilities three times: as parts, merged, and the file)."""
    check_writable(Path(scores).parent, "scores", 3 * rows * row_bytes(answers))
    if Path(scores).is_dir():
        raise ProbekitError(f"{named('scores')} {scores} is a folder; give the file to write")


def stopped(exc: Exception, folder: Path, total: int) -> Exception:
    """`exc` with where the rows scored before it are kept and how to finish: a ProbekitError
    stays one line; any other error keeps its traceback, with a note."""
    done = sum(pq.read_metadata(path).num_rows for path in part_files(folder))
    kept = f"the {done} of {total} rows scored are kept in {folder}: run the same command to finish"
    if not done:
        return exc
    if isinstance(exc, ProbekitError):
        return type(exc)(f"{exc.marked}; {kept}")
    exc.add_note(kept)
    return exc


def write_scores(merged: Path, scores: Path, precision: dict[str, Any] | None) -> list[float]:
    """The merged rows written to `scores` in the columns of `probekit.score` (`id` first, the
    prompt index dropped), row group by row group; their valid masses."""
    masses: list[float] = []
    record = {PRECISION_KEY: json.dumps(precision, default=str).encode()}
    with ParquetStream(scores) as stream:
        for table in row_groups(merged):
            frame = table.to_pandas().drop(columns=INDEX).rename(columns={PROMPT_ID: "id"})
            stream.write(frame.reset_index(drop=True), record)
            masses += frame["valid_mass"].tolist()
    return masses
