"""Attention for scoring: boolean masks as additive masks, and SDPA that reads grouped key/value
heads in place for models run on the CPU.

Scoring always passes an attention mask (left padding, the answer trie's tree mask). Given a
mask, the Hugging Face SDPA integration copies every key/value head once per query head of its
group (`repeat_kv`) before calling PyTorch. PyTorch's CPU kernel takes grouped heads directly
(`enable_gqa`), with the same output: for the trie's few query positions over a long cached
prompt, that attention is ~2.5x faster (the copy of the whole cache, per layer and depth, is
gone). On CUDA, a mask together with `enable_gqa` falls back to the slow math kernel, so only CPU
models switch.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "probekit_grouped_sdpa"


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The stock SDPA attention, except that a masked multi-position query of a grouped-query
    model runs on the key/value heads as they are."""
    plain = key.shape[1] == query.shape[1] or attention_mask is None or query.shape[2] == 1
    if plain or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=kwargs.get("dropout", 0.0),
        scale=kwargs.get("scaling"),
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def use_grouped_sdpa(hf: Any, device: torch.device) -> None:
    """Switch a grouped-query model on the CPU that uses SDPA to `grouped_sdpa` (other models and
    devices keep their attention)."""
    config = hf.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if device.type != "cpu" or config._attn_implementation != "sdpa" or kv_heads == heads:
        return
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    hf.set_attn_implementation(GROUPED_SDPA)


def additive_mask(attend: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask (True: may attend) as the additive mask a model takes: 0 where
    allowed, the dtype's most negative value elsewhere. The trie's tree-shaped masks pass this
    form, which the model uses as given."""
    out = torch.zeros(attend.shape, dtype=dtype, device=attend.device)
    return out.masked_fill_(~attend, torch.finfo(dtype).min)
