"""A run folder as one object (`RunDir`): its paths, its manifest (the only reader and writer of
`manifest.json`), its scores and summary, its shard locks, and the discovery of finished runs.

What a run was is its manifest. Every field of it that changes a number is a resume key:
resuming a folder whose manifest differs in one of them is refused in one line naming it. Only
the fields of `RECORDED_ONLY` (where the data or the command came from, versions, the noise
figure, report options) may differ; any other field is a resume key, a study's new option
included, so a new setting cannot be forgotten. `check_resume` takes the settings known before
the model loads (a field set to None is not known yet), so that most mismatches are refused
before any loading.

What rows were scored under travels with them: every part of a run and its `scores.parquet` carry
the run's resume keys (`scored_under`, in the Parquet metadata) and each row its prompt id, so a
row is reused only where both match the run asked for (`RowKey`), whatever the manifest beside
it says (a manifest can be deleted and written anew by another run).

The results format (`RESULTS_FORMAT`, in every manifest) names the layout of the scores table; a
folder of another format is not resumed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from probekit.core.errors import ProbekitError, named
from probekit.core.io import FileLock, LockHeld, write_error, write_text
from probekit.core.public import public

RESULTS_FORMAT = 4
MANIFEST = "manifest.json"
SCORES = "scores.parquet"
RECORDED_ONLY = frozenset(
    ("model_source", "prompts", "prompts_total", "numerics", "precision", "batch_size")
    + ("versions", "command", "data_origin", "data_path", "punkt_root", "min_valid_mass")
    + ("outlier_z", "groups", "responses", "vector_file", "alphas", "commit", "selection")
    + ("n_layers", "figures")
)
"""The manifest fields that are recorded, not resume keys: where the model was loaded from
(`model_source`), the prompts in the run and in the study's configuration (`prompts`,
`prompts_total`), the noise figure measured after the run (`numerics`), the precision tier with
its tolerance and measured errors (`precision`), the batch size as the run ended, package
versions, the command (or call) that ran it, where the data came from and its file
(`data_origin`, `data_path`), ISEAR's punkt tables (`punkt_root`), the report options
(`min_valid_mass`, JaEm-ST's `outlier_z` and `groups`), JaEm-ST's free responses generated
after the run, a steering vector file as given (`vector_file`: it is known by its content,
`vector_sha256`), the α's asked for (each α is a part of its own), the probekit commit
(`commit`), a capture's `selection` (study, seed, limit and its prompt ids' SHA-256: a
capture folder grows with its items), the model's `n_layers` (its weights decide it) and the
figures with their data files (`figures`).

