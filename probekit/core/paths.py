"""Where probekit keeps its own files: data shipped inside the package and the per-user cache."""

import hashlib
import os
from importlib.resources import files
from pathlib import Path

from probekit.core.errors import ProbekitError


def package_path(package: str, *parts: str) -> Path:
    """A file or folder shipped inside `package` (e.g. a study definition), as a real path.

    Read with `importlib.resources`, so it works from a checkout, an editable install and a
    wheel alike; a zipped install (no real files) is refused with one line.
    """
    resource = files(package).joinpath(*parts)
    path = Path(str(resource))
    if not path.exists():
        raise ProbekitError(
            f"{'/'.join(parts)} is missing from the installed package {package}; reinstall probekit"
        )
    return path


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
