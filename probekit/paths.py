"""Where probekit keeps its own files: the project's data folder and the per-user cache."""

import os
from pathlib import Path


def project_data_dir() -> Path:
    """The repository's `data/` folder (group definitions, templates, samples)."""
    return Path(__file__).resolve().parents[1] / "data"


def user_cache_dir() -> Path:
    """`$PROBEKIT_CACHE`, else `~/.cache/probekit`: converted models and downloaded data."""
    return Path(os.environ.get("PROBEKIT_CACHE") or Path.home() / ".cache" / "probekit")
