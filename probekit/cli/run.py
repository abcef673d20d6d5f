"""`probekit run STUDY`: the command line of `probekit.run_study` (`probekit.run.study`): the
same options, parsed and checked by the same parser, then the same run; `--model` may be
repeated (one folder per model, the summary side by side).

Every option is checked while parsing (`add_arguments`), before any data is read, anything is
written or a model is loaded. The model library is imported by `execute` only, so that
`probekit run STUDY --help` stays fast.
"""

from __future__ import annotations

import argparse

from probekit.run.study import Run, add_arguments, model_folder, run_parsed
from probekit.studies.base import Study

__all__ = ["add_arguments", "execute", "model_folder"]


def execute(study: Study, args: argparse.Namespace) -> list[Run]:
    """Run `study` as `args` say: one `Run` per model (none on a process of a distributed
    launch that is not the main one)."""
    return run_parsed(study, args)
