"""crowd-enVent emotion events (Troiano et al. 2023), as prepared by Hou et al. (NAACL 2025).

A data root holds `crowd-enVent/crowd-enVent_<emotion>.tsv`, one file per emotion, tab-separated
with a header. They are read as the authors read them, with pandas' default CSV quoting: a field
that starts with a double quote is a quoted field, `""` inside it one quote (event 40 reads
`My partner accused me of "not pulling my weight"`, not the file's escaped form).

Every row is checked before it is used (`read_rows`): a row with another number of fields than
the header, an empty id, emotion or text field, or a file that ends mid-row (every file ends with
a line end) is refused with its file and line, so that a truncated copy never reaches a model.
"""

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.options import option_error
from probekit.core.paths import package_path
from probekit.core.text import read_text
from probekit.datasets.locate import Dataset

_ORDER = "anger disgust fear guilt sadness shame boredom joy pride trust relief surprise"
EMOTIONS = tuple(_ORDER.split())
"""The 12 emotions, in the order of the authors' files."""
FILES: tuple[str, ...] = tuple(f"crowd-enVent/crowd-enVent_{e}.tsv" for e in EMOTIONS)
TEXT_COLUMNS = ("generated_text", "first_person_text", "third_person_text")
COLUMNS = ("emotion", "text_id", *TEXT_COLUMNS)
SAMPLE_ROOT = package_path("probekit.datasets", "samples")
CROWD_ENVENT = Dataset("crowd-enVent", FILES, SAMPLE_ROOT)


def read_rows(path: Path, emotion: str) -> pd.DataFrame:
    """The `COLUMNS` of the TSV file `path`, every row checked first: a missing file, a header
    without a column of `COLUMNS`, a file cut mid-row, a row whose field count is not the
    header's, an empty value in a column of `COLUMNS` or another emotion than `emotion` is
    refused in one line naming the file and line. Blank lines are skipped, as pandas does."""
    if not path.is_file():
        raise ProbekitError(
            f"{path} is missing; a crowd-enVent root needs crowd-enVent_<emotion>.tsv for all "
            f"12 emotions: {', '.join(EMOTIONS)}"
        )
    text = read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t")
    header = next(reader, [])
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ProbekitError(
            f"{path} lacks the column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}"
        )
    if not text.endswith("\n"):
        raise ProbekitError(
            f"{path}:{text.count(chr(10)) + 1}: the file ends mid-row (no line end after its "
            "last row), so it was cut short; get a complete copy (or end a complete last row "
            "with a line end)"
        )
    required = [(header.index(c), c) for c in COLUMNS]
    rows, start = [], reader.line_num + 1
    for row in reader:
        where = f"{path}:{start}"
        start = reader.line_num + 1
        if not row:
            continue
        if len(row) != len(header):
            raise ProbekitError(
                f"{where}: {len(row)} tab-separated fields, the header has {len(header)}; the row "
                "is cut short or holds a stray tab"
            )
        empty = [name for at, name in required if not row[at].strip()]
        if empty:
            raise ProbekitError(f"{where}: the field {empty[0]} is empty; every event needs it")
        rows.append([row[at] for at, _ in required])
    frame = pd.DataFrame(rows, columns=list(COLUMNS), dtype=str)
    if (frame["emotion"] != emotion).any():
        raise ProbekitError(f"{path} has rows whose emotion is not {emotion!r}")
    return frame


def load_crowd_envent(root: str | Path) -> pd.DataFrame:
    """All events under `root`, in emotion order then file order.

    Columns: `event_id` (the crowd-enVent `text_id`, unique across the 12 files), `emotion` and
    the three text columns.
    """
    root = Path(root)
    events = pd.concat(
        [read_rows(root / rel, emotion) for emotion, rel in zip(EMOTIONS, FILES, strict=True)],
        ignore_index=True,
    )
    duplicated = events["text_id"].duplicated()
    if duplicated.any():
        raise ProbekitError(
            f"text_id {events['text_id'][duplicated].iloc[0]} occurs twice under {root}; "
            "crowd-enVent ids must be unique across the 12 files"
        )
    return events.rename(columns={"text_id": "event_id"})[["event_id", "emotion", *TEXT_COLUMNS]]


def sample_events(df: pd.DataFrame, per_emotion: int | None, seed: int) -> pd.DataFrame:
    """`per_emotion` events of every emotion, drawn with `seed`, in the order of `df`.

    Each emotion draws from its own stream seeded by (seed, emotion), so a smaller sample is a
    subset of a larger one and does not depend on the other emotions. None keeps every event.
    """
    if per_emotion is None:
        return df.reset_index(drop=True)
    counts = df.groupby("emotion", sort=False).size()
    if per_emotion < 1:
        raise option_error("events", f"must be at least 1 (got {per_emotion})")
    if per_emotion > counts.min():
        raise option_error(
            "events",
            f"must be at most {counts.min()}, the events of {counts.idxmin()!r}, or all (got "
            f"{per_emotion})",
        )
    emotions = df["emotion"].to_numpy()
    keep = []
    for emotion in counts.index:
        rng = np.random.default_rng([seed, *emotion.encode()])
        rows = np.flatnonzero(emotions == emotion)
        keep.append(rows[rng.permutation(len(rows))[:per_emotion]])
    return df.iloc[np.sort(np.concatenate(keep))].reset_index(drop=True)


def first_events(root: str | Path, count: int, seed: int) -> pd.DataFrame:
    """The first `count` of one event per emotion (seeded) from the data root `root` (at most
    12): a few events of different emotions, as tests read them."""
    return sample_events(load_crowd_envent(root), per_emotion=1, seed=seed).head(count)
