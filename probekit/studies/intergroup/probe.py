"""The intergroup empathy gap study (Hou, Daumé III, Rudinger, NAACL 2025), read from data.

Groups, persona sentences, scale instructions, user templates and the paper's seven prompt
settings live in `study.json` beside this module; this module turns them into typed objects and
renders the chat messages byte for byte as the authors did.
"""

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from itertools import accumulate, groupby
from typing import Any

import pandas as pd

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import CharSpan, Item, fill_template
from probekit.core.paths import package_path
from probekit.studies.base import Probe, interleaved
from probekit.studies.intergroup.parse import intensity_settled, parse_intensity

STUDY_FILE = package_path("probekit.studies.intergroup", "study.json")


_STUDY: dict[str, Any] = json.loads(STUDY_FILE.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Category:
    """One social category; `identities[0]` is the reference group `a person`.

    `labels[i]` is the in-group label of `identities[i]` (two identities are in-group when their
    labels are equal); `regions` maps a nationality identity to its cultural region.
    """

    name: str
    identities: tuple[str, ...]
    labels: tuple[str, ...]
    regions: dict[str, str] = field(hash=False)

    @property
    def named(self) -> tuple[str, ...]:
        """The identities without the reference group (the ones the gap score uses)."""
        return self.identities[1:]

    @property
    def named_labels(self) -> tuple[str, ...]:
        """The in-group labels of `named`."""
        return self.labels[1:]

    @property
    def blocks(self) -> list[tuple[int, int]]:
        """(start, stop) index ranges of consecutive equal labels over all identities."""
        ends = list(accumulate(len(list(run)) for _, run in groupby(self.labels)))
        return list(zip([0, *ends[:-1]], ends, strict=True))


EMOTIONS: tuple[str, ...] = tuple(_STUDY["emotions"])
CATEGORIES: tuple[str, ...] = tuple(_STUDY["categories"])


def get_category(name: str) -> Category:
    """The category `name` (ethnicity, nationality or religion)."""
    rows = _STUDY["categories"].get(name)
    if rows is None:
        raise ProbekitError(f"unknown category {name!r}; choose one of {', '.join(CATEGORIES)}")
    return Category(
        name=name,
        identities=tuple(r["identity"] for r in rows),
        labels=tuple(r["label"] for r in rows),
        regions={r["identity"]: r["region"] for r in rows if "region" in r},
    )


@dataclass(frozen=True)
class Setting:
    """One prompt setting: persona sentence (P), scale instruction (S) and user template (T)."""

    name: str
    alias: str
    persona: str
    scale: str
    template: str
    scale_max: int
    text_column: str


def _setting(row: dict[str, str]) -> Setting:
    scale, template = _STUDY["scales"][row["scale"]], _STUDY["templates"][row["template"]]
    texts = (_STUDY["personas"][row["persona"]], scale["text"], template["text"])
    name = row["persona"] + row["scale"] + row["template"]
    return Setting(name, row["alias"], *texts, scale["max"], template["text_column"])


_SETTINGS = {setting.name: setting for setting in map(_setting, _STUDY["settings"])}
SETTINGS: tuple[str, ...] = tuple(_SETTINGS)


def get_setting(name: str) -> Setting:
    """The setting with canonical name `name` (e.g. `P0S0T0`) or the authors' alias (`origin`)."""
    for setting in _SETTINGS.values():
        if name in (setting.name, setting.alias):
            return setting
    valid = ", ".join(f"{s.name} ({s.alias})" for s in _SETTINGS.values())
    raise ProbekitError(f"unknown setting {name!r}; choose one of {valid}")


def render_messages(
    setting: Setting, perceiver: str, experiencer: str, emotion: str, text: str
) -> list[dict[str, str]]:
    """The chat messages for one prompt: persona + scale as system, the narrative as user.

    `text` is the event's `setting.text_column`; it is inserted verbatim between quotes.
    """
    system = setting.persona.format(persona=perceiver) + "\n" + setting.scale
    user = setting.template.format(experiencer=experiencer, emotion=emotion, sent=text)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def make_item(
    setting: Setting,
    category: str,
    perceiver: str,
    experiencer: str,
    event_id: str,
    emotion: str,
    text: str,
) -> Item:
    """One prompt as an item: the chat messages and the spans `perceiver`, `experiencer`,
    `emotion` (the emotion word of the question) and `event`, placed from the setting's templates,
    so that an identity that also occurs in the event or the question is never confused with the
    filled one."""
    messages = render_messages(setting, perceiver, experiencer, emotion, text)
    _, persona = fill_template(setting.persona, persona=perceiver)
    _, user = fill_template(setting.template, experiencer=experiencer, emotion=emotion, sent=text)

    def at(message: int, where: tuple[int, int]) -> tuple[CharSpan]:
        return (CharSpan(message, *where),)

    return Item(
        id=f"{category}|{setting.name}|{perceiver}|{experiencer}|{event_id}",
        key={
            "perceiver": perceiver,
            "experiencer": experiencer,
            "event_id": event_id,
            "emotion": emotion,
        },
        unit=event_id,
        messages=tuple(messages),
        spans={
            "perceiver": at(0, persona["persona"][0]),
            "experiencer": at(1, user["experiencer"][0]),
            "emotion": at(1, user["emotion"][-1]),
            "event": at(1, user["sent"][0]),
        },
    )


@dataclass(eq=False)
class IntergroupProbe(Probe):
    """Every perceiver x experiencer x event prompt of one (category, setting), `a person`
    included on both sides as in the paper's full matrix (or only the named groups with
    `named_only`); perceiver-major order."""

    key_columns = ("perceiver", "experiencer", "event_id", "emotion")
    max_new_tokens = 128  # the authors' budget; rows stop once their parse is fixed (`settled`)
    unit_name = "event"
    group_name = "emotion"

    category: Category
    setting: Setting
    events: pd.DataFrame
    named_only: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    authors_input: bool = False  # vLLM's string prompt: a second BOS for some tokenizers

    def __post_init__(self) -> None:
        category, setting = self.category, self.setting
        self.identities = category.named if self.named_only else category.identities
        self.name = f"intergroup/{category.name}/{setting.name}"
        self.answers = AnswerSet.range(0, setting.scale_max)
        self.subdir = f"{category.name}/{setting.name}"
        self.as_string = self.authors_input

    def items(self) -> Iterator[Item]:
        return self._items(self.events)

    def unit_items(self, units: Collection[str]) -> Iterator[Item]:
        """Only the items of `units` (events) are made: a mechanism command's slice is small."""
        return self._items(self.events[self.events["event_id"].astype(str).isin(set(units))])

    def balanced(self) -> tuple[list[str], dict[str, int], int]:
        """`Probe.balanced` from the events alone, without making the items."""
        units = [str(event) for event in self.events["event_id"]]
        groups: dict[str, list[str]] = {}
        for unit, emotion in zip(units, self.events["emotion"], strict=True):
            groups.setdefault(emotion, []).append(unit)
        sizes = dict.fromkeys(units, len(self.identities) ** 2)
        return interleaved(groups.values()), sizes, len(groups)

    def _items(self, events: pd.DataFrame) -> Iterator[Item]:
        rows = list(
            events[["event_id", "emotion", self.setting.text_column]].itertuples(index=False)
        )
        where = (self.setting, self.category.name)
        for perceiver in self.identities:
            for experiencer in self.identities:
                for event_id, emotion, text in rows:
                    yield make_item(*where, perceiver, experiencer, str(event_id), emotion, text)

    def parse(self, response: str) -> int:
        """The authors' extraction rule; always on [0, 100], as in their code."""
        return parse_intensity(response)

    def settled(self, response: str) -> bool:
        return intensity_settled(response)

    def config(self) -> dict[str, Any]:
        return {
            "study": "intergroup",
            "category": self.category.name,
            "setting": self.setting.name,
            "events": [str(e) for e in self.events["event_id"]],
            "authors_input": self.as_string,
        }

    def manifest(self) -> dict[str, Any]:
        return {"category": self.category.name, "setting": self.setting.name, **self.extra}

    def unit_group(self, item: Item) -> str:
        """A limited run takes events of each emotion in turn."""
        return item.key["emotion"]

    def unit_prompts(self) -> str:
        return f"{len(self.identities) ** 2} perceiver × experiencer pairs"

    def in_group(self, perceiver: str, experiencer: str) -> bool:
        """Whether the two identities share their in-group label."""
        label = dict(zip(self.category.identities, self.category.labels, strict=True))
        return label[perceiver] == label[experiencer]

    def __len__(self) -> int:
        return len(self.identities) ** 2 * len(self.events)
