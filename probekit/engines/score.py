"""One-call scoring for scripts: prompts in, a DataFrame of exact answer probabilities out.

`score` is `probekit score` as a function: the same encoder, scorer and columns, so a script and
the command give the same numbers for the same prompts, and the same checks: its options are
those of `probekit.engines.options.ScoreOptions` (and `quiet` of `ModelOptions`), with their
defaults, checks and help from the declarations the command's flags are made from
(`probekit.core.public`), so a bad value is the same one-line ProbekitError from both, naming
the keyword, and a misspelled keyword gets a "did you mean". A weak
signal (mean valid mass below `WEAK_SIGNAL_VALID_MASS`) and a prefill ending in whitespace are
warned about (`warnings.warn`; the command line prints the same line on stderr). The arithmetic
the scores were computed in, the precision tier picked by the tolerance (`--tolerance`,
`load_model(tolerance=)`) or forced by a dtype, is said on stderr and kept with the rows: the
table's `attrs["precision"]` (`probekit score`: the Parquet file's metadata, key
`probekit.precision`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import Item, parse_messages
from probekit.core.progress import progress, silenced
from probekit.core.prompts import read_prompts, unique_ids
from probekit.core.public import public
from probekit.core.signal import prefill_trap, weak_signal
from probekit.engines.base import Engine, describe_precision
from probekit.engines.options import ModelOptions, ScoreOptions, loaded_engine

SCORE_WINDOW = 4096
"""Prompts the scorer sorts and batches together (`Scorer.score`'s window)."""
Prompts = str | Path | Sequence[str | Sequence[Mapping[str, str]] | Item]
"""A prompt file, or prompts: each a string, a chat (a list of messages) or an `Item`; one list
may mix them."""


@public(ScoreOptions, ModelOptions, skip=("model",))
def score(
    model: str | Path | Engine,
    prompts: Prompts,
    answers: AnswerSet | str | Sequence[str | float],
    *,
    epsilon: float = 1e-4,
    prefill: str = "",
    batch_size: int | None = None,
    quiet: bool = False,
) -> pd.DataFrame:
    """Exact probability of every answer for every prompt, one row per prompt in input order.

    Parameters:
        model: a loaded model, or anything `load_model` takes (`"default"`, a Hugging Face id,
            a model directory, a `.gguf` file).
        prompts: one string (sent as one user message through the model's chat template), a
            list of strings, a list of chat-message lists (`[{"role": ..., "content": ...}]`),
            a list of `Item`s, or the path of a prompts JSONL file (as `probekit score` reads).

    Returns the columns of `probekit score`: `id`, `valid_mass`, `greedy`, `most_probable`,
    `error_bound`, `expected` and `std` (number answers only), then `p::<answer>` for every
    answer (normalised over the answer set). Bad values are one ProbekitError each; a
    prefill ending in whitespace and a mean valid mass below `WEAK_SIGNAL_VALID_MASS` are
    warned about.
    """
    if trap := prefill_trap(prefill):
        warnings.warn(trap, UserWarning, stacklevel=3)  # the caller of @public
    items = list(as_items(prompts, prefill))
    if not items:
        raise ProbekitError("no prompts to score")
    from probekit.engines import load_engine

    engine, answer_set = loaded_engine(model) or load_engine(model), answers  # checked by its kind
    with silenced(quiet), progress(len(items), "prompt", "score", "fewer prompts") as bar:
        ids = [engine.encode(item).input_ids for item in items]
        settle_and_say(engine, answer_set, ids[:SCORE_WINDOW])  # on a sample of the first window
        scorer = engine.scorer(answer_set, epsilon=epsilon, batch_size=batch_size)
        results = scorer.score(ids, window=SCORE_WINDOW, progress=bar)
        rows = [
            {"id": item.id, **r.row(answer_set)} for item, r in zip(items, results, strict=True)
        ]
    table = pd.DataFrame(rows)
    table.attrs["precision"] = engine.precision and dict(engine.precision)  # a copy
    if weak := weak_signal(float(table["valid_mass"].mean())):
        warnings.warn(weak, UserWarning, stacklevel=3)
    return table


def settle_and_say(engine: Engine, answers: AnswerSet, ids: Sequence[Sequence[int]]) -> None:
    """Settle the precision tier `engine` scores in on the prompts `ids`
    (`Engine.settle_precision`) and say it in one line on stderr (`describe_precision`; a tier
    measured now is said by the measurement's own line)."""
    chosen = "tier" in (engine.precision or {})
    record = engine.settle_precision(answers, ids)
    if record is not None and (chosen or not record.get("tried")):  # else said already
        print(f"probekit: {describe_precision(record)}", file=sys.stderr)


def as_items(prompts: Prompts, prefill: str = "") -> Iterator[Item]:
    """Items from any prompt form `score` accepts; ids are the list positions unless given, and
    each id once (a repeated one refused as in a prompt file)."""
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
    yield from unique_ids(enumerate(_as_item(i, p, prefill) for i, p in enumerate(prompts)))


def _as_item(index: int, prompt: Any, prefill: str) -> Item:
    """The item of prompt `index` of a Python list of prompts."""
    if isinstance(prompt, Item):
        return replace(prompt, id=prompt.id or str(index), prefill=prompt.prefill + prefill)
    if isinstance(prompt, str):
        return Item(str(index), messages=({"role": "user", "content": prompt},), prefill=prefill)
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        messages = parse_messages(list(prompt), f"prompt {index}")
        return Item(str(index), messages=messages, prefill=prefill)
    raise ProbekitError(
        f"prompt {index} is a {type(prompt).__name__}: give a string, a list of "
        "{'role', 'content'} messages or an Item"
    )
