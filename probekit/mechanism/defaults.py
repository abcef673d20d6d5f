"""What a study tells the mechanism commands: the spans to patch, the readout, its contrast and
its direction.

A study returns one `MechanismDefaults` from `Study.mechanism_defaults()`; `probekit patch` and
`probekit steer` use it where the command line leaves a choice open. Every study declares its
`Contrast` (the two sides its gap compares: intergroup's in-group and out-group prompts, ISEAR's
first gender and the others), which `probekit steer --vector mean_diff` steers along. This module
imports nothing heavy, so that studies can name it at import time.
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


Side = Callable[[Any], Callable[[Any], bool]]
"""probe -> (encoded prompt -> True on the contrast's first side)."""


@dataclass(frozen=True)
class Contrast:
    """The two sides of a study's gap: the prompts where `side(probe)(prompt)` is true (the
    clean side of its patching pairs: intergroup's in-group prompts) against the others, read at
    `span` (steer's default `--span`; a function of the probe where the study's options name
    it, as JaEm-ST's `--dimension`). `label` says it in words ("in-group vs out-group")."""

    label: str
    span: str | Callable[[Any], str]
    side: Side

    def span_of(self, probe: Any) -> str:
        """The span the contrast is read at for `probe`."""
        return self.span if isinstance(self.span, str) else self.span(probe)

    def direction(
        self, centre: tuple[str, ...], statistic: Callable[[Any], Statistic]
    ) -> Direction:
        """The difference-of-means direction along this contrast (`Direction`; the contrast's
        span must be fixed)."""
        if not isinstance(self.span, str):
            raise TypeError("a direction needs a contrast read at a fixed span")
        return Direction(self.span, self.side, centre, statistic)


@dataclass(frozen=True)
class Direction:
    """The difference-of-means direction of a study: at `span`, between the prompts where
    `contrast(probe)(prompt)` is true and the others; a prompt's gap is centred within the groups
    of the key columns `centre`; `statistic(probe)` is recomputed after the direction is
    projected out (see `probekit.mechanism.directions`)."""

    span: str
    contrast: Side
    centre: tuple[str, ...]
    statistic: Callable[[Any], Statistic]


@dataclass(frozen=True)
class MechanismDefaults:
    """A study's defaults for `probekit patch`, `capture` and `steer`.

    `contrast`: the two sides of the study's gap (every study declares one: `probekit steer
    --vector mean_diff` and `direction` steer along it).
    `spans`: the spans patched when `--spans` is not given (None: every span of the items).
    `readout`: the readout spec (`expected`, `p_correct`, ...) or a function (probe, encoded
    prompts, their exact results) -> spec, whose docstring's first sentence names it in `--help`.
    `direction`: the patch analysis's difference-of-means direction with the study's statistic
    (`contrast.direction(centre, statistic)`), where the study has a statistic per prompt
    value; None skips that analysis."""

    contrast: Contrast
    spans: tuple[str, ...] | None = None
    readout: str | ReadoutChooser = "expected"
    direction: Direction | None = None

    def readout_help(self) -> str:
        """The default readout as `--help` shows it."""
        if callable(self.readout):
            return (self.readout.__doc__ or "chosen by the study").split(".")[0].strip()
        return self.readout
