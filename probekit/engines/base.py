"""The engine seam: what the run loop, the commands, the mechanism and the benchmarks may ask of
whatever runs a model, and the engine-neutral results that cross it.

An `Engine` encodes items into token ids, builds a `Scorer` for an answer set (it scores token-id
prompts exactly and, given a token budget, generates continuations: the paper-faithful view; its
options are the keywords of `ScorerOptions`), decodes tokens back to text, describes itself for
run manifests, and, where it has one, hands out the hookable model the mechanism needs. The
transformers engine (`engines/hf/`) does all of it; an engine without hooks (vLLM) raises
`hooks_unavailable(...)` from `hookable()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, Unpack, runtime_checkable

import numpy as np

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem, Item

ENGINES: dict[str, str] = {
    "hf": "probekit.engines.hf.model:load_model",
    "vllm": "probekit.engines.vllm:load_vllm",
}
"""The registered engines: name -> `module:loader` (`probekit.engines.load_engine`)."""

DEFAULT_EPSILON = 1e-4
"""The pruning bound every scorer and command starts from: the answer distribution's error
(pruned mass / valid mass) is at most this."""
DEFAULT_TOLERANCE = 0.005
"""The tolerance of a run that names none (docs/concepts.md, "The precision tier"), by which the
hf engine picks its precision tier (`probekit.engines.hf.tiers`): between what
the two faster tiers were measured to cause on the default model, each by a factor of about 3
(`benchmarks/results/dtype.json`: TF32 moves an answer probability by at most 1.6e-3 on every
study's slice, 1.3e-3 on an H100; bfloat16 by at least 0.016, 0.015 on the H100), so that TF32
is taken where it passes and bfloat16, which moves the intergroup Δ and ISEAR's max_diff by
several times their 95 % interval's half-width, only when a run asks for it."""


@dataclass(frozen=True, kw_only=True)
class ScorerOptions:
    """What a scorer is asked to do: the keywords of `Engine.scorer` (and of the transformers
    engine's `Scorer`), checked once here.

    - `epsilon`: the pruning bound; every result's `error_bound` (pruned mass / valid mass) is at
      most this, and 0 scores exactly;
    - `batch_size`: prompts per forward (None: the engine's default; the transformers engine's
      is, on CUDA, the largest batch the memory plan says fits, else 16);
    - `max_new_tokens`: > 0 also decodes a continuation of every prompt (generate mode), from the
      same prompt pass: greedy, or sampled at `temperature` > 0 (seeded by `seed`); a row stops
      at end of sequence or as soon as `settled(text so far)` says that more text cannot change
      its parsed answer (the study's stop rule), so a large budget costs little on rows that
      answer early."""

    epsilon: float = DEFAULT_EPSILON
    batch_size: int | None = None
    max_new_tokens: int = 0
    settled: Callable[[str], bool] | None = None
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epsilon < 0:
            raise ValueError("epsilon must be >= 0")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")


class GenerationKwargs(TypedDict, total=False):
    """`ScorerOptions`' generation keywords, for `**options: Unpack[GenerationKwargs]`."""

    max_new_tokens: int
    settled: Callable[[str], bool] | None
    temperature: float
    seed: int


class ScorerKwargs(GenerationKwargs, total=False):
    """Every `ScorerOptions` keyword, for `**options: Unpack[ScorerKwargs]` (`Engine.scorer`)."""

    epsilon: float
    batch_size: int | None


@dataclass
class ScorerStats:
    """Where a Scorer's work went: tokens run through the model and wall seconds, per phase.

    `trie_positions / prompts` is the trie's cost per prompt in token positions, the number to
    compare with the prompt length; `padding` counts the pad tokens of both phases. Every trie
    position also runs the LM head over the whole vocabulary (its normaliser and stop mass),
    which a prompt token does not: `head_seconds` says what that costs."""

    prompts: int = 0
    prompt_tokens: int = 0  # prompt tokens computed (a shared prefix once per cache miss)
    trie_positions: int = 0  # trie nodes fed to the model (each also gets an LM head)
    padding: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    trie_seconds: float = 0.0
    head_seconds: float = 0.0  # of trie_seconds: the LM head and vocabulary sums of trie nodes


@dataclass
class ScoreResult:
    """One prompt's answer distribution."""

    probs: np.ndarray  # normalised over the answer set
    valid_mass: float  # sum of the unnormalised answer probabilities
    error_bound: float  # pruned mass / valid_mass (0 when exact)
    greedy: str | None  # the greedy-equivalent answer (else the most probable)
    most_probable: str | None  # the most probable answer
    expected: float | None = None
    std: float | None = None
    generated: list[int] | None = None  # the continuation, when the scorer was asked for one

    def row(self, answers: AnswerSet) -> dict[str, Any]:
        """Flat columns for a results table: summary values, then `p::<answer>` for every answer."""
        row: dict[str, Any] = {
            "valid_mass": self.valid_mass,
            "greedy": self.greedy,
            "most_probable": self.most_probable,
            "error_bound": self.error_bound,
        }
        if answers.numeric:
            row["expected"], row["std"] = self.expected, self.std
        row.update({f"p::{a}": float(p) for a, p in zip(answers.answers, self.probs, strict=True)})
        return row


@runtime_checkable
class Scorer(Protocol):
    """Scores token-id prompts against one answer set; built by `Engine.scorer`.

    `max_new_tokens` may be changed on a copy (`copy.copy(scorer)`) to give that copy a
    generation budget; `stats` accumulates over every call."""

    answers: AnswerSet
    epsilon: float
    max_new_tokens: int
    stats: ScorerStats

    def score(
        self, prompts: Iterable[Sequence[int]], window: int = 4096, progress: Any = None
    ) -> Iterator[ScoreResult]:
        """One `ScoreResult` per prompt, in input order (with `generated` set when
        `max_new_tokens` > 0); `progress` (a tqdm-like bar) is updated per batch."""
        ...

    def generate(self, prompts: Sequence[Sequence[int]], progress: Any = None) -> list[list[int]]:
        """The continuation of every prompt (token ids), without the exact answer pass."""
        ...


@runtime_checkable
class HookableModel(Protocol):
    """What the mechanism asks of a hookable model (`Engine.hookable()`; the transformers
    engine's `LoadedModel`): its layers, device and dtype, the tokenizer, the Hugging Face module
    (`hf`, for the head count, the width and nnsight's block layout), the two hook libraries'
    views, and a `HookedScorer` for an answer set."""

    name: str
    n_layers: int
    device: Any
    dtype: Any
    tokenizer: Any
    hf: Any

    def encode(self, item: Item, as_string: bool = False) -> EncodedItem:
        """The item's token ids and span positions."""
        ...

    def enable_bridge(self) -> Any:
        """The TransformerLens bridge over `hf` (its hooks fire inside every later forward)."""
        ...

    def bridged(self, on: bool = True) -> AbstractContextManager[Any]:
        """`hf` with the bridge's modules (`on`) or its own for a `with` block, then as found."""
        ...

    @property
    def nnsight(self) -> Any:
        """The nnsight view of `hf`."""
        ...

    def scorer(self, answers: AnswerSet, **options: Unpack[ScorerKwargs]) -> HookedScorer:
        """The exact scorer of `answers` on this model."""
        ...


@runtime_checkable
class HookedScorer(Scorer, Protocol):
    """A `Scorer` whose passes hooks can reach: the mechanism's seam to the scoring engine.

    `score_batch` scores one batch; `prompt_context()` wraps its prompt pass and
    `answer_context(rows, nodes, valid)` each forward of its answer-trie pass (the trie nodes
    `nodes` fed for the batch rows `rows`), so that hooks attached there read and write the
    activations of prompt and answer positions (`probekit.mechanism.interventions`)."""

    model: HookableModel
    batch_size: int
    trie: Any

    def score_batch(
        self,
        batch: Sequence[Sequence[int]],
        reuse_prefix: bool = True,
        prompt_context: Callable[[], Any] | None = None,
        answer_context: Callable[[Any, Any, Any], Any] | None = None,
    ) -> list[ScoreResult]:
        """The results of one batch (one left-padded row per prompt without `reuse_prefix`)."""
        ...


@runtime_checkable
class Engine(Protocol):
    """One loaded model behind one engine."""

    engine: str  # the registry name: "hf", "vllm", ...
    name: str  # the model spec it was loaded from (`default`, a hub id, a path)

    def encode(self, item: Item, as_string: bool = False) -> EncodedItem:
        """The item's token ids and span positions."""
        ...

    def scorer(self, answers: AnswerSet, **options: Unpack[ScorerKwargs]) -> Scorer:
        """A scorer for `answers`; `options` are `ScorerOptions`' keywords (`epsilon`,
        `batch_size`, and the generation budget `max_new_tokens` with `settled`, `temperature`
        and `seed`), a bad value a `ValueError`."""
        ...

    def decode(self, tokens: Sequence[Sequence[int]]) -> list[str]:
        """Token ids back to text, special tokens skipped."""
        ...

    def hookable(self) -> Any:
        """The model the mechanism hooks into; `hooks_unavailable` where the engine has none."""
        ...

    def describe(self) -> dict[str, Any]:
        """Manifest fields: engine, model, model_source, weights, device, dtype."""
        ...


def windows(prompts: Iterable[Sequence[int]], size: int) -> Iterator[list[Sequence[int]]]:
    """`prompts` in consecutive lists of `size` (the last one shorter), read as they are needed:
    a scorer's `score` holds one window at a time, whatever the number of prompts."""
    window: list[Sequence[int]] = []
    for prompt in prompts:
        window.append(prompt)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def hooks_unavailable(engine: str) -> ProbekitError:
    """The one-line error an engine without hooks raises from `hookable()`."""
    return ProbekitError(
        f"the {engine} engine has no hookable model, and capture, patching and attribution need "
        "one; load the model with the hf engine"
    )
