"""GenderBench's ISEAR probe (Pikuliak et al., genderbench==1.1.0), exact and generated: see
README.md."""

from __future__ import annotations

from typing import Any

from probekit.studies.isear.events import Event, load_events, sample_events
from probekit.studies.isear.probe import EMOTIONS, GENDERS, IsearProbe, make_item
from probekit.studies.isear.study import STUDY  # registers the study

__all__ = [
    "EMOTIONS",
    "GENDERS",
    "STUDY",
    "Event",
    "IsearProbe",
    "evaluate",
    "load_events",
    "locate_punkt",
    "make_item",
    "sample_events",
]


def __getattr__(name: str) -> Any:
    """`evaluate` and `locate_punkt` on first use: NLTK is slow to import."""
    if name in ("evaluate", "locate_punkt"):
        import probekit.studies.isear.evaluator as evaluator

        return getattr(evaluator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
