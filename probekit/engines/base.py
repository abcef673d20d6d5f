"""The engine seam: what the run loop, the commands, the mechanism and the benchmarks may ask of
whatever runs a model, and the engine-neutral results that cross it.

An `Engine` encodes items into token ids, builds a `Scorer` for an answer set (it scores token-id
prompts exactly and, given a token budget, generates continuations: the paper-faithful view; its
options are the fields of `probekit.engines.options.ScorerOptions`), decodes tokens back to
text, describes itself for run manifests, and, where it has one, hands out the hookable model
the mechanism needs. Its arithmetic stays behind the seam too (`Precision`): the precision tier,
chosen once by the error it causes or kept from a resumed run, and the noise figure a run
reports. The transformers engine (`engines/hf/`) does all of it; an engine without hooks (vLLM)
raises `hooks_unavailable(...)` from `hookable()`, and one without tiers inherits `Engine`'s
answers (nothing to choose, no noise figure).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem, Item
from probekit.core.public import public

ENGINES: dict[str, str] = {
    "hf": "probekit.engines.hf.model:load_model",
    "vllm": "probekit.engines.vllm:load_vllm",
}
"""The registered engines: name -> `module:loader` (`probekit.engines.load_engine`)."""


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


@public()
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
        summary = ["valid_mass", "greedy", "most_probable", "error_bound"]
        summary += ["expected", "std"] if answers.numeric else []
        row = {name: getattr(self, name) for name in summary}
        return row | {f"p::{a}": float(p) for a, p in zip(answers.answers, self.probs, strict=True)}

    @classmethod
    def from_row(cls, row: Mapping[str, Any], answers: AnswerSet) -> ScoreResult:
        """The result a results-table row was written from (`row`'s inverse)."""
        return cls(
            probs=np.array([row[f"p::{a}"] for a in answers.answers], dtype=float),
            valid_mass=float(row["valid_mass"]),
            error_bound=float(row["error_bound"]),
            greedy=row["greedy"],
            most_probable=row["most_probable"],
            expected=row.get("expected"),
            std=row.get("std"),
        )


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


TIER_LABELS = {
    "float16+head": "float16, LM head included (float32 final norm and sums)",
    "bfloat16+head": "bfloat16, LM head included (float32 final norm and sums)",
    "tf32+head": "float32 with TF32 matmuls, LM head included",
    "float16": "float16 (float32 final norm and LM head)",
    "bfloat16": "bfloat16 (float32 final norm and LM head)",
    "tf32": "float32 with TF32 matmuls",
    "float32": "float32",
}
"""The precision tiers' names in words (`probekit.engines.hf.precision.TIERS`); a tier of
another engine reads as its name."""


@runtime_checkable
class Precision(Protocol):
    """The arithmetic a model scores in, chosen behind the seam. The bodies here are the answers
    of a model without tiers (it scores as loaded: no record, nothing to choose or keep); the
    transformers engine chooses among its tiers (`probekit.engines.hf.precision`)."""

    @property
    def precision(self) -> dict[str, Any] | None:
        """The precision record (the tier, the tolerance it was chosen by, what was offered,
        measured and tried; in the run manifest), None where there is none."""
        return None

    def settle_precision(
        self, answers: AnswerSet, prompts: Sequence[Sequence[int]], seed: int = 0
    ) -> dict[str, Any] | None:
        """The tier, chosen once before scoring on a seeded sample of `prompts` (token ids) by
        the tolerance the model was loaded with: the record (kept, and the same on a later
        call), None for a model without tiers."""
        return None

    def keep_precision(
        self, record: Mapping[str, Any], why: str = "kept from the run being resumed"
    ) -> dict[str, Any] | None:
        """Put a model whose tier is not chosen yet in the tier of `record` (the run it resumes,
        a Ray driver's choice, the first model of a run of several) without measuring: the
        record kept, its `note` saying `why`; None where that does not apply (no tiers, a tier
        chosen already, a tier this device does not offer)."""
        return None


@runtime_checkable
class Engine(Precision, Protocol):
    """One loaded model behind one engine. An engine class may subclass this protocol to take
    its bodies: those of `Precision` and `noise_figure` (an engine without tiers)."""

    engine: str  # the registry name: "hf", "vllm", ...
    name: str  # the model spec it was loaded from (`default`, a hub id, a path)

    def encode(self, item: Item, as_string: bool = False) -> EncodedItem:
        """The item's token ids and span positions."""
        ...

    def scorer(self, answers: AnswerSet, **options: Any) -> Scorer:
        """A scorer for `answers`; `options` are the fields of
        `probekit.engines.options.ScorerOptions` (`epsilon`, `batch_size`, and the generation
        budget `max_new_tokens` with `settled`, `temperature` and `seed`), a bad value one line
        naming it."""
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

    def noise_figure(
        self,
        prompts: Sequence[Sequence[int]],
        answers: AnswerSet,
        *,
        seed: int,
        epsilon: float,
        own: Sequence[ScoreResult] | None = None,
    ) -> dict[str, Any]:
        """How far the exact scores of `prompts` (token ids) move when scored again in a wider
        arithmetic at `epsilon`; `own`: the run's results of these prompts, not scored again.
        The manifest's `numerics`: the dtypes and the largest differences, or a `note` saying
        why there are none."""
        return {"dtype": str(self.describe().get("dtype")), "note": "not measured"}


@runtime_checkable
class HookableModel(Engine, Protocol):
    """What the mechanism asks of a hookable model (`Engine.hookable()`; the transformers
    engine's `LoadedModel`): its layers, device and dtype, the tokenizer, the Hugging Face module
    (`hf`, for the head count, the width and nnsight's block layout), the two hook libraries'
    views, and a `HookedScorer` for an answer set. The transformers engine's own parts (its
    passes, LM head, batch plan and precision tiers) take one too, and read `meta` (the load's
    and the precision tier's record, changed in place with `dtype` by the tiers) and
    `dispatched` (a device map placed it over several devices)."""

    n_layers: int
    device: Any
    dtype: Any
    tokenizer: Any
    hf: Any
    meta: dict[str, Any]

    @property
    def dispatched(self) -> bool:
        """Whether a device map placed the model over several devices."""
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

    def scorer(self, answers: AnswerSet, **options: Any) -> HookedScorer:
        """The exact scorer of `answers` on this model (`options`: `ScorerOptions`' fields)."""
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

    def answer_mass(self, batch: Sequence[Sequence[int]]) -> Any:
        """The unnormalised answer probabilities [rows, answers] of a batch (a float64 tensor),
        differentiable in every activation of the prompts: what attribution differentiates."""
        ...

    def read_nodes(self, hidden: Any) -> tuple[Any, Any, Any]:
        """The residual stream at the trie's nodes ([rows, nodes, d_model]; node 0 the prompt's
        last position) through the model's final norm and LM head: log P(node) [rows, nodes],
        the stop log-probs [rows, nodes, rule] (what `TrieTables.answer_probs` multiplies) and
        each node's most likely next token; what the logit lens reads at every layer."""
        ...


def windows(prompts: Iterable[Sequence[int]], size: int) -> Iterator[list[Sequence[int]]]:
    """`prompts` in consecutive lists of `size` (the last one shorter), read as they are needed:
    a scorer's `score` holds one window at a time, whatever the number of prompts."""
    remaining, size_or_all = iter(prompts), size if size > 0 else None
    while window := list(itertools.islice(remaining, size_or_all)):
        yield window


def hooks_unavailable(engine: str) -> ProbekitError:
    """The one-line error an engine without hooks raises from `hookable()`."""
    return ProbekitError(
        f"the {engine} engine has no hookable model, and capture, patching and attribution need "
        "one; load the model with the hf engine"
    )


def describe_precision(record: Mapping[str, Any]) -> str:
    """One line about a precision record: the tier, the tolerance, what was measured and tried."""
    tier = TIER_LABELS.get(record.get("tier", ""), str(record.get("tier")))
    if "tolerance" not in record:
        return f"precision: {tier} ({record.get('note', 'given')})"
    head = f"precision: {tier} for tolerance {record['tolerance']:g}"
    tried = record.get("tried") or []
    if not tried:
        return f"{head} ({record.get('note', 'nothing measured')})"
    parts = [f"{TIER_LABELS.get(t['tier'], t['tier'])} {_outcome(t)}" for t in tried]
    line = f"{head}; on {record['sample']} prompts against float32: {'; '.join(parts)}"
    if "fallback" in record:
        line += f"; on overflow: {TIER_LABELS.get(record['fallback'], record['fallback'])}"
    return line


def _outcome(trial: Mapping[str, Any]) -> str:
    """What one tier's measurement found, for `describe_precision`."""
    if "failed" in trial:
        return f"did not run ({trial['failed']})"
    if "overflow" in trial:
        return f"overflowed on {trial['overflow']} prompt(s)"
    verdict = "accepted" if trial["accepted"] else "over the tolerance"
    return f"moves an answer probability by {trial['max_prob_diff']:.2g} ({verdict})"
