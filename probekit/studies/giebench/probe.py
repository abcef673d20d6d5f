"""The GIEBench probe: every item x answer order x prompt type (and, for records, the identity
swapped for another of its category), as one user message or as raw text.

Views: `exact` (the response is prefilled with `[[` and the A–D distribution is read
exactly), `explain` (the run loop generates the explanation until the answer
cue `[[` and reads the distribution there), `generate` (greedy text and GIEBench's regex).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from probekit.core.answers import AnswerSet
from probekit.core.choices import cyclic_orders, letter_of
from probekit.core.items import CharSpan, Item
from probekit.studies.base import Probe
from probekit.studies.giebench.judge import (
    OPTIONS,
    VERDICT_CUE,
    build_prompt,
    extract_verdict,
    reorder_prompt,
)
from probekit.studies.giebench.sources import OfficialItem, Record, Unit

MAX_NEW_TOKENS = 256  # explain / generate budget (GIEBench allows 8,192; see the card)


def mismatch_identities(units: Sequence[Unit]) -> dict[str, str]:
    """Record id -> the identity that replaces its own: the next distinct identity of its
    category in sorted order (cyclic). A category with one identity has no mismatch."""
    records = [unit for unit in units if isinstance(unit, Record) and unit.identity]
    by_category: dict[str, set[str]] = {}
    for record in records:
        by_category.setdefault(record.category, set()).add(str(record.identity))
    swap = {}
    for record in records:
        names = sorted(by_category[record.category])
        if len(names) > 1:
            swap[record.id] = names[(names.index(str(record.identity)) + 1) % len(names)]
    return swap


@dataclass(eq=False)
class GIEBenchProbe(Probe):
    """GIEBench items as prompts; `correct` is the letter of the identity-aligned answer as
    shown, so an order's letters map back to the item's options."""

    name = "giebench"
    answers = AnswerSet(OPTIONS)
    answer_cue = VERDICT_CUE  # the explain view reads the verdict right after it
    unit_name = "item"
    group_name = "category"
    key_columns = (
        *("item_id", "category", "prompt_type", "order", "correct", "identity"),
        *("shown_identity", "mismatch", "prompt"),
    )

    units: Sequence[Unit]
    prompt_types: Sequence[str]
    view: str = "exact"
    orders: int = 1  # cyclic answer orders (`shown`: the orders themselves)
    chat: bool = True
    mismatch: bool = True
    max_new_tokens: int = MAX_NEW_TOKENS
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.units, self.prompt_types = list(self.units), tuple(self.prompt_types)
        self.shown = cyclic_orders(len(OPTIONS), self.orders)
        self.swap = mismatch_identities(self.units) if self.mismatch else {}

    def items(self) -> Iterator[Item]:
        for unit in self.units:
            for k, order in enumerate(self.shown):
                for prompt_type in self.prompt_types:
                    yield self.make_item(unit, prompt_type, k, order)
                    if prompt_type != "raw" and unit.id in self.swap:
                        yield self.make_item(unit, prompt_type, k, order, self.swap[unit.id])

    def make_item(
        self,
        unit: Unit,
        prompt_type: str,
        k: int,
        order: Sequence[int],
        shown: str | None = None,
    ) -> Item:
        """One prompt: `unit` in answer order `order` (number `k`), with identity `shown` in
        place of its own (a mismatch) when given."""
        if isinstance(unit, OfficialItem):
            prompt = unit.prompts[prompt_type]
            if k:
                prompt = reorder_prompt(prompt, order, unit.id)
            correct = letter_of(order, OPTIONS.index(unit.correct))
            identity, where = "", None
        else:
            identity = unit.identity or ""
            answers = [unit.answers[option] for option in order]
            in_prompt = (shown or unit.identity) if prompt_type != "raw" else None
            prompt, where = build_prompt(prompt_type, unit.question, answers, in_prompt)
            correct = letter_of(order, unit.correct)
        shown_identity = (shown or identity) if prompt_type != "raw" else ""
        message = 0 if self.chat else None
        return Item(
            id=f"{unit.id}|{prompt_type}|o{k}" + (f"|as:{shown}" if shown else ""),
            key={
                "item_id": unit.id,
                "category": unit.category,
                "prompt_type": prompt_type,
                "order": k,
                "correct": correct,
                "identity": identity,
                "shown_identity": shown_identity,
                "mismatch": shown is not None,
                "prompt": prompt,
            },
            unit=unit.id,
            messages=({"role": "user", "content": prompt},) if self.chat else None,
            text=None if self.chat else prompt,
            prefill=VERDICT_CUE if self.view == "exact" else "",
            spans={"identity": (CharSpan(message, *where),)} if where else {},
        )

    def unit_group(self, item: Item) -> str:
        """A limited run takes items of each category in turn."""
        return item.key["category"]

    def unit_prompts(self) -> str:
        orders = f" × {self.orders} answer orders" if self.orders > 1 else ""
        swapped = ", and the identity swaps" if self.swap else ""
        return f"its {len(self.prompt_types)} prompt types{orders}{swapped}"

    def parse(self, response: str) -> str:
        """GIEBench's verdict: the letter its regular expression finds, "" when none."""
        return extract_verdict(response)

    def settled(self, response: str) -> bool:
        """The explain view needs the text only up to the cue; the generate view reads to the
        end, as a later verdict can change GIEBench's parse."""
        return self.view == "explain" and VERDICT_CUE in response

    def config(self) -> dict[str, Any]:
        return {
            "study": "giebench",
            "items": [u.id for u in self.units],
            "prompt_types": list(self.prompt_types),
            "orders": self.orders,
            "chat_template": self.chat,
            "mismatch": bool(self.swap),
            "prefill": VERDICT_CUE if self.view == "exact" else "",
            "max_new_tokens": None if self.view == "exact" else self.max_new_tokens,
        }

    def manifest(self) -> dict[str, Any]:
        return {"prompt_types": list(self.prompt_types), "orders": self.orders, **self.extra}

    def add_columns(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`p_correct`: the normalised probability of the correct verdict (`p::<correct>`)."""
        probs = frame[[f"p::{letter}" for letter in OPTIONS]].to_numpy()
        where = frame["correct"].map(OPTIONS.index).to_numpy()
        return frame.assign(p_correct=probs[np.arange(len(frame)), where])