Every other field is a resume key: `results_format`, `study`, `model` (as given), `weights`
(their fingerprint), `dtype`, `device` (its kind: its kernels' last digits), `device_map`,
`engine`, `columns` (which engine wrote which), `probe` (the prompts, answers and parse rule),
`view`, `epsilon`, `max_new_tokens`, `temperature`, `seed`, `limit`, `data_sha256`,
`tolerance`, `tier`, and the mechanism commands' `vector`, `vector_sha256`, `positions`,
`span`, `sites`, `layers`, `hooks` and `prompt_ids_sha256`."""


def resume_keys(manifest: dict[str, Any]) -> list[str]:
    """The fields of `manifest` that must match for a folder to be resumed."""
    return [key for key in manifest if key not in RECORDED_ONLY]


def _first_difference(key: str, old: Any, new: Any) -> tuple[str, Any, Any]:
    """Where `old` and `new` (the values of `key`) first differ: `probe.seed`, not the probe."""
    if isinstance(old, dict) and isinstance(new, dict):
        for sub in {**old, **new}:
            if old.get(sub) != new.get(sub):
                return _first_difference(f"{key}.{sub}", old.get(sub), new.get(sub))
    return key, old, new


SCORED_UNDER = b"probekit.settings"
"""The Parquet metadata key of the settings a table's rows were scored under (`scored_under`)."""


def scored_under(manifest: dict[str, Any]) -> dict[str, str]:
    """The settings that rows scored under `manifest` carry: each resume key's value as JSON
    text, or `sha256:<hex>` of that text when it is longer than 200 characters (a probe's list
    of events), so that a part's record stays small and still tells which setting differs."""
    settings = {}
    for key in sorted(resume_keys(manifest)):
        text = json.dumps(manifest[key], sort_keys=True, default=str)
        short = len(text) <= 200
        settings[key] = text if short else f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"
    return settings


def id_hashes(ids: Iterable[str]) -> np.ndarray:
    """A 64-bit hash of each prompt id (8 bytes a prompt, however long the id)."""
    digests = (hashlib.blake2b(str(i).encode(), digest_size=8).digest() for i in ids)
    return np.fromiter((int.from_bytes(d, "little") for d in digests), dtype=np.uint64)


@dataclass(frozen=True, eq=False)
class RowKey:
    """What a row must have been made under to be reused (`probekit.core.store`): the run's
    settings (`scored_under` of its manifest) and, at each prompt index, the prompt's id
    (`id_hashes`); `ids` None takes rows of any prompts (a capture folder grows with its items).
    `made` is how its rows were made, in messages ("scored", "captured", "generated")."""

    settings: dict[str, str]
    ids: np.ndarray | None
    made: str = "scored"

    @classmethod
    def of(
        cls, manifest: dict[str, Any], ids: Iterable[str] | None, made: str = "scored"
    ) -> RowKey:
        return cls(scored_under(manifest), None if ids is None else id_hashes(ids), made)

    def metadata(self) -> dict[bytes, bytes]:
        """The Parquet metadata that records these settings in a table."""
        return {SCORED_UNDER: json.dumps(self.settings, sort_keys=True).encode()}

    def locate(self, ids: Sequence[str]) -> np.ndarray:
        """The prompt index of each of `ids` (-1 where the key has no such prompt)."""
        hashes = id_hashes(ids)
        if np.array_equal(hashes, self.ids):
            return np.arange(len(hashes))
        return np.array([self._positions.get(int(h), -1) for h in hashes], dtype=np.int64)

    @cached_property
    def _positions(self) -> dict[int, int]:
        indexed = list(enumerate(self.ids.tolist()))  # type: ignore[union-attr]
        return {hashed: index for index, hashed in reversed(indexed)}  # a repeated id: its first

    def mismatch(
        self, metadata: dict[bytes, bytes] | None, indices: np.ndarray | None, ids: Sequence[str]
    ) -> str | None:
        """Why rows with prompt `ids` (at prompt `indices`, where the table records them), in a
        table of Parquet `metadata`, are not rows of this run (a phrase that follows "rows":
        "scored under another dtype ('float32', now 'bfloat16')"), or None when their settings
        and prompts are this run's."""
        stored = read_settings(metadata)
        if stored is None:
            return f"{self.made} under settings they do not record (written by an older probekit)"
        if differ := _difference(stored, self.settings):
            return f"{self.made} under another {differ[0]} ({differ[1]}, now {differ[2]})"
        if self.ids is None:
            return None
        rows = len(ids) if indices is None else len(indices)
        if rows and len(ids) != rows:
            return "without prompt ids (written by an older probekit)"
        if indices is None:
            unknown = np.flatnonzero(self.locate(ids) < 0)
            if unknown.size:
                return f"of other prompts (prompt id {ids[int(unknown[0])]!r} is not this run's)"
            return None
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self.ids)):
            return f"of prompt indices this run of {len(self.ids)} prompts does not have"
        differ = np.flatnonzero(self.ids[indices] != id_hashes(ids))
        if differ.size:
            return f"of other prompts (prompt {int(indices[differ[0]])} has another id)"
        return None


def read_settings(metadata: dict[bytes, bytes] | None) -> dict[str, str] | None:
    """The settings recorded in a table's Parquet metadata, None when it records none."""
    try:
        settings = json.loads((metadata or {})[SCORED_UNDER])
    except (KeyError, ValueError):
        return None
    return settings if isinstance(settings, dict) else None


def _difference(a: dict[str, str], b: dict[str, str]) -> tuple[str, str, str] | None:
    """The first setting in which `a` and `b` differ, with both values as shown, or None."""
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return key, _shown(a.get(key)), _shown(b.get(key))
    return None


def _shown(text: str | None) -> str:
    if text is None:
        return "not set"
    if text.startswith("sha256:"):
        return f"sha256 {text[7:19]}"
    try:
        return repr(json.loads(text))
    except ValueError:
        return repr(text)


def device_kind(device: Any) -> str | None:
    """`cuda:1` -> `cuda`: the kind of device, which decides the kernels (None stays None)."""
    return None if device is None else str(device).split(":")[0]


