"""Where GIEBench items come from: the official prompt files, probekit's own item records, and
the published edge cases (a reader test: the file is not valid JSON as published).

Official files (`Raw-Prompt.json`, `ID-Prompt.json`, `COT-Prompt.json`) map an item id to
`{"prompt", "correct": "A".."D", "category", ...}`; the same id links the three files. They are
read from a folder (`--items DIR`), else from `$PROBEKIT_DATA/giebench/data/` or the user cache,
else downloaded from the benchmark's pinned commit and checked against their git blob SHA-1s.
Records (`--items FILE`) hold a category, an identity, a question, four answers and the index of
the correct one; the three prompt types are built from them (`judge.build_prompt`).
"""

from __future__ import annotations

import hashlib
import http.client
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.io import atomic_write
from probekit.core.options import given
from probekit.core.paths import package_path, user_cache_dir
from probekit.core.text import read_json
from probekit.datasets.locate import ENV_VAR, fetch_url, source_url
from probekit.studies.giebench.judge import OPTIONS

FILES = {"raw": "Raw-Prompt.json", "id": "ID-Prompt.json", "cot": "COT-Prompt.json"}
OFFICIAL_DIR = "giebench/data"  # under a data root, as in the benchmark's repository
BLOB_SHA1 = {  # git blob SHA-1 of each file at commit 09199c926233e09b080b441599780a9387c3bce5
    "COT-Prompt.json": "632a1f2db5ff83811dd68aa4c4af88a80ac3fe9f",
    "ID-Prompt.json": "35d06516241d9f0db963b9cca48ce8a3444977e7",
    "Raw-Prompt.json": "cf323ef4fcb62c03dfcfcd3269dde749a47abe04",
}
CATEGORY_SPELLINGS = {"Orentation": "Orientation"}  # the repository's spelling -> ours
SAMPLE_FILE = package_path("probekit.studies.giebench", "sample_records.json")
EDGE_ANSWER_KEYS = ("assistant_1(correct)", "assistant_2", "assistant_3", "assistant_4")


@dataclass(frozen=True)
class Record:
    """An item written as parts, from which every prompt type is built."""

    id: str
    category: str
    identity: str | None
    question: str
    answers: tuple[str, ...]
    correct: int  # index of the identity-aligned answer in `answers`


@dataclass(frozen=True)
class OfficialItem:
    """An item of the official files: one complete prompt per prompt type."""

    id: str
    category: str
    correct: str  # letter
    prompts: dict[str, str]


Unit = Record | OfficialItem


def git_blob_sha1(data: bytes) -> str:
    """The SHA-1 git gives a file with these bytes (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def category_name(name: str) -> str:
    """A category as probekit spells it (the repository writes `Orentation`)."""
    return CATEGORY_SPELLINGS.get(name, name)


def _fields(row: Any, keys: Sequence[str], path: Path, item_id: str) -> None:
    """Refuse in one line a `row` that is not a JSON object holding every one of `keys`."""
    if not isinstance(row, dict):
        raise ProbekitError(f"{path}: item {item_id!r} is not a JSON object")
    missing = [key for key in keys if key not in row]
    if missing:
        raise ProbekitError(f"{path}: item {item_id!r} has no '{missing[0]}'")


# ---------------------------------------------------------------------- records
def read_records(path: Path) -> list[Record]:
    """Records from a JSON file: `{"records": [...]}`, a list of records, or the published edge
    cases' layout (category -> user question and four answers, the correct one first)."""
    data = read_json(path)
    if isinstance(data, dict) and "records" in data:
        data = data["records"]
    if isinstance(data, dict):
        records = []
        for name, row in data.items():
            _fields(row, ("user", *EDGE_ANSWER_KEYS), path, name)
            answers = tuple(str(row[k]) for k in EDGE_ANSWER_KEYS)
            records.append(Record(name, category_name(name), None, str(row["user"]), answers, 0))
        return records
    if not isinstance(data, list) or not data:
        raise ProbekitError(f"{path}: expected a non-empty list of item records")
    records = [_record(row, path, k) for k, row in enumerate(data)]
    twice = [item_id for item_id, count in Counter(r.id for r in records).items() if count > 1]
    if twice:
        raise ProbekitError(f"{path}: item id {twice[0]!r} occurs twice")
    return records


def _record(row: Any, path: Path, k: int) -> Record:
    if not isinstance(row, dict):
        raise ProbekitError(f"{path}: record {k} is not a JSON object")
    item_id = str(row.get("id", k))
    _fields(row, ("category", "question", "answers", "correct"), path, item_id)
    answers, correct = row["answers"], row["correct"]
    if (
        not isinstance(answers, list)
        or len(answers) != 4
        or not all(isinstance(a, str) and a for a in answers)
    ):
        raise ProbekitError(f"{path}: item {item_id!r} needs exactly four non-empty answers")
    if isinstance(correct, bool) or correct not in range(4):
        raise ProbekitError(
            f"{path}: item {item_id!r} has correct={correct!r}; give the index 0-3 of the answer"
        )
    category, question = category_name(str(row["category"])), str(row["question"])
    return Record(item_id, category, row.get("identity") or None, question, tuple(answers), correct)


