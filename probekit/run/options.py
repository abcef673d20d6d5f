"""The options of a study run (`probekit run STUDY`, `probekit.run_study`), declared once
(`probekit.core.options`): `RunOptions`, with the kinds of its shard, noise sample and Ray
address."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probekit.core.kinds import Kind, int_value, non_negative_int, positive_int, refuse, text
from probekit.core.options import option
from probekit.core.shared_options import BatchSizeOption, LimitOption, OutOption, SeedOption
from probekit.engines.options import EpsilonOption


def _shard_value(value: Any) -> tuple[int, int]:
    if isinstance(value, str):
        try:
            value = [int(x) for x in value.split("/")]
        except ValueError:
            refuse(f"'{value}' must look like i/n, e.g. 0/4")
    if not isinstance(value, Sequence) or len(value) != 2:
        refuse(f"{value!r} must look like i/n, e.g. 0/4 (or a pair (i, n))")
    index, count = (int_value(x) for x in value)
    if count < 1 or not 0 <= index < count:
        refuse(f"'{index}/{count}': need 0 <= i < n")
    return index, count


shard_kind = Kind("shard", str, _shard_value)
"""`i/n` (or a pair from Python): every n-th prompt from the i-th (0 <= i < n)."""


def _numerics(value: Any) -> int | str:
    return value if value == "auto" else non_negative_int.check(value)


numerics_sample = Kind(
    "numerics", lambda value: value if value == "auto" else non_negative_int.parse(value), _numerics
)
"""`auto` or a count of prompts (0: no noise figure)."""


def _ray(value: Any) -> str:
    return "" if value is True else text.check(value)


ray_address = Kind("address", str, _ray)
"""A Ray cluster's address (`HOST:PORT`), or "" (True from Python): the one found here."""


@dataclass(frozen=True)
class RunOptions(LimitOption, EpsilonOption, BatchSizeOption, SeedOption, OutOption):
    """Run options: the view, which prompts, how they are scored, where."""

    view: str = option(
        "exact",
        help="exact (the scores from the logits, the default), generate (the authors' "
        "generation and parse, exact scores beside them) or explain (giebench)",
        kind=text,
    )
    shard: tuple[int, int] = option(
        (0, 1), help="i/n: run every n-th prompt from the i-th (default 0/1)", kind=shard_kind
    )
    numerics: int | str = option(
        "auto",
        help="prompts re-scored in float64 for the noise figure: auto (1 per 200 prompts, at "
        "most 8, none below 200), N, or 0 (skip)",
        kind=numerics_sample,
    )
    ray: str | None = option(
        None,
        help="score on Ray actors, one engine each: the cluster at ADDRESS (HOST:PORT; with "
        "token authentication also RAY_AUTH_MODE=token), else $RAY_ADDRESS, else the cluster "
        "`ray start` runs here, else a local instance (./setup.sh --ray)",
        kind=ray_address,
        const="",
        metavar="ADDRESS",
    )
    ray_actors: int | None = option(
        None,
        help="engines on Ray (default: one per GPU of the cluster, else one per node)",
        kind=positive_int,
        metavar="N",
    )
