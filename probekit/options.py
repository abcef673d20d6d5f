"""Option types shared by every command and study: each turns one command-line string into a
checked value, or one line saying what is wrong (argparse prints it and exits with status 2)."""

from __future__ import annotations

import argparse

from probekit.errors import ProbekitError


def int_list(text: str) -> list[int]:
    """argparse type for comma-separated integers such as `--layers 0,6,12`."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None


def comma_list(text: str) -> list[str]:
    """argparse type for comma-separated names such as `--sites hook_resid_pre,hook_mlp_out`."""
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item")
    return items


def count_or_all(text: str, option: str = "--events") -> int | None:
    """An option that takes a positive count or `all` (None)."""
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ProbekitError(f"{option} '{text}' must be a positive number or 'all'") from None
    if value < 1:
        raise ProbekitError(f"{option} must be at least 1 (got {value}), or 'all'")
    return value
