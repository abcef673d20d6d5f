"""Pages a person reads: one self-contained `report.html` per run and one across runs, from the
run folders and the study -> report contract (`StudyReport`, which every study implements).

Names load on first use, so that a study module can import the contract's light types
(`probekit.reporting.contract`, `probekit.reporting.headline`) without jinja2 or matplotlib."""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "probekit.reporting.headline": "Headline ViewFacts",
    "probekit.reporting.contract": "RunFacts StudyCard StudyReport",
    "probekit.reporting.html": "RunPage load_run run_page_html runs_page_html write_pages "
    "write_run_page write_runs_page",
}
_API = {name: module for module, names in _MODULES.items() for name in names.split()}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'probekit.reporting' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return __all__
