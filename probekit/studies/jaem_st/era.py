"""Response appropriateness (ERA): EPITOME's three levels over (speaker utterance, response) pairs.

EPITOME (Sharma et al. 2020) scores a response with three fine-tuned RoBERTa bi-encoders,
Interpretations (IP), Explorations (EX) and Emotional Reactions (ER), each giving a level 0, 1
or 2; its inputs are lower-cased and each side is truncated to 64 tokens. probekit ships no such
model. `--era-model` takes either a folder holding EPITOME's three fine-tuned state dicts (loaded
by `epitome.py`) or `package.module:factory`, where `factory()` returns any classifier behind
`PairClassifier` (it owns its tokenizer and truncation). Without one, ERA is skipped with
`skip_message()`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

import probekit.studies.jaem_st.epitome as epitome
from probekit.core.errors import ProbekitError
from probekit.core.options import given


def skip_message() -> str:
    """The line saying that ERA is skipped, naming the option in the caller's words."""
    folder = given("era_model", "FOLDER", placeholder=True)
    factory = given("era_model", "package.module:factory", placeholder=True)
    return (
        f"ERA skipped: no pair classifier given; pass {folder} (EPITOME's finetuned_IP.pth, "
        f"finetuned_EX.pth, finetuned_ER.pth) or {factory} (a factory returning an object with "
        "levels(pairs) -> one {IP, EX, ER: 0-2} dict per pair)"
    )


class PairClassifier(Protocol):
    """Scores (speaker utterance, response) pairs: one {IP, EX, ER} -> level dict per pair."""

    def levels(self, pairs: Sequence[tuple[str, str]]) -> list[dict[str, int]]: ...


def check_spec(spec: str) -> None:
    """Refuse, before any run, an `--era-model` that cannot be loaded (the classifier itself
    is built only when the responses are scored)."""
    if Path(spec).is_dir():
        if missing := [f for f in epitome.FILES.values() if not (Path(spec) / f).is_file()]:
            raise ProbekitError(
                f"{given('era_model', spec)}: the folder lacks {', '.join(missing)}"
            )
        return
    _factory(spec)


def load_classifier(spec: str, device: str | None = None) -> PairClassifier:
    """EPITOME's classifiers for a folder; else what `factory()` returns for a spec
    `package.module:factory`."""
    if Path(spec).is_dir():
        return epitome.load_epitome(spec, device)
    return _factory(spec)()


def _factory(spec: str) -> Callable[[], PairClassifier]:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ProbekitError(
            f"{given('era_model', spec)} must be a folder with EPITOME's state dicts or look like "
            "package.module:factory"
        )
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ProbekitError(f"{given('era_model', spec)} cannot be loaded: {err}") from err


def score_pairs(
    classifier: PairClassifier, utterances: Sequence[str], responses: Sequence[str]
) -> pd.DataFrame:
    """Levels per pair as columns `era_IP`, `era_EX`, `era_ER`; both sides lower-cased as
    EPITOME's inputs; an empty response is not scored (NaN)."""
    keep = [i for i, r in enumerate(responses) if r.strip()]
    out = pd.DataFrame(
        np.nan, index=range(len(responses)), columns=[f"era_{d}" for d in epitome.DIMENSIONS]
    )
    if not keep:
        return out
    pairs = [(utterances[i].lower(), responses[i].lower()) for i in keep]
    levels = classifier.levels(pairs)
    if len(levels) != len(pairs):
        raise ProbekitError(f"the ERA classifier returned {len(levels)} results for {len(pairs)}")
    for i, row in zip(keep, levels, strict=True):
        for dim in epitome.DIMENSIONS:
            level = row.get(dim)
            if level not in (0, 1, 2):
                raise ProbekitError(f"the ERA classifier gave {dim} = {level!r}, not 0, 1 or 2")
            out.loc[i, f"era_{dim}"] = level
    return out
