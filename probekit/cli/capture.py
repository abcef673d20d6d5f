"""`probekit capture STUDY`: the command line of `probekit.capture_study`
(`probekit.run.capture`)."""

from __future__ import annotations

from probekit.run.capture import capture_command, capture_parsed
from probekit.studies.base import Study

command = capture_command
"""`probekit capture STUDY`'s options: the model's, the capture's and the study's."""


def execute(study: Study, parsed: tuple) -> None:
    capture_parsed(study, parsed)
