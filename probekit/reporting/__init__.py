"""Pages a person reads: one self-contained `report.html` per run and one across runs, from the
run folders and the study -> report contract (`StudyReport`, which every study implements).

Names load on first use, so that a study module can import the contract's light types
(`probekit.reporting.contract`, `probekit.reporting.headline`) without jinja2 or matplotlib."""

from __future__ import annotations

import importlib
from typing import Any

_API = {
    "Headline": "probekit.reporting.headline",
    "ViewFacts": "probekit.reporting.headline",
    "RunFacts": "probekit.reporting.contract",
    "StudyCard": "probekit.reporting.contract",
    "StudyReport": "probekit.reporting.contract",
    "RunPage": "probekit.reporting.html",
    "load_run": "probekit.reporting.html",
    "run_page_html": "probekit.reporting.html",
    "runs_page_html": "probekit.reporting.html",
    "write_pages": "probekit.reporting.html",
    "write_run_page": "probekit.reporting.html",
    "write_runs_page": "probekit.reporting.html",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'probekit.reporting' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return __all__
