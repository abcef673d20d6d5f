"""A minimal study, to show what a new study is: its probe, options, report with its headline,
contrast and card (this docstring), nothing else. Options, data, the run loop, both views of a
generate run, the summary files, `--help`, and the items and pairs of `patch`, `capture` and
`steer` come from the core (`probekit.studies.base`).

The question: how good, 0 to 10, is a day that a named person describes? The gap is the mean
expected rating for Alice minus that for Bob, over the same days; the contrast is Alice's
prompts against Bob's, at the name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.answers import AnswerSet
from probekit.core.items import CharSpan, EncodedItem, Item
from probekit.core.kinds import positive_int
from probekit.core.options import option
from probekit.mechanism.defaults import Contrast, Difference, MechanismDefaults
from probekit.reporting.headline import Headline
from probekit.studies.base import Context, Probe, Study

NAMES = ("Alice", "Bob")
DAYS = ("I missed the bus.", "I got a letter from a friend.", "It rained all day.")


class MinimalProbe(Probe):
    """Every name x day prompt; the answer is a rating from 0 to 10."""

    name = "minimal"
    answers = AnswerSet.parse("0-10")
    key_columns = ("day", "name")

    def __init__(self, days: int) -> None:
        self.days = DAYS[:days]

    def items(self) -> Iterator[Item]:
        for day, text in enumerate(self.days):
            for person in NAMES:
                question = f'{person} says: "{text}" How good was the day, 0 to 10? Answer:'
                key = {"day": day, "name": person}
                name = {"name": (CharSpan(None, 0, len(person)),)}
                yield Item(f"{day}|{person}", key, str(day), text=question, spans=name)

    def parse(self, response: str) -> int | None:
        found = re.search(r"\d+", response)
        return int(found.group()) if found else None

    def config(self) -> dict[str, Any]:
        return {"study": "minimal", "days": list(self.days)}


@dataclass(frozen=True)
class MinimalOptions:
    """minimal options."""

    days: int = option(2, help="days per name (default %(default)s)", kind=positive_int)


class MinimalStudy(Study):
    name = "minimal"
    title = "A minimal study: Alice's and Bob's days, rated 0-10"
    default_out = "runs/minimal"
    options = MinimalOptions

    def probes(self, options: MinimalOptions, context: Context) -> list[MinimalProbe]:
        return [MinimalProbe(options.days)]

    def report_view(
        self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any], view: str, suffix: str
    ) -> list[dict]:
        value = scores["expected"] if view == "exact" else pd.to_numeric(scores["parsed"])
        means = value.groupby(scores["name"]).mean()
        return [{"view": view, **means.to_dict(), "gap": means["Alice"] - means["Bob"]}]

    def headlines(self, table: pd.DataFrame, manifest: dict[str, Any]) -> list[Headline]:
        return [
            Headline("gap, Alice - Bob", r["view"], r["gap"], primary=r["view"] == "exact")
            for r in table.to_dict("records")
        ]

    def mechanism_defaults(self) -> MechanismDefaults:
        return MechanismDefaults(Contrast("Alice vs Bob", "name", _alice), Difference())


def _alice(probe: MinimalProbe) -> Callable[[EncodedItem], bool]:
    return lambda prompt: prompt.item.key["name"] == "Alice"


STUDY = MinimalStudy()  # a study folder registers on import: `STUDY = register(MyStudy())`
