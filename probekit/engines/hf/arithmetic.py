"""The precision tiers' arithmetic: what each tier computes in, and putting a model in one.

A tier is the arithmetic of the transformer body and that of the LM head. The body runs in
float16 or bfloat16 weights (the final norm kept in float32), in float32 with TF32 matrix
products, or in float32. The head runs in float32, or in the body's arithmetic (a `+head` tier):
TF32 inputs, or the hidden state rounded to 16 bits against 16-bit weights with the products
summed in float32 (`head.narrow_linear`). The log-softmax and the vocabulary sums stay float64-
accurate in every tier (`head.vocabulary_sums`). Which tier a run gets is chosen by its measured
error (`tiers.py`).

Where the device has no TF32 (a CPU), it is emulated by rounding the inputs of the matrix products
to TF32 (`tf32_rounding`), and the 16-bit head by the same arithmetic in float32: no run is
offered those tiers there, but measurements and tests of the choice run on a CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from probekit.core.errors import ProbekitError
from probekit.engines.hf.precision import dtype_name, final_norm, inputs_to_fp32

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel

TIERS = ("float16+head", "bfloat16+head", "tf32+head", "float16", "bfloat16", "tf32", "float32")
"""The precision tiers, fastest first by the nominal rates of a current GPU's tensor cores
(16-bit about twice TF32, TF32 about seven times plain float32): a `+head` tier runs its LM head
in the body's arithmetic, the others in float32. Between two tiers of the same speed the one
with more mantissa bits comes first (float16 before bfloat16)."""
LABELS = {
    "float16+head": "float16, LM head included (float32 final norm and sums)",
    "bfloat16+head": "bfloat16, LM head included (float32 final norm and sums)",
    "tf32+head": "float32 with TF32 matmuls, LM head included",
    "float16": "float16 (float32 final norm and LM head)",
    "bfloat16": "bfloat16 (float32 final norm and LM head)",
    "tf32": "float32 with TF32 matmuls",
    "float32": "float32",
}
NARROW = ("float16", "bfloat16")
"""The 16-bit arithmetic of a body or a head (`head.narrow_linear`)."""


def body_of(tier: str) -> str:
    """The body's arithmetic of `tier`: float16, bfloat16, tf32 or float32."""
    return tier.removesuffix("+head")


def head_of(tier: str) -> str:
    """The LM head's arithmetic of `tier`: the body's for a `+head` tier, else float32."""
    return body_of(tier) if tier.endswith("+head") else "float32"


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """A float32 tensor rounded to the nearest TF32 value (10 mantissa bits, ties to even)."""
    bits = x.contiguous().view(torch.int32)
    bits = (bits + 0x0FFF + ((bits >> 13) & 1)) & ~0x1FFF
    return bits.view(torch.float32)


class tf32_rounding(TorchFunctionMode):  # noqa: N801 - used as a context manager, like torch's
    """TF32 matmuls emulated: the float32 inputs of linear layers, matrix products and attention
    (queries, keys, values) rounded to TF32 before the float32 product. An approximation of a
    GPU's TF32: the attention probabilities are not rounded, and the GPU's sums run in its own
    order."""

    LINEAR = {torch.nn.functional.linear, torch.matmul, torch.bmm, torch.Tensor.matmul}
    ATTENTION = {torch.nn.functional.scaled_dot_product_attention}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        count = 2 if func in self.LINEAR else 3 if func in self.ATTENTION else 0
        if count:
            args = tuple(
                round_tf32(a) if i < count and _is_fp32(a) else a for i, a in enumerate(args)
            )
        return func(*args, **(kwargs or {}))


def _is_fp32(value: Any) -> bool:
    return torch.is_tensor(value) and value.dtype == torch.float32


@contextlib.contextmanager
def tf32_matmuls(device: torch.device) -> Iterator[None]:
    """Float32 matrix products with TF32 inputs: on CUDA the tensor cores (the flags restored
    after), elsewhere emulated (`tf32_rounding`)."""
    if device.type != "cuda":
        with tf32_rounding():
            yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def arithmetic(model: HFModel) -> contextlib.AbstractContextManager:
    """The tier's arithmetic around one forward of the transformer body (`forward.body`): TF32
    matmuls in a TF32 tier; for 16-bit weights on CUDA, matrix products whose partial sums stay
    in float32 (`float32_sums`); nothing else, the arithmetic being the weights' dtype."""
    if model.meta.get("matmul") == "tf32":
        return tf32_matmuls(model.device)
    if model.device.type == "cuda" and dtype_name(model.dtype) in NARROW:
        return float32_sums()
    return contextlib.nullcontext()