# ---------------------------------------------------------------------- official files
def read_official(folder: Path, prompt_types: Sequence[str]) -> list[OfficialItem]:
    """The items of the official files of `prompt_types` in `folder`, in the first file's order;
    every file must hold the same ids, with the same correct letter and category."""
    tables = {t: _official_table(folder, FILES[t]) for t in prompt_types}
    first = FILES[prompt_types[0]]
    items = tables[prompt_types[0]]
    for prompt_type, table in tables.items():
        if {i: row[:2] for i, row in table.items()} != {i: row[:2] for i, row in items.items()}:
            raise ProbekitError(
                f"{folder / FILES[prompt_type]}: its item ids, categories or correct answers "
                f"differ from {first}'s"
            )
    return [
        OfficialItem(item_id, category, correct, {t: tables[t][item_id][2] for t in tables})
        for item_id, (category, correct, _) in items.items()
    ]


def _official_table(folder: Path, name: str) -> dict[str, tuple[str, str, str]]:
    """Item id -> (category, correct letter, prompt) of one official file in `folder`."""
    path = folder / name
    if not path.is_file():
        raise ProbekitError(f"{folder} has no {name}")
    data = read_json(path)
    if not isinstance(data, dict) or not data:
        raise ProbekitError(f"{path}: expected a JSON object mapping item ids to items")
    for item_id, row in data.items():
        _fields(row, ("prompt", "correct", "category"), path, item_id)
        if row["correct"] not in OPTIONS:
            raise ProbekitError(
                f"{path}: item {item_id!r} has correct={row['correct']!r}, not one of A-D"
            )
    return {
        str(i): (category_name(str(row["category"])), row["correct"], str(row["prompt"]))
        for i, row in data.items()
    }


def check_blob(path: Path, data: bytes) -> None:
    """Refuse bytes of an official file whose git blob SHA-1 is not the pinned one."""
    expected = BLOB_SHA1[path.name]
    found = git_blob_sha1(data)
    if found != expected:
        raise ProbekitError(
            f"{path} has git blob SHA-1 {found}, expected {expected} (GIEBench at the pinned "
            "commit); the source changed or the transfer was corrupted"
        )


def download_official(
    cache: Path, prompt_types: Sequence[str], fetch: Callable[[str], bytes] = fetch_url
) -> Path:
    """Fetch the missing official files into `cache/giebench/data/`, each checked before it is
    put in place; return that folder."""
    folder = cache / OFFICIAL_DIR
    for prompt_type in prompt_types:
        target = folder / FILES[prompt_type]
        if target.is_file():
            continue
        url = source_url(f"{OFFICIAL_DIR}/{FILES[prompt_type]}")
        data = fetch(url)
        check_blob(Path(url.rsplit("/", 1)[-1]), data)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(target, lambda tmp, data=data: tmp.write_bytes(data))
    return folder


def resolve_items(
    spec: str | None,
    prompt_types: Sequence[str],
    say: Callable[[str], None],
    fetch: Callable[[str], bytes] = fetch_url,
) -> tuple[list[Unit], dict[str, str]]:
    """The items `--items` names: `sample`, a records file, or a folder of official files; by
    default the official files (data root, cache or download), else the project's sample. Says
    where they came from; returns them with the manifest's `data_origin` and `data_path`."""
    origin, path, message = "official", SAMPLE_FILE, ""
    if spec == "sample":
        origin = "sample"
    elif spec is not None:
        path = Path(spec).expanduser()
        if not path.is_file() and not path.is_dir():
            raise ProbekitError(f"{given('items', spec)}: no such file or folder")
        origin = "records" if path.is_file() else "official"
    else:
        cache = user_cache_dir() / "data"
        roots = [Path(os.environ[ENV_VAR]).expanduser()] if os.environ.get(ENV_VAR) else []
        folders = [root / OFFICIAL_DIR for root in [*roots, cache]]
        found = [f for f in folders if all((f / FILES[t]).is_file() for t in prompt_types)]
        try:
            path = found[0] if found else download_official(cache, prompt_types, fetch)
        except (OSError, http.client.HTTPException) as err:
            origin, path = "sample", SAMPLE_FILE
            message = (
                f"the GIEBench prompt files are not here and could not be downloaded ({err}); "
                "using probekit's own sample records, which are NOT GIEBench (pass "
                f"{given('items', 'DIR', placeholder=True)} for them)"
            )
        for file in [path / FILES[t] for t in prompt_types] if found else []:
            check_blob(file, file.read_bytes())
    units = read_official(path, prompt_types) if origin == "official" else read_records(path)
    if origin == "sample":
        say("items: probekit's own sample records (NOT GIEBench). " + message)
    else:
        say(f"items: {origin} from {path}")
    return list(units), {"data_origin": origin, "data_path": str(path)}
