"""`probekit lens STUDY`: the command line of `probekit.lens_study` (`probekit.run.lens`)."""

from __future__ import annotations

from probekit.cli.main import timed
from probekit.run.lens import lens_command, lens_parsed
from probekit.studies.base import Study

command = lens_command
"""`probekit lens STUDY`'s options: the model's, the lens's and the study's."""


@timed
def execute(study: Study, parsed: tuple) -> str:
    """The command's work on the parsed options; what it wrote (printed by `timed`)."""
    result = lens_parsed(study, parsed)
    return f"{result.path}/lens.parquet, summary.csv, lens.png, report.html"
