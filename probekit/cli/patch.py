"""`probekit patch STUDY`: the command line of `probekit.patch_study` (`probekit.run.patch`)."""

from __future__ import annotations

import time

from probekit.core.options import Command
from probekit.run.patch import patch_command, patch_parsed
from probekit.studies.base import Study


def command(study: Study) -> Command:
    """`probekit patch STUDY`'s options: the model's, the patch's and the study's."""
    return patch_command(study)


def execute(study: Study, parsed: tuple) -> None:
    start = time.monotonic()
    written = patch_parsed(study, parsed)
    print(f"wrote {parsed[1].out}/{', '.join(written)}")
    print(f"wall time {time.monotonic() - start:.0f} s")
