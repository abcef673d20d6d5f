"""`probekit run STUDY`: the command line of `probekit.run_study` (`probekit.run.study`): the
same options, read from argv by the parser generated from their declarations
(`probekit.run.options.run_command`) and checked the same way, then the same run; `--model` may
be repeated (one folder per model, the summary side by side).

Every option is checked while parsing, before any data is read, anything is written or a model
is loaded. The model library is imported by `execute` only, so that `probekit run STUDY --help`
stays fast.
"""

from __future__ import annotations

from probekit.run.options import run_command as command
from probekit.run.study import run_parsed as execute

__all__ = ["command", "execute"]
