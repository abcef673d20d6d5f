"""`probekit capture STUDY`: the command line of `probekit.capture_study`
(`probekit.run.capture`): `command(study)`, its options (the model's, the capture's and the
study's), and `execute(study, parsed)`."""

from __future__ import annotations

from probekit.run.capture import capture_command as command
from probekit.run.capture import capture_parsed as execute

__all__ = ["command", "execute"]
