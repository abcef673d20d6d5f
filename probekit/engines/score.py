"""One-call scoring for scripts: prompts in, a DataFrame of exact answer probabilities out.

`score` is `probekit score` as a function: the same encoder, scorer and columns, so a script and
the command give the same numbers for the same prompts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import Item
from probekit.core.prompts import parse_messages, read_prompts

Prompts = str | Path | Sequence[str] | Sequence[Sequence[Mapping[str, str]]] | Sequence[Item]


def score(
    model: Any,
    prompts: Prompts,
    answers: AnswerSet | str,
    *,
    epsilon: float = 1e-4,
    prefill: str | None = None,
    batch_size: int | None = None,
) -> pd.DataFrame:
    """Exact probability of every answer for every prompt, one row per prompt in input order.

    Parameters:
        model: a loaded model, or anything `load_model` takes (`"default"`, a Hugging Face id,
            a model directory, a `.gguf` file).
        prompts: one string (sent as one user message through the model's chat template), a
            list of strings, a list of chat-message lists (`[{"role": ..., "content": ...}]`),
            a list of `Item`s, or the path of a prompts JSONL file (as `probekit score` reads).
        answers: an `AnswerSet` or a spec: `0-100`, `A-E`, `A,B,C`, `@file`.
        epsilon: pruning bound; every row's `error_bound` is at most this (0: exact).
        prefill: text forced at the start of every response (e.g. `"[["`).
        batch_size: prompts per forward pass (default: 16 on CPU, 64 on GPU).

    Returns the columns of `probekit score`: `id`, `valid_mass`, `argmax`, `mode`,
    `error_bound`, `expected` and `std` (number answers only), then `p::<answer>` for every
    answer (normalised over the answer set).
    """
    items = list(as_items(prompts, prefill or ""))
    if not items:
        raise ProbekitError("no prompts to score")
    frames = list(score_frames(model, items, answers, epsilon=epsilon, batch_size=batch_size))
    return pd.concat(frames, ignore_index=True)


def score_frames(
    model: Any,
    items: Iterable[Item],
    answers: AnswerSet | str,
    *,
    epsilon: float = 1e-4,
    batch_size: int | None = None,
    window: int = 4096,
    progress: Any = None,
) -> Iterator[pd.DataFrame]:
    """`score`'s rows, a DataFrame per `window` items (bounded memory for large files)."""
    from probekit.engines import load_engine

    engine = load_engine(model) if isinstance(model, str) else model
    answer_set = answers if isinstance(answers, AnswerSet) else AnswerSet.parse(answers)
    scorer = engine.scorer(answer_set, epsilon=epsilon, batch_size=batch_size)
    chunk: list[Item] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == window:
            yield _score_chunk(engine, scorer, chunk, answer_set, progress)
            chunk = []
    if chunk:
        yield _score_chunk(engine, scorer, chunk, answer_set, progress)


def _score_chunk(
    engine: Any, scorer: Any, chunk: list[Item], answers: AnswerSet, progress: Any
) -> pd.DataFrame:
    ids = [engine.encode(item).input_ids for item in chunk]
    results = scorer.score(ids, window=len(ids), progress=progress)
    rows = [{"id": item.id, **r.row(answers)} for item, r in zip(chunk, results, strict=True)]
    return pd.DataFrame(rows)


def as_items(prompts: Prompts, prefill: str = "") -> Iterator[Item]:
    """Items from any prompt form `score` accepts; ids are the list positions unless given."""
    if isinstance(prompts, Path) or (
        isinstance(prompts, str) and prompts.endswith(".jsonl") and "\n" not in prompts
    ):
        yield from read_prompts(prompts, prefill)
        return
    if isinstance(prompts, str):
        prompts = [prompts]
    if isinstance(prompts, Item | Mapping) or not isinstance(prompts, Sequence):
        raise ProbekitError(
            f"prompts must be a string, a list of strings, of chat-message lists or of Items, or "
            f"a .jsonl path; got {type(prompts).__name__}"
        )
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, Item):
            yield replace(prompt, id=prompt.id or str(index), prefill=prompt.prefill + prefill)
        elif isinstance(prompt, str):
            yield Item(str(index), messages=({"role": "user", "content": prompt},), prefill=prefill)
        elif isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
            messages = parse_messages(list(prompt), f"prompt {index}")
            yield Item(str(index), messages=messages, prefill=prefill)
        else:
            raise ProbekitError(
                f"prompt {index} is a {type(prompt).__name__}: give a string, a list of "
                "{'role', 'content'} messages or an Item"
            )