@public()
class RunDir:
    """One run folder: `manifest.json`, `parts/`, `scores.parquet`, `summary.csv`,
    `report.html`, and `.lock-shard-<i>-of-<n>` while a shard runs."""

    _locks: dict[tuple[Path, int, int], FileLock] = {}  # held by this process, per shard

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.manifest_path = self.path / MANIFEST
        self.scores_path = self.path / SCORES
        self.report_path = self.path / "report.html"

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and self.path.resolve() == other.path.resolve()

    def __hash__(self) -> int:
        return hash(self.path.resolve())

    # ------------------------------------------------------------------ manifest

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest, None if the folder has none; one line if it is damaged."""
        path = self.manifest_path
        if not path.is_file():
            return None
        try:
            manifest: Any = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            manifest = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        except OSError as exc:
            raise ProbekitError(f"cannot read {path}: {exc.strerror}") from None
        if not isinstance(manifest, dict):
            why = manifest if isinstance(manifest, str) else "not a JSON object"
            raise ProbekitError(
                f"{path} is damaged ({why}), so the parts beside it cannot be matched to this "
                f"run: if {self.path} holds this same run, delete {path.name} and run again to "
                f"resume it; otherwise give another {named('out')} or delete the folder"
            )
        return manifest

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest of a run that has one; a folder without one is refused in one line."""
        manifest = self.read_manifest()
        if manifest is None:
            raise ProbekitError(f"{self.path} holds no {MANIFEST}: not a finished run")
        return manifest

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Write `manifest` (atomically)."""
        write_text(self.manifest_path, json.dumps(manifest, indent=1, default=str))

    def update_manifest(self, **fields: Any) -> dict[str, Any]:
        """Set `fields` in the stored manifest (e.g. the noise figure); return it."""
        manifest = {**self.manifest, **fields}
        self.write_manifest(manifest)
        return manifest

    def check_resume(
        self, manifest: dict[str, Any], unknown: Collection[str] = (), option: str = "out"
    ) -> None:
        """Refuse, in one line naming the setting (and the `option` that names the folder), to
        resume a folder whose run differs from `manifest` in a resume key; the fields `unknown`
        (not known before the model loads) are not compared, and nothing is when the folder
        holds no run."""
        old = self.read_manifest()
        if old is None:
            return
        fmt = old.get("results_format", 1)
        if fmt != RESULTS_FORMAT:
            raise ProbekitError(
                f"{self.path} holds a run in results format {fmt}, this probekit writes format "
                f"{RESULTS_FORMAT}; it can still be reported (probekit report), not resumed: use "
                f"another {named(option)}, or delete the folder to run it again"
            )
        keys = resume_keys({**old, **manifest})  # a setting (seed) named before a probe's
        for key in sorted(keys, key=lambda k: isinstance(manifest.get(k), dict)):
            new = manifest.get(key)
            if key in unknown or old.get(key) == new:
                continue
            what = (
                f"a run of an earlier probekit, which did not record its {key} (now {new!r})"
                if key not in old
                else "a run with a different {} ({!r}, now {!r})".format(
                    *_first_difference(key, old[key], new)
                )
            )
            raise ProbekitError(
                f"{self.path} holds {what}; use another {named(option)}, or delete the folder to "
                "run it again"
            )

    def start(self, manifest: dict[str, Any]) -> None:
        """Write `manifest` into a new run folder, or check it against the run the folder
        holds (`check_resume`)."""
        if self.read_manifest() is None:
            self.write_manifest(manifest)
        else:
            self.check_resume(manifest)

    # ------------------------------------------------------------------ results

    def scores(self) -> pd.DataFrame:
        """`scores.parquet`; one line when its rows record settings other than the manifest's (a
        manifest edited, or written anew beside them)."""
        if not self.scores_path.is_file():
            raise ProbekitError(f"{self.path} holds no {SCORES}: the run is not finished")
        manifest = self.read_manifest() or {}
        recorded = read_settings(pq.read_schema(self.scores_path).metadata)
        differ = _difference(recorded, scored_under(manifest)) if recorded and manifest else None
        if differ is not None:
            key, rows, says = differ
            held = f"that record no {key}" if rows == "not set" else f"scored under {key} {rows}"
            says = f"records no {key}" if says == "not set" else f"says {says}"
            raise ProbekitError(
                f"{self.scores_path} holds rows {held}, but {MANIFEST} {says}: if the "
                f"rows are this run's, delete {MANIFEST} and run the same command again (rows "
                "are reused only where they match it); otherwise delete the folder"
            )
        return pd.read_parquet(self.scores_path)

    def summary(self) -> pd.DataFrame | None:
        """`summary.csv`, None if the folder has none."""
        path = self.path / "summary.csv"
        return pd.read_csv(path) if path.is_file() else None

    @classmethod
    @public()
    def discover(cls, folder: str | Path) -> list[RunDir]:
        """Every finished run under `folder` (itself included), sorted by path."""
        found = sorted(p.parent for p in Path(folder).rglob(MANIFEST))
        return [cls(p) for p in found if (p / SCORES).is_file()]

    # ------------------------------------------------------------------ locks

    def hold(self, index: int, count: int) -> None:
        """Take the lock of shard `index`/`count` for this process (kept until `release` or
        the process ends; taking it again is a no-op). One line naming the holder if another
        process runs the same shard."""
        key = (self.path.resolve(), index, count)
        if key in self._locks:
            return
        lock = FileLock(self.path / f".lock-shard-{index}-of-{count}")
        try:
            lock.__enter__()
        except LockHeld as held:
            raise ProbekitError(
                f"shard {index}/{count} of the run in {self.path} is already running "
                f"({held}); wait for it or stop it (a lock left by a process that has died "
                f"on this host is taken over; one from another host: delete {lock.path})"
            ) from None
        self._locks[key] = lock

    def release(self, index: int, count: int) -> None:
        lock = self._locks.pop((self.path.resolve(), index, count), None)
        if lock is not None:
            lock.__exit__(None, None, None)

    @classmethod
    def release_all(cls) -> list[Path]:
        """Release every shard lock this process holds (on SIGTERM); return their folders."""
        for lock in cls._locks.values():
            lock.__exit__(None, None, None)
        folders = [path for path, _, _ in cls._locks]
        cls._locks.clear()
        return folders

    def make(self) -> None:
        """Create the folder and its parts folder (one line if it cannot be)."""
        parts = self.path / "parts"
        try:
            parts.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_error(parts, exc) from None
