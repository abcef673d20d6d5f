"""`probekit patch STUDY`: the command line of `probekit.patch_study` (`probekit.run.patch`)."""

from __future__ import annotations

from probekit.cli.main import timed
from probekit.run.patch import patch_command, patch_parsed
from probekit.studies.base import Study

command = patch_command
"""`probekit patch STUDY`'s options: the model's, the patch's and the study's."""


@timed
def execute(study: Study, parsed: tuple) -> str:
    """The command's work on the parsed options; what it wrote (printed by `timed`)."""
    written = patch_parsed(study, parsed)
    return f"{parsed[1].out}/{', '.join(written)}"