@contextlib.contextmanager
def float32_sums() -> Iterator[None]:
    """CUDA matrix products of 16-bit inputs without cuBLAS's reduced-precision reductions (a
    split-K product may otherwise add its partial sums in 16 bits), the flags restored after:
    the products are summed in float32 as the CPU computes them, where the tiers' errors are
    measured outside a run."""
    matmul = torch.backends.cuda.matmul
    saved = (
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
    )
    matmul.allow_fp16_reduced_precision_reduction = False
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        (
            matmul.allow_fp16_reduced_precision_reduction,
            matmul.allow_bf16_reduced_precision_reduction,
        ) = saved


def head_arithmetic(model: HFModel) -> str:
    """The LM head's arithmetic (`head.lm_head`): `tf32`, a 16-bit dtype, or `float32` (the
    head's weights as loaded)."""
    return model.meta.get("head", "float32")


def apply_tier(model: HFModel, tier: str) -> Callable[[], None]:
    """Put the float32 `model` in `tier` in place; return the call that puts it back exactly.

    A 16-bit body narrows every weight but the final norm's, keeping a host copy of the float32
    weights for the undo; its head stays float32 (a head tied to the input embeddings first gets
    its own float32 copy) unless the tier is a `+head` one, whose head is narrowed with the body
    (and stays tied). A `tf32` body or head marks the model for `arithmetic` and `lm_head`;
    `float32` changes nothing."""
    if tier not in TIERS:
        raise ProbekitError(f"unknown precision tier '{tier}'; use {', '.join(TIERS)}")
    if tier == "float32":
        return lambda: None
    if model.dtype != torch.float32:
        raise ProbekitError(f"the {tier} tier needs a float32 model, not {model.dtype}")
    body, head = body_of(tier), head_of(tier)
    if body == "tf32":
        model.meta["matmul"] = "tf32"
        if head == "tf32":
            model.meta["head"] = "tf32"

        def untf32() -> None:
            model.meta.pop("matmul", None)
            model.meta.pop("head", None)

        return untf32
    return _narrow(model, getattr(torch, body), narrow_head=head != "float32")


def _narrow(model: HFModel, dtype: torch.dtype, narrow_head: bool) -> Callable[[], None]:
    """`apply_tier` for a 16-bit body (see there)."""
    hf = model.hf
    head, tied = hf.get_output_embeddings(), hf.config.tie_word_embeddings
    norm = final_norm(hf)
    if not narrow_head and head.weight is hf.get_input_embeddings().weight:
        own = torch.nn.Linear(
            head.in_features, head.out_features, bias=head.bias is not None, device=model.device
        )
        own.load_state_dict(head.state_dict())
        hf.set_output_embeddings(own)
        hf.config.tie_word_embeddings = False
    kept_modules = [norm] if narrow_head else [hf.get_output_embeddings(), norm]
    kept = {id(p) for m in kept_modules if m is not None for p in m.parameters()}
    narrowed = [p for p in hf.parameters() if p.is_floating_point() and id(p) not in kept]
    saved = [p.data.to("cpu", copy=True) for p in narrowed]
    for p in narrowed:
        p.data = p.data.to(dtype)
    hook = norm.register_forward_pre_hook(inputs_to_fp32) if norm is not None else None
    model.dtype = dtype
    model.meta["fp32_parts"] = (["final norm"] if norm is not None else []) + (
        [] if narrow_head else ["LM head"]
    )
    if narrow_head:
        model.meta["head"] = dtype_name(dtype)

    def undo() -> None:
        for p, data in zip(narrowed, saved, strict=True):
            p.data = data.to(model.device)
        if hook is not None:
            hook.remove()
        hf.set_output_embeddings(head)
        hf.config.tie_word_embeddings = tied
        model.dtype = torch.float32
        model.meta.pop("fp32_parts", None)
        model.meta.pop("head", None)

    return undo
