"""The options every command that has them shares, declared once (`probekit.core.options`):
the output folder, the seed, the batch size and the slice (`limit`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from probekit.core.kinds import non_negative_int, path, positive_int
from probekit.core.options import option

FIRST_UNITS = {"patch": 2, "steer": 2, "lens": 2, "capture": 3}
"""The units (events, items, samples) a mechanism command reads when given no `limit`."""


@dataclass(frozen=True)
class OutOption:
    """Output."""

    out: Path | None = option(
        None,
        help={
            "report": "where the summary and pages go (default: the one folder given, else "
            "combined/ in the folders' common parent)",
            "": "output folder (default %(default)s)",
        },
        kind=path,
        metavar="DIR",
        defaults={c: f"runs/{c}" for c in FIRST_UNITS},
        none="the study's",
    )


@dataclass(frozen=True)
class SeedOption:
    """Seed."""

    seed: int | None = option(
        0,
        help="seed of everything drawn at random: the items, the statistics' resamples, random "
        "controls (default %(default)s)",
        kind=non_negative_int,
        defaults={"run": None},
        none="the study's",
    )


@dataclass(frozen=True)
class BatchSizeOption:
    """Batch size."""

    batch_size: int | None = option(
        None,
        help="prompts per forward pass (default %(default)s)",
        kind=positive_int,
        defaults={"capture": 8},
        metavar="N",
        none="the engine's choice for the device",
    )


_SLICE = (
    "at most N prompts: the smallest balanced slice of that size, whole units (events, items, "
    "samples) taken in turn from each group while their prompts fit; fewer units than the "
    "headline's interval needs are scored, the headline marked 'no interval: N < M'"
)


@dataclass(frozen=True)
class LimitOption:
    """Slice."""

    limit: int | None = option(
        None,
        help={
            "run": f"{_SLICE} (default: every prompt)",
            "capture": f"{_SLICE} (default: the first {FIRST_UNITS['capture']} units)",
            "": f"{_SLICE} (default: the first {FIRST_UNITS['patch']} units)",
        },
        kind=positive_int,
        metavar="N",
    )
