"""One-call scoring for scripts: prompts in, a DataFrame of exact answer probabilities out.

`score` is `probekit score` as a function: the same encoder, scorer and columns, so a script and
the command give the same numbers for the same prompts, and the same checks: its arguments are
those of `probekit.engines.options.ScoreOptions`, checked by the same declarations as the
command's flags (`probekit.core.options.checked`), so a bad value is the same one-line
ProbekitError from both, naming the keyword, and a misspelled keyword gets a "did you mean". A weak
signal (mean valid mass below `WEAK_SIGNAL_VALID_MASS`) and a prefill ending in whitespace are
warned about (`warnings.warn`; the command line prints the same line on stderr).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.answers import AnswerSet, as_answer_set
from probekit.core.errors import ProbekitError
from probekit.core.items import Item
from probekit.core.options import checked
from probekit.core.progress import progress, silenced
from probekit.core.prompts import parse_messages, read_prompts
from probekit.core.signal import prefill_trap, weak_signal
from probekit.engines.options import ScoreOptions

Prompts = str | Path | Sequence[str] | Sequence[Sequence[Mapping[str, str]]] | Sequence[Item]


@checked(ScoreOptions)
def score(
    model: Any,
    prompts: Prompts,
    answers: AnswerSet | str | Sequence[str | float],
    *,
    epsilon: float = 1e-4,
    prefill: str | None = None,
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
        answers: an `AnswerSet`, a spec (`0-100`, `A-E`, `A,B,C`, `@file`) or a list of
            strings or numbers (`["yes", "no"]`, `[1, 2, 3]`).
        epsilon: pruning bound; every row's `error_bound` is at most this (0: exact).
        prefill: text forced at the start of every response (e.g. `"[["`).
        batch_size: prompts per forward pass (default: 16 on a CPU; on a GPU the largest batch
            the memory plan says fits, counted in tokens).
        quiet: no progress (by default a bar on a terminal, lines in a log, and after the
            first batch the time the call will take: `probekit.core.progress`).

    Returns the columns of `probekit score`: `id`, `valid_mass`, `greedy`, `most_probable`,
    `error_bound`, `expected` and `std` (number answers only), then `p::<answer>` for every
    answer (normalised over the answer set). Bad values are one ProbekitError each; a
    prefill ending in whitespace and a mean valid mass below `WEAK_SIGNAL_VALID_MASS` are
    warned about.
    """
    answer_set = as_answer_set(answers)
    if trap := prefill_trap(prefill or ""):
        warnings.warn(trap, UserWarning, stacklevel=3)  # the caller of @checked
    items = list(as_items(prompts, prefill or ""))
    if not items:
        raise ProbekitError("no prompts to score")
    with silenced(quiet), progress(len(items), "prompt", "score", "fewer prompts") as bar:
        frames = score_frames(
            model, items, answer_set, epsilon=epsilon, batch_size=batch_size, progress=bar
        )
        table = pd.concat(list(frames), ignore_index=True)
    if weak := weak_signal(float(table["valid_mass"].mean())):
        warnings.warn(weak, UserWarning, stacklevel=3)
    return table


def score_frames(
    model: Any,
    items: Iterable[Item],
    answers: AnswerSet | str | Sequence[str | float],
    *,
    epsilon: float = 1e-4,
    batch_size: int | None = None,
    window: int = 4096,
    progress: Any = None,
) -> Iterator[pd.DataFrame]:
    """`score`'s rows, a DataFrame per `window` items (bounded memory for large files). Before
    the first is scored, a model whose precision tier is not chosen yet gets it on a sample of
    the first window (`probekit.engines.hf.tiers.settle_precision`)."""
    from probekit.engines import load_engine
    from probekit.engines.base import windows
    from probekit.engines.hf.tiers import settle_precision

    engine = load_engine(model) if isinstance(model, str) else model
    if not hasattr(engine, "scorer") or not hasattr(engine, "encode"):
        raise ProbekitError(
            f"model must be a loaded model or a model spec (`default`, a hub id, a folder, a "
            f".gguf file); got {type(model).__name__}"
        )
    answer_set = as_answer_set(answers)
    scorer = None
    for chunk in windows(items, window):
        ids = [engine.encode(item).input_ids for item in chunk]
        if scorer is None:
            settle_precision(engine, answer_set, ids)
            scorer = engine.scorer(answer_set, epsilon=epsilon, batch_size=batch_size)
        results = scorer.score(ids, window=len(ids), progress=progress)
        rows = [
            {"id": item.id, **r.row(answer_set)} for item, r in zip(chunk, results, strict=True)
        ]
        yield pd.DataFrame(rows)


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


@checked(ScoreOptions)
def score_file(
    model: Any,
    prompts: str | Path,
    out: str | Path,
    answers: AnswerSet | str | Sequence[str | float],
    *,
    epsilon: float = 1e-4,
    prefill: str = "",
    batch_size: int | None = None,
    quiet: bool = False,
    **load: Any,
) -> Path:
    """`probekit score` as a function: the prompts of a JSONL file (`{"id", "messages"}` or
    `{"id", "text"}` a line) scored as `score` scores them, their rows streamed to the Parquet
    file `out` (atomically: it appears whole or not at all; memory stays flat however long the
    file), the columns of `score`. Every line is checked before the model loads.

    `model`: a loaded model, or a spec loaded with `load` (`load_engine`'s keywords: `device`,
    `dtype`, ...); the other arguments are `score`'s. A prefill ending in whitespace and a mean
    valid mass below `WEAK_SIGNAL_VALID_MASS` are warned about (`warnings.warn`). Returns
    `out`."""
    from probekit.core.io import ParquetStream
    from probekit.engines import load_engine

    answer_set = as_answer_set(answers)
    if trap := prefill_trap(prefill):
        warnings.warn(trap, UserWarning, stacklevel=3)  # the caller of @checked
    total = sum(1 for _ in read_prompts(prompts))  # every line checked before any work
    if total == 0:
        raise ProbekitError(f"prompt file '{prompts}' has no prompts")
    engine = load_engine(model, **load) if isinstance(model, str | Path) else model
    masses: list[float] = []
    with (
        silenced(quiet),
        ParquetStream(out) as stream,
        progress(total, "prompt", "score", "fewer prompts in the file") as bar,
    ):
        items = read_prompts(prompts, prefill)
        frames = score_frames(
            engine, items, answer_set, epsilon=epsilon, batch_size=batch_size, progress=bar
        )
        for frame in frames:
            stream.write(frame)
            masses += frame["valid_mass"].tolist()
    if masses and (weak := weak_signal(sum(masses) / len(masses))):
        warnings.warn(weak, UserWarning, stacklevel=3)
    return Path(out)
