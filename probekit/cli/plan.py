"""`probekit plan`: the memory plan of a model on some devices, before anything loads."""

from __future__ import annotations

import json

from probekit.core.errors import ProbekitError
from probekit.core.options import Command, as_flags, option_values
from probekit.engines.plan import PlanOptions

HELP = "the memory plan of a model on some devices (weights, KV cache, batch, placement)"
COMMAND = Command("plan", (PlanOptions,))
"""The options of `probekit plan` (those of `probekit.plan`, and `--json`)."""


def execute(parsed: tuple) -> None:
    """Print the plan; one line and exit status 2 when the model does not fit."""
    from probekit.engines.plan import marked_plan

    (options,) = parsed
    result = marked_plan(**option_values(options, leave=("json",))).worded(as_flags)
    print(json.dumps(result.to_dict(), indent=1) if options.json else "\n".join(result.lines()))
    if not result.fits:
        raise ProbekitError(result.advice)
