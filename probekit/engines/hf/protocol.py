"""What the transformers engine's parts read of a loaded model (`HFModel`), declared below them:
the scorer and its prompt, trie and decoding passes, the LM head, the batch plan and the
precision tiers take an `HFModel`, so none of them imports `probekit.engines.hf.model` (which
imports them to load and score). `LoadedModel` is the implementation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Unpack

if TYPE_CHECKING:
    import torch

    from probekit.core.answers import AnswerSet
    from probekit.engines.base import Scorer, ScorerKwargs


class HFModel(Protocol):
    """A Hugging Face causal LM as loaded: the module (`hf`), its tokenizer, where and in which
    dtype it runs (the precision tiers change `dtype` and `meta` in place), and its exact
    scorer."""

    hf: Any
    tokenizer: Any
    name: str
    device: torch.device
    dtype: torch.dtype
    meta: dict[str, Any]

    @property
    def dispatched(self) -> bool:
        """Whether a device map placed the model over several devices."""
        ...

    def scorer(self, answers: AnswerSet, **options: Unpack[ScorerKwargs]) -> Scorer:
        """The exact scorer of `answers` on this model."""
        ...
