"""The CE probe: each sampled row as the authors' multiple-choice prompt, in one or more orders.

The prompt is the CE instruction, the context and the conversation joined directly, then the
answers as `"\\n" + letter + ": " + text` joined with `"\\n"` (the authors'
`create_cognitive_st`), the whole filled with plain `str.format`. Each sample's answers get a
seeded random order (the authors draw one unseeded); `orders` > 1 shows it also in its cyclic
shifts (`probekit.core.choices`), so every answer takes every letter once with 5 orders. Spans are
where each mask's value landed (`fill_template`), one range per occurrence, never a text search.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from probekit.core.answers import AnswerSet
from probekit.core.choices import cyclic_order, letter_of, letters
from probekit.core.items import CharSpan, Item, fill_template
from probekit.core.options import option_error
from probekit.studies.base import Probe
from probekit.studies.jaem_st.data import EMPATHETIC, JaemData
from probekit.studies.jaem_st.sampler import TEMPLATE

N_OPTIONS = 5
LETTERS = letters(N_OPTIONS)
# The first capital A-E that stands alone (no letter on either side): "B", "B.", "(B)", "B: ...".
_LETTER = re.compile(r"(?<![A-Za-z])[A-E](?![A-Za-z])")
_SETTLED = re.compile(r"(?<![A-Za-z])[A-E](?=[^A-Za-z])")
GENERATE_TOKENS = 32  # room for a preamble such as "The answer is:\n\n" before the letter


def parse_letter(response: str) -> str | None:
    """probekit's rule (the paper gives none): the first standalone capital A-E, else None."""
    match = _LETTER.search(response)
    return match.group(0) if match else None


def answer_order(seed: int, sample: int) -> tuple[int, ...]:
    """The seeded random order of one sample's answers (file-order indices behind A..E)."""
    return tuple(int(i) for i in np.random.default_rng([seed, sample]).permutation(N_OPTIONS))


@dataclass(eq=False)
class JaemProbe(Probe):
    """Every sampled row x order as one user message; the answers are the letters A-E."""

    max_new_tokens = GENERATE_TOKENS
    contrast: ClassVar[tuple[str, str] | None] = None  # (dimension column, clean value): patching
    unit_name = "sample"

    data: JaemData
    rows: pd.DataFrame
    prompt: int = 0
    orders: int = 1
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ce, prompt = self.data.prompts.get("CE", []), self.prompt
        if not 0 <= prompt < len(ce):
            raise option_error("prompt", f"must be between 0 and {len(ce) - 1} (got {prompt})")
        self.instruction = ce[prompt]
        self.columns = tuple(d.column for d in self.data.dimensions)
        self.key_columns = ("template", "sample", *self.columns, "order", "empathetic_letter")
        self.answers = AnswerSet(LETTERS)
        self.name = f"jaem-st/CE{prompt}"

    def items(self) -> Iterator[Item]:
        for sample, row in enumerate(self.rows.itertuples(index=False)):
            values = dict(zip(self.rows.columns, row, strict=True))
            base = answer_order(self.seed, sample)
            for shift in range(self.orders):
                shown = tuple(base[j] for j in cyclic_order(N_OPTIONS, shift))
                yield self.make_item(sample, values, shown, shift)

    def make_item(
        self, sample: int, values: dict[str, Any], shown: tuple[int, ...], shift: int, tag: str = ""
    ) -> Item:
        """One prompt: a sample's values (`template_index` and a column per dimension) with the
        answers `shown`; `tag` distinguishes mechanism variants in the id."""
        template = self.data.templates[int(values[TEMPLATE])]
        by_mask = {d.mask: str(values[d.column]) for d in self.data.dimensions}
        # the authors' create_cognitive_st: the answers shown behind A, B, ... joined directly
        pairs = zip(LETTERS, shown, strict=True)
        answers = ["\n" + letter + ": " + template.answers[i][1] for letter, i in pairs]
        prompt = self.instruction + template.context + template.conversation + "\n".join(answers)
        text, where = fill_template(prompt, **by_mask)
        letter = letter_of(shown, template.answer_index(EMPATHETIC))
        spans = {
            d.column: tuple(CharSpan(0, start, end) for start, end in where[d.mask])
            for d in self.data.shown_dimensions(template)
        }
        return Item(
            id=f"{template.name}|{sample}|{shift}{tag}",
            key={
                "template": template.name,
                "sample": sample,
                **{c: str(values[c]) for c in self.columns},
                "order": shift,
                "empathetic_letter": letter,
                "correct": letter,  # read by the metric p_correct
                "answer_types": ",".join(template.answers[i][0] for i in shown),
                "prompt": text,
            },
            unit=str(sample),
            messages=({"role": "user", "content": text},),
            spans=spans,
        )

    @property
    def group_columns(self) -> tuple[str, ...]:
        """The dimension columns of the intersectional groups (the run's `--groups`)."""
        return tuple(self.extra.get("groups", ()))

    def unit_group(self, item: Item) -> tuple[str, ...]:
        """A limited run takes samples of each template × group in turn."""
        return (item.key["template"], *(item.key[c] for c in self.group_columns))

    @property
    def min_units(self) -> int:
        """One sample of every template × group: the interval of the CE score over all groups,
        and the outliers, compare every group."""
        return self.rows.groupby([TEMPLATE, *self.group_columns]).ngroups

    @property
    def group_name(self) -> str:
        return " × ".join(["template", *self.group_columns])

    def unit_prompts(self) -> str:
        return "1 answer order" if self.orders == 1 else f"{self.orders} answer orders"

    def parse(self, response: str) -> str | None:
        return parse_letter(response)

    def settled(self, response: str) -> bool:
        """A standalone letter followed by a non-letter cannot change any more."""
        return _SETTLED.search(response) is not None

    def config(self) -> dict[str, Any]:
        return {
            "study": "jaem-st",
            "templates": [t.name for t in self.data.templates],
            "prompt": self.prompt,
            "orders": self.orders,
            "seed": self.seed,
            "samples": len(self.rows),
            **{k: v for k, v in self.extra.items() if k in ("dataset_size", "uniform")},
        }

    def manifest(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "orders": self.orders, **self.extra}

    def __len__(self) -> int:
        return len(self.rows) * self.orders
