"""`probekit capture STUDY`: the command line of `probekit.capture_study`
(`probekit.run.capture`)."""

from __future__ import annotations

from probekit.core.options import Command
from probekit.run.capture import capture_command, capture_parsed
from probekit.studies.base import Study


def command(study: Study) -> Command:
    """`probekit capture STUDY`'s options: the model's, the capture's and the study's."""
    return capture_command(study)


def execute(study: Study, parsed: tuple) -> None:
    capture_parsed(study, parsed)
