"""Precision tiers: the arithmetic a model scores in, chosen by the error it is measured to cause.

A run states the largest change of an answer probability it accepts (`tolerance`, `--tolerance`)
and gets the fastest tier that meets it on its own prompts. The tiers, fastest first:

- `bfloat16`: bfloat16 weights, the final norm and the LM head in float32 (as
  `load_model(dtype="bfloat16")` gives them);
- `tf32`: float32 weights, the transformer body's matrix products with TF32 inputs (10 mantissa
  bits, float32 sums); the LM head, the log-softmax and the vocabulary sums stay float32;
- `float32`: the reference of the other two (its own error against float64 is every run's
  noise figure, `precision.noise_figure`).

A CUDA device of compute capability 8 or more (Ampere and later) offers all three; any other
device, a model dispatched by a device map, and a model whose float32 weights did not fit (loaded
in bfloat16 by the memory policy) offer one, which is then taken without measuring anything: on a
CPU float32 is the fastest arithmetic there is. Where the tiers are offered, `choose_precision`
scores a seeded sample of the run's prompts exactly (epsilon 0) in float32, then in each faster
tier, fastest first, and keeps the first whose largest |difference| of an answer probability is at
most the tolerance; the record (`LoadedModel.meta["precision"]`, in `describe()` and so in every
run manifest) says what was offered, tried, measured and picked.

Where the device has no TF32 (a CPU), `tf32` is emulated by rounding the inputs of the body's
matrix products to TF32 (`tf32_rounding`): no run is offered it there, but measurements and tests
of the choice run on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.kinds import probability
from probekit.core.options import option_message
from probekit.engines.hf.precision import (
    NOISE_SAMPLE,
    dtype_name,
    final_norm,
    inputs_to_fp32,
    score_differences,
)

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel

TIERS = ("bfloat16", "tf32", "float32")
"""The precision tiers, fastest first."""
LABELS = {
    "bfloat16": "bfloat16 (float32 final norm and LM head)",
    "tf32": "float32 with TF32 matmuls",
    "float32": "float32",
}
DEFAULT_TOLERANCE = 0.005
"""The tolerance of a run that names none (docs/concepts.md, "The precision tier"): between what
the two faster tiers were measured to cause on the default model, each by a factor of about 3
(`benchmarks/results/dtype.json`: TF32 moves an answer probability by at most 1.6e-3 on every
study's slice, 1.3e-3 on an H100; bfloat16 by at least 0.016, 0.015 on the H100), so that TF32
is taken where it passes and bfloat16, which moves the intergroup Δ and ISEAR's max_diff by
several times their 95 % interval's half-width, only when a run asks for it."""


def check_tolerance(tolerance: Any) -> float:
    """`tolerance` as a probability in [0, 1], else one line naming the keyword."""
    try:
        return probability.check(tolerance)
    except argparse.ArgumentTypeError as error:
        raise ProbekitError(option_message("tolerance", str(error))) from None


def offered_tiers(model: HFModel) -> tuple[str, ...]:
    """The tiers `model` can be scored in, fastest first (see the module's docstring)."""
    if model.dtype != torch.float32:
        return (dtype_name(model.dtype),)
    if model.dispatched or model.device.type != "cuda":
        return ("float32",)
    if torch.cuda.get_device_capability(model.device) < (8, 0):
        return ("float32",)
    return TIERS


def _why_one(model: HFModel) -> str:
    """Why `model` is offered a single tier."""
    if model.dtype != torch.float32:
        return f"loaded in {dtype_name(model.dtype)}: the only tier offered"
    if model.dispatched:
        return "a model dispatched by a device map is scored in float32"
    if model.device.type == "cuda":
        return "this GPU has no bfloat16 or TF32 tensor cores: float32 only"
    return f"float32 is the fastest arithmetic on {model.device.type}: nothing to choose"


def initial_record(model: HFModel, forced: bool, tolerance: float | None) -> dict[str, Any]:
    """The precision record of a model just loaded: the dtype given (`forced`), the one tier
    its device offers, or the tolerance a first score will choose the tier by."""
    if forced:
        return {"tier": dtype_name(model.dtype), "note": "the dtype given (--dtype)"}
    offered = offered_tiers(model)
    record = {
        "tolerance": DEFAULT_TOLERANCE if tolerance is None else tolerance,
        "offered": list(offered),
    }
    if len(offered) == 1:
        return {**record, "tier": offered[0], "tried": [], "note": _why_one(model)}
    return record


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
def arithmetic(model: HFModel) -> Iterator[None]:
    """The tier's arithmetic around one forward of the transformer body (`forward.body`): TF32
    matmuls on CUDA (restored after), emulated elsewhere; nothing for the other tiers, whose
    arithmetic is the weights' dtype."""
    if model.meta.get("matmul") != "tf32":
        yield
        return
    if model.device.type != "cuda":
        with tf32_rounding():
            yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def apply_tier(model: HFModel, tier: str) -> Callable[[], None]:
    """Put the float32 `model` in `tier` in place; return the call that puts it back exactly.

    `bfloat16` narrows every weight but the final norm and the LM head (a head tied to the input
    embeddings first gets its own float32 copy), keeping a host copy of the float32 weights for
    the undo; `tf32` marks the model for `arithmetic`; `float32` changes nothing."""
    if tier not in TIERS:
        raise ProbekitError(f"unknown precision tier '{tier}'; use {', '.join(TIERS)}")
    if tier == "float32":
        return lambda: None
    if model.dtype != torch.float32:
        raise ProbekitError(f"the {tier} tier needs a float32 model, not {model.dtype}")
    if tier == "tf32":
        model.meta["matmul"] = "tf32"
        return lambda: model.meta.pop("matmul", None)
    hf = model.hf
    head, tied = hf.get_output_embeddings(), hf.config.tie_word_embeddings
    norm = final_norm(hf)
    if head.weight is hf.get_input_embeddings().weight:
        own = torch.nn.Linear(
            head.in_features, head.out_features, bias=head.bias is not None, device=model.device
        )
        own.load_state_dict(head.state_dict())
        hf.set_output_embeddings(own)
        hf.config.tie_word_embeddings = False
    kept = {
        id(p) for m in (hf.get_output_embeddings(), norm) if m is not None for p in m.parameters()
    }
    narrowed = [p for p in hf.parameters() if p.is_floating_point() and id(p) not in kept]
    saved = [p.data.to("cpu", copy=True) for p in narrowed]
    for p in narrowed:
        p.data = p.data.to(torch.bfloat16)
    hook = norm.register_forward_pre_hook(inputs_to_fp32) if norm is not None else None
    model.dtype = torch.bfloat16
    model.meta["fp32_parts"] = ["final norm", "LM head"] if norm is not None else ["LM head"]

    def undo() -> None:
        for p, data in zip(narrowed, saved, strict=True):
            p.data = data.to(model.device)
        if hook is not None:
            hook.remove()
        hf.set_output_embeddings(head)
        hf.config.tie_word_embeddings = tied
        model.dtype = torch.float32
        model.meta.pop("fp32_parts", None)

    return undo


def choose_precision(
    model: HFModel,
    prompts: Sequence[Sequence[int]],
    answers: AnswerSet,
    tolerance: float | None = None,
    offered: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Put `model` (float32) in the fastest tier of `offered` (default `offered_tiers`) whose
    largest |difference| of an answer probability from float32, on `prompts` (token ids,
    scored exactly), is at most `tolerance` (default `DEFAULT_TOLERANCE`); float32 when none
    is. Return the record, also kept as `model.meta["precision"]`: `tier`, `tolerance`,
    `offered`, `tried` (each measured tier's differences, `score_differences`' fields, and
    `accepted`), `sample` and `reference`. A single offered tier is taken without measuring."""
    tolerance = DEFAULT_TOLERANCE if tolerance is None else check_tolerance(tolerance)
    offered = tuple(offered or offered_tiers(model))
    record: dict[str, Any] = {"tolerance": tolerance, "offered": list(offered), "tried": []}
    if len(offered) == 1:
        record |= {"tier": offered[0], "note": _why_one(model)}
    else:
        if not prompts:
            raise ProbekitError("choosing a precision tier needs at least one prompt")
        reference = _exact(model, prompts, answers)
        record |= {"tier": "float32", "sample": len(prompts), "reference": "float32"}
        for tier in offered:
            if tier == "float32":
                break
            undo = apply_tier(model, tier)
            measured = score_differences(
                _exact(model, prompts, answers), reference, answers.numeric
            )
            accepted = measured["max_prob_diff"] <= tolerance
            record["tried"].append({"tier": tier, **measured, "accepted": accepted})
            if accepted:
                record["tier"] = tier
                break
            undo()
        print(f"probekit: {describe_precision(record)}", file=sys.stderr)
    model.meta["precision"] = record
    return record


def _exact(model: HFModel, prompts: Sequence[Sequence[int]], answers: AnswerSet) -> list:
    return list(model.scorer(answers, epsilon=0.0).score(prompts))


def settle_precision(
    engine: Any, answers: AnswerSet, prompts: Sequence[Sequence[int]], seed: int = 0
) -> dict[str, Any] | None:
    """The precision `engine` scores in, chosen once: a transformers model whose tier is not
    chosen yet gets `choose_precision` on a seeded sample of `NOISE_SAMPLE` of `prompts` with
    the tolerance it was loaded with; the record, None for another engine. `probekit.score`,
    `run_study` and the mechanism's `patch` and `steer` call it before they score."""
    if getattr(engine, "engine", None) != "hf":  # vLLM, or a test's stand-in engine
        return None
    record = engine.meta.get("precision", {})
    if "tier" in record:
        return record
    picked = sorted(
        random.Random(seed).sample(range(len(prompts)), min(NOISE_SAMPLE, len(prompts)))
    )
    return choose_precision(
        engine,
        [prompts[i] for i in picked],
        answers,
        record.get("tolerance"),
        record.get("offered"),
    )


def keep_tier(engine: Any, record: Mapping[str, Any]) -> dict[str, Any] | None:
    """Put a transformers model whose tier is not chosen yet in the tier of `record` (the run it
    resumes, or for a Ray actor the driver's choice), without measuring; the record kept, None
    when it does not apply (another engine, a tier already chosen, a tier not offered)."""
    hf = getattr(engine, "engine", None) == "hf"
    pending = engine.meta.get("precision", {}) if hf else {"tier": None}
    tier = record.get("tier")
    if "tier" in pending or tier not in pending.get("offered", offered_tiers(engine)):
        return None
    apply_tier(engine, tier)
    kept = {**record, "note": "kept from the run being resumed"}
    engine.meta["precision"] = kept
    return kept


def describe_precision(record: Mapping[str, Any]) -> str:
    """One line: the tier, the tolerance, what was measured and tried."""
    tier = LABELS.get(record.get("tier", ""), str(record.get("tier")))
    if "tolerance" not in record:
        return f"precision: {tier} ({record.get('note', 'given')})"
    head = f"precision: {tier} for tolerance {record['tolerance']:g}"
    tried = record.get("tried") or []
    if not tried:
        return f"{head} ({record.get('note', 'nothing measured')})"
    parts = [
        f"{LABELS[t['tier']]} moves an answer probability by {t['max_prob_diff']:.2g}"
        f" ({'accepted' if t['accepted'] else 'over the tolerance'})"
        for t in tried
    ]
    return f"{head}; on {record['sample']} prompts against float32: {'; '.join(parts)}"
