"""Patching and capture from a script: the same rows as `probekit patch`, activations in memory.

    >>> import probekit.mechanism.api as mech
    >>> model = mech.hookable("default")
    >>> pair = mech.make_pair(model, "I am a Muslim. How sad am I, 0-10?",
    ...                       "I am a Jew. How sad am I, 0-10?", span="Muslim")
    >>> df = mech.patch(model, [pair], spans=["from_identity"], sites=["resid_pre"],
    ...                 layers=range(model.n_layers), readout="expected", answers="0-10")
    >>> ax = df.plot(x="layer", y="recovery", marker="o")  # the recovered share of the gap

Every wrong type (a list of prompts where pairs are expected, a string where a list is, an
unknown site) is one line of `ProbekitError`, before any forward pass; the keywords that are
options of `probekit patch` and `probekit capture` take their defaults, checks and help from
the same declarations (`probekit.mechanism.pipeline.PatchOptions`, `CaptureOptions`, through
`probekit.core.public`), so `layers=None` means what the command's default means, and a
misspelled keyword gets a "did you mean".
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem
from probekit.core.progress import silenced
from probekit.core.public import public
from probekit.core.shared_options import SeedOption
from probekit.engines.options import ModelOptions, ScoreOptions
from probekit.mechanism import capture as disk
from probekit.mechanism.pairs import as_sets, make_pair
from probekit.mechanism.patching import annotate, noise_line, summarise
from probekit.mechanism.pipeline import (
    CaptureOptions,
    PatchOptions,
    components,
    exact_scorer,
    measure,
)
from probekit.mechanism.readouts import Readout, parse_readout
from probekit.mechanism.sites import DEFAULT_SITES, chosen_layers

__all__ = ["capture", "hookable", "make_pair", "patch", "recovery"]


@public()
def hookable(model: Any) -> Any:
    """The hookable model of a loaded engine, or of anything `load_engine` takes (`"default"`,
    a Hugging Face id, a model directory, a `.gguf` file)."""
    if isinstance(model, str | Path):
        from probekit.engines import load_engine

        return load_engine(str(model)).hookable()
    if hasattr(model, "hookable"):
        return model.hookable()
    raise ProbekitError(f"model must be a loaded model or a model spec, got a {type(model)}")


@public(PatchOptions, ScoreOptions, ModelOptions, command="patch", skip=("readout", "model"))
def patch(
    model: Any,
    pairs: Sequence[Any],
    *,
    answers: AnswerSet | str | Sequence[str | float],
    spans: Sequence[str] | None = None,
    sites: Sequence[str] = DEFAULT_SITES,
    layers: Sequence[int] | range | None = None,
    readout: str | Readout = "expected",
    method: str = "exact",
    heads: Sequence[int] | None = None,
    top_k: int = 20,
    hooks: str = "transformer_lens",
    batch_size: int | None = None,
    through_answer: bool | None = None,
    distributions: bool = False,
    progress: bool = True,
    quiet: bool = False,
) -> pd.DataFrame:
    """The patching table of `probekit patch` for these pairs: one row per (pair, component).

    Parameters:
        model: a loaded model or a model spec (see `hookable`).
        pairs: (clean, corrupt) pairs of encoded prompts (`make_pair`, a study's `pairs`), one
            such pair, or a study's sets of pairs (`probekit.mechanism.pairs.PairSet`); without
            `spans`, every span their prompts declare is patched.
        readout: the per-prompt readout (`expected`, `p:<answer>`, `p_correct`, `X - Y`, `tv`)
            or a `Readout`.
        through_answer: a span that runs to the end (`from_<span>`, `answer`) also patches
            every answer position, so patching from a span on at any layer gives the clean run
            (default: yes with `transformer_lens`; nnsight reaches the prompt only). False
            patches the prompt positions only.
        distributions: also the valid mass and answer probabilities of the clean, corrupt and
            patched runs (`valid_mass_clean`, `probs_clean`, ...; answers in `df.attrs`).
        progress: the progress of the patched runs (`probekit.core.progress`: a bar on a
            terminal, lines in a log); `quiet` is the same as `progress=False`.

    Returns the columns of `patching.parquet` (see `probekit.mechanism.patching.sweep`), one row
    per (pair, component): `unit`, `layer`, `site`, `head`, `span`, `status` (`measured`, or
    `not run` / `trivial`: known by construction), `<m>_clean`, `<m>_corrupt`, `<m>_patched`,
    `gap`, `recovery`, `small_gap`, ..., and `reading`, a line reading a recovery outside
    [0, 1] beyond the run's noise (or a gap within it), `valid_mass_patched`. A component whose
    patched runs keep less than 5 % of their probability in the answer set on average is a
    weak signal: `df.attrs["weak_signal"]` names them, also as a warning. Over several pairs
    each row also holds its component's recovery over the pairs with its bootstrap interval
    over the pairs' units (`recovery_over_pairs`, `recovery_over_pairs_low`,
    `recovery_over_pairs_high`; no interval for pairs on one unit, no recovery for one pair),
    and `df.attrs["note"]` says which; `recovery(df)` gives the same per component.
    """
    model = hookable(model)
    sets = as_sets(pairs, model.encode)
    pairs = [pair for found in sets for pair in found.pairs]
    measured = readout if isinstance(readout, Readout) else parse_readout(readout, answers)
    patches = components(model, pairs, layers, sites, spans or pairs[0][0].item.span_names, heads)
    model.settle_precision(answers, [p.input_ids for pair in pairs for p in pair])
    scorer = exact_scorer(model, answers, batch_size)
    with silenced(quiet):
        table = measure(
            scorer,
            sets,
            patches,
            measured,
            method=method,
            top_k=top_k,
            hooks=hooks,
            batch_size=batch_size,
            say=lambda line: None,
            through_answer=through_answer,
            progress=progress and not quiet,
            distributions=distributions,
        )
    annotated = annotate(table)
    if weak := annotated.attrs.get("weak_signal"):
        warnings.warn(weak, UserWarning, stacklevel=3)  # the caller of @public
    return annotated


@public(SeedOption)
def recovery(
    table: pd.DataFrame, n: int = 1000, *, seed: int = 0, level: float = 0.95
) -> pd.DataFrame:
    """Each component's recovery over the pairs of a `patch` table: the mean patched effect over
    the mean gap, with its bootstrap interval over the pairs' units (`recovery_low`,
    `recovery_high`; none with one unit), the mean effect with its interval, the sign-flip p
    over units and its Holm adjustment over the components (`p_value`, `p_adjusted`), `status`,
    `pairs`, `units`, and `pairs_in_noise` (pairs whose gap is within the run's numeric noise,
    left out of the ratio; the line saying so is `df.attrs["note"]`), and `reading`, a line
    reading a recovery whose interval lies outside [0, 1] (`probekit.mechanism.patching`)."""
    if not isinstance(table, pd.DataFrame) or "gap" not in table:
        raise ProbekitError("recovery takes the table probekit.patch returns")
    out = summarise(table, n=n, seed=seed, level=level)
    out = out.sort_values(["span", "site", "layer"], kind="stable").reset_index(drop=True)
    out.attrs["note"] = noise_line(table) or ""
    return out


@public(CaptureOptions, ModelOptions, command="capture", skip=("model", "out"))
def capture(
    model: Any,
    prompts: Any,
    *,
    sites: Sequence[str] = DEFAULT_SITES,
    layers: Sequence[int] | range | None = None,
    spans: Sequence[str] | None = None,
    out: str | Path | None = None,
    hooks: str = "transformer_lens",
    batch_size: int = 8,
    storage_dtype: torch.dtype = disk.STORAGE_DTYPE,
    quiet: bool = False,
) -> disk.Activations:
    """Activations of `prompts` at `sites` and `layers` over their spans, in memory.

    Parameters:
        model: a loaded model or a model spec (see `hookable`).
        prompts: one string, a list of strings, chat-message lists, `Item`s or encoded prompts,
            or a prompts JSONL path (as `probekit.score` takes them); a plain string has one
            span, `answer` (its last token). With `out`, resumable safetensors shards are
            written there too (`probekit capture`'s format, in `storage_dtype`), and the activations
            returned are read back from it.
        storage_dtype: the dtype the shards written to `out` store activations in (the
            model's own dtype is the model's).

    Returns `Activations`: `acts["blocks.3.hook_resid_pre"]` is [rows, d_model] (float32 in
    memory), `acts.at(hook, prompt_id, span)` one prompt's span, `acts.index` the rows.
    """
    model = hookable(model)
    encoded = encode_prompts(model, prompts, "capture")
    chosen = chosen_layers(model, layers, "capture")
    asked = (sites, spans, hooks, batch_size)
    with silenced(quiet):
        if out is None:
            return disk.read_spans(model, encoded, chosen, *asked)
        disk.capture(model, encoded, out, chosen, *asked, storage_dtype=storage_dtype)
    return disk.read_activations(out, [item.id for item in encoded])


def encode_prompts(model: Any, prompts: Any, purpose: str) -> list[EncodedItem]:
    """`prompts` in any form `probekit.score` takes (or items `model` already encoded), encoded
    by `model`; none at all is one line naming what they were for (`purpose`: capture, steer)."""
    if (
        isinstance(prompts, Sequence)
        and prompts
        and all(isinstance(p, EncodedItem) for p in prompts)
    ):
        return list(prompts)
    from probekit.engines.score import as_items

    items = list(as_items(prompts))
    if not items:
        raise ProbekitError(f"no prompts to {purpose}")
    return [model.encode(item) for item in items]
