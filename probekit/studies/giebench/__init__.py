"""GIEBench (group-identity-based empathy verdicts over four answers): see README.md."""

from probekit.studies.giebench.judge import (
    PROMPT_TYPES,
    build_prompt,
    extract_verdict,
    reorder_prompt,
)
from probekit.studies.giebench.probe import GIEBenchProbe
from probekit.studies.giebench.sources import read_official, read_records, resolve_items

__all__ = [
    "PROMPT_TYPES",
    "GIEBenchProbe",
    "build_prompt",
    "extract_verdict",
    "read_official",
    "read_records",
    "reorder_prompt",
    "resolve_items",
]

from probekit.studies.giebench.study import STUDY  # noqa: E402  (registers the study)

__all__ += ["STUDY"]
