"""`probekit lens STUDY`: the command line of `probekit.lens_study` (`probekit.run.lens`)."""

from __future__ import annotations

import time

from probekit.core.options import Command
from probekit.run.lens import lens_command, lens_parsed
from probekit.studies.base import Study


def command(study: Study) -> Command:
    """`probekit lens STUDY`'s options: the model's, the lens's and the study's."""
    return lens_command(study)


def execute(study: Study, parsed: tuple) -> None:
    start = time.monotonic()
    result = lens_parsed(study, parsed)
    print(f"wrote {result.path}/lens.parquet, summary.csv, lens.png, report.html")
    print(f"wall time {time.monotonic() - start:.0f} s")
