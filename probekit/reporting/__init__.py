"""Pages a person reads: one self-contained `report.html` per run and one across runs."""

from probekit.reporting.headline import Headline, ViewFacts
from probekit.reporting.html import (
    Run,
    load_run,
    run_page_html,
    runs_page_html,
    write_pages,
    write_run_page,
    write_runs_page,
)

__all__ = [
    "Headline",
    "Run",
    "ViewFacts",
    "load_run",
    "run_page_html",
    "runs_page_html",
    "write_pages",
    "write_run_page",
    "write_runs_page",
]
