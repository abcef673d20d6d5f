"""What a study tells the mechanism commands: the spans to patch, the readout, and its direction.

A study returns one `MechanismDefaults` from `Study.mechanism_defaults()`; `probekit patch` uses it
where the command line leaves a choice open. This module imports nothing heavy, so that studies
can name it at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

Statistic = Callable[[pd.DataFrame, str], float]
"""(frame of prompts, the column of their readout) -> the study's statistic, e.g. Δ."""
ReadoutChooser = Callable[[Any, Sequence[Any], Sequence[Any]], str]
"""(probe, encoded prompts, their exact results) -> a readout spec such as `p:joy`."""


@dataclass(frozen=True)
class Direction:
    """The difference-of-means direction of a study: at `span`, between the prompts where
    `contrast(probe)(prompt)` is true and the others; a prompt's gap is centred within the groups
    of the key columns `centre`; `statistic(probe)` is recomputed after the direction is
    projected out (see `probekit.mechanism.directions`)."""

    span: str
    contrast: Callable[[Any], Callable[[Any], bool]]
    centre: tuple[str, ...]
    statistic: Callable[[Any], Statistic]


@dataclass(frozen=True)
class MechanismDefaults:
    """A study's defaults for `probekit patch/capture`.

    `spans`: the spans patched when `--spans` is not given (None: every span of the items).
    `readout`: the readout spec (`expected`, `p_correct`, ...) or a function (probe, encoded
    prompts, their exact results) -> spec, whose docstring's first sentence names it in `--help`.
    `direction`: the study's difference-of-means direction, if it has one."""

    spans: tuple[str, ...] | None = None
    readout: str | ReadoutChooser = "expected"
    direction: Direction | None = None

    def readout_help(self) -> str:
        """The default readout as `--help` shows it."""
        if callable(self.readout):
            return (self.readout.__doc__ or "chosen by the study").split(".")[0].strip()
        return self.readout
