"""`probekit steer STUDY`: the command line of `probekit.steer_study` (`probekit.run.steer`)."""

from __future__ import annotations

import time

from probekit.core.options import Command
from probekit.run.steer import steer_command, steer_parsed
from probekit.studies.base import Study


def command(study: Study) -> Command:
    """`probekit steer STUDY`'s options: the model's, the steering's and the study's."""
    return steer_command(study)


def execute(study: Study, parsed: tuple) -> None:
    start = time.monotonic()
    result = steer_parsed(study, parsed)
    print(f"wrote {result.path}/steer.parquet, summary.csv, steer.png, report.html")
    print(f"wall time {time.monotonic() - start:.0f} s")
