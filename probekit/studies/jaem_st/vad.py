"""Affective empathy (AE) as the paper scores it: valence, arousal and dominance from a lexicon.

The lexicon is a file in the NRC VAD format (`word<TAB>valence<TAB>arousal<TAB>dominance`, one
entry a line, an optional header line `Word  Valence  Arousal  Dominance`); the NRC lexicon
itself is not shipped (its licence), it is given with `--vad-lexicon PATH`. A text's VAD is the
mean over its lower-cased words found in the lexicon (single words; multi-word entries never
match); the AE distance of a response is, per dimension, |VAD(input) - VAD(response)| (lower is
better, as in the paper), NaN when either text has no lexicon word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from probekit.core.errors import ProbekitError
from probekit.core.text import read_text

DIMENSIONS = ("valence", "arousal", "dominance")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


@dataclass(frozen=True)
class VadLexicon:
    """word -> (valence, arousal, dominance)."""

    entries: dict[str, tuple[float, float, float]]

    def text_vad(self, text: str) -> np.ndarray:
        """Mean (valence, arousal, dominance) of the text's words in the lexicon (NaN if none)."""
        found = [self.entries[w] for w in _WORD.findall(text.lower()) if w in self.entries]
        return np.mean(found, axis=0) if found else np.full(len(DIMENSIONS), np.nan)

    def distance(self, source: str, response: str) -> dict[str, float]:
        """Per dimension, |VAD(source) - VAD(response)|."""
        gap = np.abs(self.text_vad(source) - self.text_vad(response))
        return {f"vad_{name}": float(v) for name, v in zip(DIMENSIONS, gap, strict=True)}


def read_vad_lexicon(path: str | Path) -> VadLexicon:
    """Read an NRC-format VAD lexicon; a malformed line is refused with its number."""
    entries: dict[str, tuple[float, float, float]] = {}
    for number, line in enumerate(read_text(Path(path)).splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if number == 1 and [f.strip().lower() for f in fields[1:]] == list(DIMENSIONS):
            continue  # the header
        try:
            if len(fields) != 4 or not fields[0].strip():
                raise ValueError
            values = tuple(float(f) for f in fields[1:])
        except ValueError:
            raise ProbekitError(
                f"{path}, line {number}: expected 'word<TAB>valence<TAB>arousal<TAB>dominance', "
                f"got {line[:60]!r}"
            ) from None
        entries[fields[0].strip().lower()] = values  # type: ignore[assignment]
    if not entries:
        raise ProbekitError(f"the VAD lexicon {path} holds no entry")
    return VadLexicon(entries)
