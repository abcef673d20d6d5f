"""The engine seam: what the run loop, the commands, the mechanism and the benchmarks may ask of
whatever runs a model.

An `Engine` encodes items into token ids, scores token-id prompts against an answer set (the
exact view), generates continuations (the paper-faithful view), and, where it has one, hands out
the hookable model the mechanism needs. The transformers engine (`engines/hf/`) does all four; an
engine without hooks (vLLM) raises a `ProbekitError` from `hookable()` saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from probekit.answers import AnswerSet
from probekit.items import EncodedItem, Item


@runtime_checkable
class Scorer(Protocol):
    """Scores token-id prompts against one answer set; built by `Engine.scorer`."""

    def score(
        self, prompts: Iterable[Sequence[int]], window: int = ..., progress: Any = None
    ) -> Iterator[Any]:
        """One `ScoreResult` per prompt, in input order."""

    def generate(self, prompts: Sequence[Sequence[int]], progress: Any = None) -> list[list[int]]:
        """The continuation of every prompt (token ids), without the exact answer pass."""


@runtime_checkable
class Engine(Protocol):
    """One loaded model behind one engine."""

    engine: str  # "hf", "vllm", ...
    name: str  # the model spec it was loaded from (`default`, a hub id, a path)

    def encode(self, item: Item, as_string: bool = False) -> EncodedItem:
        """The item's token ids and span positions."""

    def scorer(
        self,
        answers: AnswerSet,
        *,
        epsilon: float = ...,
        batch_size: int | None = None,
        max_new_tokens: int = 0,
        settled: Callable[[str], bool] | None = None,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> Scorer:
        """A scorer for `answers`; `max_new_tokens` > 0 also decodes a continuation."""

    def decode(self, tokens: Sequence[Sequence[int]]) -> list[str]:
        """Token ids back to text, special tokens skipped."""

    def hookable(self) -> Any:
        """The model the mechanism hooks into; a ProbekitError where the engine has none."""

    def describe(self) -> dict[str, Any]:
        """Manifest fields: engine, model, source, weights fingerprint, device, dtype."""
