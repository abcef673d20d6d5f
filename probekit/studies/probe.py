"""The probe abstraction every study builds on: items -> prompts -> answer set -> results.

A probe says what to ask (chat messages keyed by the columns that identify each prompt), which
answers count, and how a generated response is parsed. Scoring, batching, sharding, resuming and
writing results are the run loop's job (`probekit.run`), shared by all studies; metrics live in
`probekit.stats`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from probekit.answers import AnswerSet

Messages = list[dict[str, str]]


class Probe(ABC):
    """One study configuration whose prompts can be enumerated in a fixed order."""

    name: str
    answers: AnswerSet
    key_columns: tuple[str, ...]  # the columns identifying a prompt in the results table
    max_new_tokens: int = 16  # generation budget in generate mode

    @abstractmethod
    def prompts(self) -> Iterator[tuple[dict[str, Any], Messages]]:
        """(key columns, chat messages) for every prompt, always in the same order."""

    @abstractmethod
    def parse(self, response: str) -> Any:
        """The answer extracted from a generated response (generate mode)."""

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """What defines this probe's prompts, recorded in the run manifest."""

    def __len__(self) -> int:
        return sum(1 for _ in self.prompts())
