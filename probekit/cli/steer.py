"""`probekit steer STUDY`: the command line of `probekit.steer_study` (`probekit.run.steer`)."""

from __future__ import annotations

from probekit.cli.main import timed
from probekit.run.steer import steer_command, steer_parsed
from probekit.studies.base import Study

command = steer_command
"""`probekit steer STUDY`'s options: the model's, the steering's and the study's."""


@timed
def execute(study: Study, parsed: tuple) -> str:
    """The command's work on the parsed options; what it wrote (printed by `timed`)."""
    result = steer_parsed(study, parsed)
    return f"{result.path}/steer.parquet, summary.csv, steer.png, report.html"
