"""How long a run will take on this device, said in its first line, before any prompt is scored.

The pace (prompts a second) is that of the last run of the same model (its weights, dtype and
precision tier), device, answer set and view on this machine, kept in a small record in the
user cache (`pace.json`: written at the end of every run that scored prompts, one entry per
such key); where there is none, a short sample measures it (`probekit.run.scoring.sample_pace`)
and the record keeps that until a run replaces it. The line names where its pace comes from;
after the first batch the progress says how long the run takes at the pace it actually goes
(`probekit.core.progress`).
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.io import write_text
from probekit.core.paths import user_cache_dir
from probekit.core.progress import duration

RECORD = "pace.json"


def record_path() -> Path:
    """The per-machine record of measured paces: `pace.json` in the user cache."""
    return user_cache_dir() / RECORD


@dataclass(frozen=True)
class Pace:
    """Prompts scored a second, and where that figure comes from (a phrase: "measured by the last
    run of this model on this machine (432 prompts, 2026-11-28)", "measured on 16 prompts after
    a warm-up")."""

    per_second: float
    source: str

    def seconds(self, prompts: int) -> float:
        return prompts / self.per_second


def pace_key(described: Mapping[str, Any], answers: AnswerSet, view: str) -> str:
    """What a pace is the pace of: this machine, the model as `described` (`Engine.describe`:
    engine, spec, weights, dtype, precision tier, device), the answer set and the view."""
    tier = (described.get("precision") or {}).get("tier")
    answer_text = "\n".join(answers.answers).encode()
    fields = [
        platform.node(),
        described.get("engine"),
        described.get("model"),
        described.get("weights"),
        described.get("dtype"),
        tier,
        str(described.get("device")),
        hashlib.sha256(answer_text).hexdigest()[:16],
        view,
    ]
    return json.dumps(fields, default=str)


def _read() -> dict[str, Any]:
    """The record; empty when there is none or it cannot be read (it is only a hint)."""
    try:
        found = json.loads(record_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def recorded_pace(key: str) -> Pace | None:
    """The pace the record holds for `key`, None when it holds none."""
    entry = _read().get(key)
    try:
        per_second = float(entry["per_second"])
        source = str(entry["source"])
    except (TypeError, KeyError, ValueError):
        return None
    return Pace(per_second, source) if per_second > 0 else None


def run_pace(prompts: int, seconds: float) -> Pace:
    """The pace of a run that scored `prompts` in `seconds`, as the record keeps it."""
    return Pace(
        prompts / max(seconds, 1e-6),
        f"measured by the last run of this model on this machine ({prompts} prompts, "
        f"{date.today()})",
    )


def record_pace(key: str, pace: Pace) -> None:
    """Keep `pace` for `key`. A record that cannot be written is left as it is: it is only a
    hint."""
    found = _read()
    found[key] = {"per_second": pace.per_second, "source": pace.source}
    try:
        write_text(record_path(), json.dumps(found, indent=1))
    except ProbekitError:  # a read-only cache, a full disk
        return


def forecast(prompts: int, pace: Pace, hint: str | None = None) -> str:
    """`about 3 min on this device (at 2.4 prompts/s, <source>; a smaller run: <hint>)`."""
    rate = f"{pace.per_second:.3g} prompts/s"
    smaller = f"; a smaller run: {hint}" if hint else ""
    return (
        f"about {duration(pace.seconds(prompts))} on this device "
        f"(at {rate}, {pace.source}{smaller})"
    )
