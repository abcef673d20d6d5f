"""The options every mechanism command reads (`probekit patch`, `capture`, `steer` and their
functions): `HookOptions`, where activations are read and written, declared once
(`probekit.core.options`) and extended by each command's own (`probekit.mechanism.pipeline`'s
`PatchOptions` and `CaptureOptions`, `probekit.mechanism.steering.SteerOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from probekit.core.kinds import Kind, comma_list, int_list
from probekit.core.options import option
from probekit.core.shared_options import BatchSizeOption, LimitOption, OutOption, SeedOption
from probekit.mechanism.sites import DEFAULT_SITES, HEAD_SITE, PATCH_LAYERS, library

_SITES = "comma-separated TransformerLens sites (short forms such as resid_pre accepted)"


def _per_command(template: str, **tails: str) -> dict[str, str]:
    """An option's help per command (`other`: every other command's): `template` with the
    command's tail."""
    return {"" if name == "other" else name: template.format(t) for name, t in tails.items()}


@dataclass(frozen=True)
class HookOptions(LimitOption, BatchSizeOption, SeedOption, OutOption):
    """Where activations are read and written."""

    layers: list[int] | None = option(
        None,
        help=_per_command(
            "comma-separated layers, -1 the last (default: {})",
            patch=f"{PATCH_LAYERS} evenly spaced",
            capture="the first, middle and last",
            other="the middle one",
        ),
        kind=int_list,
    )
    sites: list[str] = option(
        DEFAULT_SITES,
        help=_per_command(
            _SITES + "{} (default %(default)s)",
            patch=f"; {HEAD_SITE} patches each attention head",
            steer=", of the residual stream's width",
            other="",
        ),
        kind=comma_list,
        defaults={"steer": ("hook_resid_post",)},
    )
    spans: list[str] | None = option(
        None,
        help={
            "patch": "span names, from_<span> (everything from the span to the end) or "
            "<span>@<i> (the i-th of its positions; -1 the last) (default: the study's spans)",
            "": "span names (default: every span)",
        },
        kind=comma_list,
        commands=("patch", "capture"),
    )
    hooks: str = option(
        "transformer_lens",
        help="hook library that reads and writes activations: transformer_lens or nnsight",
        kind=Kind("hook library", str, library),
    )
