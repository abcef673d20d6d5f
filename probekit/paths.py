"""Where probekit keeps its own files: the project's data folder and the per-user cache."""

import hashlib
import os
from pathlib import Path


def project_data_dir() -> Path:
    """The repository's `data/` folder (group definitions, templates, samples)."""
    return Path(__file__).resolve().parents[1] / "data"


def user_cache_dir() -> Path:
    """`$PROBEKIT_CACHE`, else `~/.cache/probekit`: converted models and downloaded data."""
    return Path(os.environ.get("PROBEKIT_CACHE") or Path.home() / ".cache" / "probekit")


def file_sha256(path: Path) -> str:
    """The hex sha256 of one file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
