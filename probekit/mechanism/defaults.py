"""What a study tells the mechanism commands: the effect its headline measures, the spans to
patch, the readout, its contrast and its direction.

A study returns one `MechanismDefaults` from `Study.mechanism_defaults()`; `probekit patch` and
`probekit steer` use it where the command line leaves a choice open. Every study declares its
`Contrast` (the two sides its gap compares: intergroup's in-group and out-group prompts, ISEAR's
first gender and the others), which `probekit steer --vector mean_diff` steers along, and its
`effect`: a `Difference` of the contrast's two sides, or an `Interaction` of two identities
(intergroup's perceiver x experiencer), which patching recovers (`probekit.mechanism.pairs`
builds its sets). This module imports nothing heavy, so that studies can name it at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

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
class Difference:
    """The headline is a difference between the contrast's two sides (ISEAR's genders,
    GIEBench's own against a swapped identity, JaEm-ST's clean value against the others):
    patching reads it on the study's pairs (`Study.pairs`), each pair a set of its own whose
    gap is readout(clean) - readout(corrupt)."""

    name: ClassVar[str] = "difference"


@dataclass(frozen=True)
class Interaction:
    """The headline is an interaction of two identities, one in the key column `rows` and one in
    `columns` (intergroup: perceiver x experiencer; Δ compares the cells where both are of one
    group with the others). Patching reads it on 2x2 sets: for two identities g, h of different
    groups (`same(probe)(g, h)` False) on one unit, the cells (g,g), (g,h), (h,g), (h,h), each
    patched from the cell that swaps one identity (see `probekit.mechanism.pairs`)."""

    rows: str
    columns: str
    same: Callable[[Any], Callable[[str, str], bool]]
    name: ClassVar[str] = "interaction"


Effect = Difference | Interaction
"""What a study's headline measures, and so what patching recovers."""


@dataclass(frozen=True)
class MechanismDefaults:
    """A study's defaults for `probekit patch`, `capture` and `steer`.

    `contrast`: the two sides of the study's gap (every study declares one: `probekit steer
    --vector mean_diff` and `direction` steer along it).
    `effect`: what the headline measures (every study declares it: a `Difference` or an
    `Interaction`), the sets `probekit patch` patches and the recovery it reports.
    `spans`: the spans patched when `--spans` is not given (None: every span of the items).
    `readout`: the readout spec (`expected`, `p_correct`, ...) or a function (probe, encoded
    prompts, their exact results) -> spec, whose docstring's first sentence names it in `--help`.
    `direction`: the patch analysis's difference-of-means direction with the study's statistic
    (`contrast.direction(centre, statistic)`), where the study has a statistic per prompt
    value; None skips that analysis."""

    contrast: Contrast
    effect: Effect
    spans: tuple[str, ...] | None = None
    readout: str | ReadoutChooser = "expected"
    direction: Direction | None = None

    def readout_help(self) -> str:
        """The default readout as `--help` shows it."""
        if callable(self.readout):
            return (self.readout.__doc__ or "chosen by the study").split(".")[0].strip()
        return self.readout
