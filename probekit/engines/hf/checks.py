"""Load-time checks of a model's weights, so that damaged weights stop the load in one line
instead of giving NaN scores (a folder or hub model has no record to verify its files against,
so what the weights give is checked instead).

`LOAD_ERRORS` are the exceptions a load raises for weights that cannot be read (a truncated
safetensors file raises `SafetensorError`, which is neither an OSError nor a ValueError);
`check_first_forward` runs one short forward and refuses logits that are NaN or infinite.
"""

from __future__ import annotations

from typing import Any

import torch
from safetensors import SafetensorError

from probekit.core.errors import ProbekitError
from probekit.core.options import given

LOAD_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, SafetensorError)
PROBE_TEXT = "The weather today is"  # a few ordinary tokens every tokenizer knows


def check_first_forward(hf: Any, tokenizer: Any, label: str, device: torch.device) -> None:
    """Run `PROBE_TEXT` through `hf` once, its inputs on `device` (where a model placed by a
    device map computes first); a ProbekitError if any logit is NaN or infinite (damaged
    weights, or a dtype too narrow for them). One forward of five tokens."""
    ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = hf(input_ids=ids.to(device)).logits
    if not bool(torch.isfinite(logits).all()):
        bad = int((~torch.isfinite(logits)).sum())
        raise ProbekitError(
            f"model '{label}' gives non-finite logits ({bad} of {logits.numel()} NaN or inf) on "
            f"a first probe forward in {str(hf.dtype).removeprefix('torch.')}: its weights are "
            f"damaged, or overflow in this dtype; download them again or try "
            f"{given('dtype', 'float32')}"
        )
