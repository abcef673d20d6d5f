"""EPITOME's three empathy classifiers (Sharma et al. 2020) from their fine-tuned state dicts.

`--era-model FOLDER` with `finetuned_IP.pth`, `finetuned_EX.pth` and `finetuned_ER.pth` (the files
EPITOME's authors distribute, loaded by the JaEm authors' `diff_epitome.py`). Each is a bi-encoder
re-stated here from EPITOME's published architecture: a seeker RoBERTa and a response RoBERTa;
the response's hidden states attend (one head, no mask) to the seeker's and are added to
themselves; the first response position goes through dense -> ReLU -> 3 logits; the level is
the argmax (0, 1, 2). The rationale head and the unused norm are kept only so that the state
dict loads strictly. The encoder sizes are read from the state dict (heads = hidden / 64, as
roberta-base). Inputs: lower-cased (`era.score_pairs`), each side tokenized by the RoBERTa
tokenizer with special tokens and truncated to `MAX_TOKENS`, one pair at a time as the JaEm
authors score them (so no padding ever reaches the unmasked attention). The tokenizer is read from
FOLDER when it holds one (`tokenizer.json` or `vocab.json` + `merges.txt`), else `roberta-base`
from the Hugging Face cache or hub.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from probekit.core.errors import ProbekitError

DIMENSIONS = ("IP", "EX", "ER")
FILES = {dim: f"finetuned_{dim}.pth" for dim in DIMENSIONS}
MAX_TOKENS = 64
TOKENIZER = "roberta-base"
_LAYER = re.compile(r"seeker_encoder\.roberta\.encoder\.layer\.(\d+)\.")


class EpitomeBiEncoder(nn.Module):
    """One EPITOME classifier (IP, EX or ER) in evaluation mode: logits over levels 0-2. Its
    parts are named as in EPITOME's state dict: two RoBERTa encoders, a one-head attention
    (`attn`: q, k, v and out projections), an unused `norm` and rationale classifier, and the
    empathy head (dense -> ReLU -> out_proj on the first position)."""

    def __init__(self, config: Any) -> None:  # a transformers RobertaConfig
        super().__init__()
        from transformers import RobertaModel

        hidden = config.hidden_size
        self.seeker_encoder = nn.ModuleDict({"roberta": RobertaModel(config)})
        self.responder_encoder = nn.ModuleDict({"roberta": RobertaModel(config)})
        names = ("q_linear", "k_linear", "v_linear", "out")
        self.attn = nn.ModuleDict({name: nn.Linear(hidden, hidden) for name in names})
        self.norm = nn.ParameterDict(
            {"alpha": nn.Parameter(torch.ones(hidden)), "bias": nn.Parameter(torch.zeros(hidden))}
        )
        self.rationale_classifier = nn.Linear(hidden, 2)
        self.empathy_classifier = nn.ModuleDict(
            {"dense": nn.Linear(hidden, hidden), "out_proj": nn.Linear(hidden, 3)}
        )

    def forward(self, seeker: dict[str, torch.Tensor], response: dict[str, torch.Tensor]):
        sp = self.seeker_encoder.roberta(**seeker).last_hidden_state
        rp = self.responder_encoder.roberta(**response).last_hidden_state
        attn = self.attn
        q, k, v = attn.q_linear(rp), attn.k_linear(sp), attn.v_linear(sp)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        rp = rp + attn.out(weights @ v)
        head = self.empathy_classifier
        return head.out_proj(torch.relu(head.dense(rp[:, 0, :])))


def config_from_state(state: dict[str, torch.Tensor]) -> Any:
    """The RoBERTa configuration whose shapes match an EPITOME state dict."""
    from transformers import RobertaConfig

    prefix = "seeker_encoder.roberta."
    try:
        vocab, hidden = state[prefix + "embeddings.word_embeddings.weight"].shape
        positions = state[prefix + "embeddings.position_embeddings.weight"].shape[0]
        types = state[prefix + "embeddings.token_type_embeddings.weight"].shape[0]
        inner = state[prefix + "encoder.layer.0.intermediate.dense.weight"].shape[0]
    except KeyError as err:
        raise ProbekitError(f"not an EPITOME state dict: no {err.args[0]}") from None
    layers = 1 + max(int(m.group(1)) for k in state if (m := _LAYER.match(k)))
    return RobertaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=inner,
        max_position_embeddings=positions,
        type_vocab_size=types,
        layer_norm_eps=1e-5,
    )  # RobertaConfig's special token ids (pad 1, bos 0, eos 2) are roberta-base's


def load_bi_encoder(path: Path) -> EpitomeBiEncoder:
    """One classifier from its state dict, loaded strictly (buffers named `position_ids`, which
    older transformers saved, are ignored)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle, zip or I/O: any unreadable file is the user's to fix
        raise ProbekitError(f"cannot read the EPITOME state dict {path}: {err}") from err
    state = {k: v for k, v in state.items() if not k.endswith("position_ids")}
    model = EpitomeBiEncoder(config_from_state(state))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        names = ", ".join([*missing[:2], *unexpected[:2]])
        raise ProbekitError(f"{path} does not match EPITOME's bi-encoder (e.g. {names})")
    return model.eval()


class EpitomeClassifier:
    """The three EPITOME classifiers behind `era.PairClassifier`."""

    def __init__(self, models: dict[str, EpitomeBiEncoder], tokenizer: Any, device: str) -> None:
        self.models = {dim: m.to(device) for dim, m in models.items()}
        self.tokenizer, self.device = tokenizer, device

    @torch.inference_mode()
    def levels(self, pairs: Sequence[tuple[str, str]]) -> list[dict[str, int]]:
        out = []
        for seeker, response in pairs:
            sides = [self._encode(seeker), self._encode(response)]
            out.append({dim: int(m(*sides).argmax(-1).item()) for dim, m in self.models.items()})
        return out

    def _encode(self, text: str) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(text, max_length=MAX_TOKENS, truncation=True, return_tensors="pt")
        return {k: enc[k].to(self.device) for k in ("input_ids", "attention_mask")}


def load_epitome(folder: str | Path, device: str | None = None) -> EpitomeClassifier:
    """The classifier of an EPITOME folder (the three state dicts, optionally a tokenizer)."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    local = (folder / "tokenizer.json").is_file() or (folder / "vocab.json").is_file()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder) if local else TOKENIZER)
    except OSError as err:
        raise ProbekitError(
            f"EPITOME needs the {TOKENIZER} tokenizer: put its vocab.json and merges.txt in "
            f"{folder}, or make it reachable from the Hugging Face hub ({err})"
        ) from None
    models = {dim: load_bi_encoder(folder / name) for dim, name in FILES.items()}
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return EpitomeClassifier(models, tokenizer, chosen)
