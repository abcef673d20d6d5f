"""The arithmetic the transformers engine scores in: the precision tiers, the one a run gets
(chosen by the error it is measured to cause, or kept from the run it resumes), and the noise
figure every run reports. `LoadedModel` answers the engine protocol's `Precision` from here.

A tier pairs the arithmetic of the transformer body with that of the LM head (`TIERS`):

- `float16+head`, `bfloat16+head`: 16-bit weights and activations, the final norm in float32,
  the LM head on the hidden state rounded to 16 bits with its products summed in float32
  (`head.narrow_linear`);
- `tf32+head`: float32 weights, every matrix product (the LM head's too) with TF32 inputs (10
  mantissa bits, float32 sums);
- `float16`, `bfloat16`, `tf32`: the same bodies with the LM head in float32 (`bfloat16` as
  `load_model(dtype="bfloat16")` gives it: `keep_head_fp32`);
- `float32`: the reference of the others.

The log-softmax and the vocabulary sums are float64-accurate in every tier
(`head.vocabulary_sums`). Where the device has no TF32 (a CPU) it is emulated by rounding the
inputs of the matrix products (`tf32_rounding`), and the 16-bit head by the same arithmetic in
float32: no run is offered those tiers there, but the choice is measured and tested on a CPU.

A CUDA device of compute capability 8 or more offers every tier, one of 7.x (float16 tensor cores
only) the float16 tiers and float32; any other device, a model dispatched by a device map and a
model loaded in 16 bits offer one, taken without measuring. Where tiers are offered,
`choose_precision` scores a seeded sample of the run's prompts exactly (epsilon 0) in float32,
then in each faster tier, fastest first, and keeps the first whose largest |difference| of an
answer probability is at most the tolerance; the record (`LoadedModel.precision`, in every run
manifest) says what was offered, tried, measured and picked. float16 has 5 exponent bits: a
float16 tier whose sample overflows is not taken; when one is taken, the next measured tier that
meets the tolerance and is not float16 is its `fallback`, to which the scorer switches, with one
line, if a later batch overflows (`fall_back`).

The noise figure (`noise_figure`) scores a seeded sample of a run's prompts again in a wider
dtype (float64 for a float32 run, float32 for a narrower one), so that a reader knows whether a
difference in the results is larger than the arithmetic.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.public import public
from probekit.core.shared_options import SeedOption
from probekit.engines.base import TIER_LABELS, HookableModel, ScoreResult, describe_precision
from probekit.engines.options import DEFAULT_TOLERANCE, NOISE_SAMPLE, dtype_name

TIERS = tuple(TIER_LABELS)
"""The precision tiers, fastest first by the nominal rates of a current GPU's tensor cores
(16-bit about twice TF32, TF32 about seven times plain float32); between two of the same speed
the one with more mantissa bits first (float16 before bfloat16)."""
NARROW = ("float16", "bfloat16")
"""The 16-bit arithmetic of a body or a head."""
REDUCED = (torch.bfloat16, torch.float16)
"""Weight dtypes whose final norm and LM head `load_model` keeps in float32."""
FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm")
"""Attribute names of the final norm on a Hugging Face base model (Llama/Qwen/Gemma, GPT-2, ...)."""
UNDO = "undo_tier"
"""`LoadedModel.meta` key of the call that puts a model with a fallback back in float32."""


def body_of(tier: str) -> str:
    """The body's arithmetic of `tier`: float16, bfloat16, tf32 or float32."""
    return tier.removesuffix("+head")


# ------------------------------------------------------------------ what each tier computes in


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
                round_tf32(a)
                if i < count and torch.is_tensor(a) and a.dtype == torch.float32
                else a
                for i, a in enumerate(args)
            )
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _flags(value: bool, *flags: tuple[Any, str]) -> Iterator[None]:
    """Torch's backend `flags` (owner, attribute) set to `value` in the block, restored after."""
    saved = [getattr(owner, name) for owner, name in flags]
    for owner, name in flags:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for (owner, name), was in zip(flags, saved, strict=True):
            setattr(owner, name, was)


def tf32_matmuls(device: torch.device) -> contextlib.AbstractContextManager:
    """Float32 matrix products with TF32 inputs: on CUDA the tensor cores, elsewhere emulated
    (`tf32_rounding`)."""
    if device.type != "cuda":
        return tf32_rounding()
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return _flags(True, (cuda, "allow_tf32"), (cudnn, "allow_tf32"))


def arithmetic(model: HookableModel) -> contextlib.AbstractContextManager:
    """The tier's arithmetic around one forward of the transformer body (`forward.body`): TF32
    matmuls in a TF32 tier; for 16-bit weights on CUDA, matrix products without cuBLAS's
    reduced-precision reductions (a split-K product may otherwise add its partial sums in 16
    bits), summed in float32 as the CPU that measures the tiers sums them; else nothing."""
    if model.meta.get("matmul") == "tf32":
        return tf32_matmuls(model.device)
    if model.device.type == "cuda" and model.dtype in REDUCED:
        reduced = (f"allow_{bits}_reduced_precision_reduction" for bits in ("fp16", "bf16"))
        return _flags(False, *((torch.backends.cuda.matmul, name) for name in reduced))
    return contextlib.nullcontext()


# ------------------------------------------------------------------ putting a model in a tier


def final_norm(hf: Any) -> torch.nn.Module | None:
    """The final norm of a Hugging Face causal LM (`FINAL_NORMS`), None if it has none."""
    base = hf.get_decoder() if hasattr(hf, "get_decoder") else hf.base_model
    found = (getattr(base, name, None) for name in FINAL_NORMS)
    return next((m for m in found if isinstance(m, torch.nn.Module)), None)


def inputs_to_fp32(module: torch.nn.Module, args: tuple) -> tuple:
    """Forward pre-hook: floating inputs at least float32 (a float64 reference stays float64)."""
    return tuple(
        a.to(torch.promote_types(a.dtype, torch.float32))
        if torch.is_tensor(a) and a.is_floating_point()
        else a
        for a in args
    )


def own_fp32_head(hf: Any) -> None:
    """Give `hf` a float32 LM head of its own (a copy; the input embeddings, which a tied head
    shares, keep theirs), on the head's device and with its device hook (accelerate's
    dispatch); a later `tie_weights()` does not share it again. Costs vocab x width x 4 bytes."""
    head = hf.get_output_embeddings()
    fp32 = torch.nn.Linear(
        head.in_features,
        head.out_features,
        head.bias is not None,
        head.weight.device,
        torch.float32,
    )
    fp32.load_state_dict(head.state_dict())
    if getattr(head, "_hf_hook", None) is not None:
        from accelerate.hooks import add_hook_to_module

        add_hook_to_module(fp32, head._hf_hook)
    hf.set_output_embeddings(fp32)
    hf.config.tie_word_embeddings = False


def keep_head_fp32(hf: Any) -> list[str]:
    """Run the final norm and the LM head of `hf` in float32 whatever the body's dtype; return
    the parts changed (for the manifest). The norm's input is cast up before it, so the hidden
    state the head reads is never rounded to the body's dtype. A head offloaded by a device map
    (its weights not in memory) keeps its dtype."""
    changed = []
    norm = final_norm(hf)
    if norm is not None:
        norm.float()
        norm.register_forward_pre_hook(inputs_to_fp32)
        changed.append("final norm")
    head = hf.get_output_embeddings()
    offloaded = head is None or head.weight.device.type == "meta"
    if not offloaded and head.weight.dtype != torch.float32:
        own_fp32_head(hf)
        changed.append("LM head")
    return changed


def apply_tier(model: HookableModel, tier: str) -> Callable[[], None]:
    """Put the float32 `model` in `tier` in place; return the call that puts it back exactly.

    A 16-bit body narrows every weight but the final norm's, keeping a host copy of the float32
    weights for the undo; its head stays float32 (a tied head first gets its own copy) unless
    the tier is a `+head` one, whose head is narrowed with the body (and stays tied). A `tf32`
    body or head marks the model for `arithmetic` and `head.lm_head`; `float32` changes nothing."""
    if tier == "float32":
        return lambda: None
    body, narrow_head = body_of(tier), tier.endswith("+head")
    if body == "tf32":
        model.meta |= {"matmul": "tf32"} | ({"head": "tf32"} if narrow_head else {})

        def untf32() -> None:
            model.meta.pop("matmul", None)
            model.meta.pop("head", None)

        return untf32
    hf = model.hf
    head, tied, norm = hf.get_output_embeddings(), hf.config.tie_word_embeddings, final_norm(hf)
    if not narrow_head and head.weight is hf.get_input_embeddings().weight:
        own_fp32_head(hf)
    kept = [norm] if narrow_head else [hf.get_output_embeddings(), norm]
    skip = {id(p) for m in kept if m is not None for p in m.parameters()}
    narrowed = [p for p in hf.parameters() if p.is_floating_point() and id(p) not in skip]
    saved = [p.data.to("cpu", copy=True) for p in narrowed]
    dtype = getattr(torch, body)
    for p in narrowed:
        p.data = p.data.to(dtype)
    hook = norm.register_forward_pre_hook(inputs_to_fp32) if norm is not None else None
    model.dtype = dtype
    model.meta["fp32_parts"] = ["final norm"] * (norm is not None) + ["LM head"] * (not narrow_head)
    if narrow_head:
        model.meta["head"] = body

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


# ------------------------------------------------------------------ choosing and keeping a tier


def offered_tiers(model: HookableModel) -> tuple[tuple[str, ...], str]:
    """The tiers `model` can be scored in, fastest first (see the module's docstring), and why
    where one tier only is offered."""
    if model.dtype != torch.float32:
        name = dtype_name(model.dtype)
        return (name,), f"loaded in {name}: the only tier offered"
    if model.dispatched:
        return ("float32",), "a model dispatched by a device map is scored in float32"
    if model.device.type != "cuda":
        kind = model.device.type
        return ("float32",), f"float32 is the fastest arithmetic on {kind}: nothing to choose"
    capability = torch.cuda.get_device_capability(model.device)
    if capability < (7, 0):
        return ("float32",), "this GPU has no tensor cores: float32 only"
    return tuple(
        t for t in TIERS if capability >= (8, 0) or body_of(t) in ("float16", "float32")
    ), ""


def initial_record(
    model: HookableModel, forced: bool, tolerance: float | None, offered: Sequence[str] = ()
) -> dict[str, Any]:
    """The precision record of a model just loaded: the dtype given (`forced`), else of a tier
    to choose by `tolerance` (default `DEFAULT_TOLERANCE`) among `offered` (default
    `offered_tiers`), the one tier offered taken without measuring, with why."""
    if forced:
        return {"tier": dtype_name(model.dtype), "note": "the dtype given"}
    tiers, why = offered_tiers(model)
    tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
    record = {"tolerance": tolerance, "offered": list(offered or tiers)}
    if len(record["offered"]) > 1:
        return record
    return {**record, "tier": record["offered"][0], "tried": [], "note": why}


def choose_precision(
    model: HookableModel,
    prompts: Sequence[Sequence[int]],
    answers: AnswerSet,
    tolerance: float | None = None,
    offered: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Put `model` (float32) in the fastest tier of `offered` (default `offered_tiers`) whose
    largest |difference| of an answer probability from float32, on `prompts` (token ids,
    scored exactly), is at most `tolerance` (default `DEFAULT_TOLERANCE`); float32 when none
    is. Return the record, also kept as `model.meta["precision"]`: `tier`, `tolerance`,
    `offered`, `tried` (per measured tier `score_differences`' fields, or `overflow` (the
    prompts whose scores were not finite) or `failed` (why it did not run), and `accepted`),
    `sample`, `reference`, and for a float16 tier its `fallback`. A single offered tier is
    taken without measuring."""
    record = initial_record(model, False, tolerance, offered)
    if "tier" in record:
        model.meta["precision"] = record
        return record
    reference = list(model.scorer(answers, epsilon=0.0).score(prompts))
    record |= {"tried": [], "tier": "float32", "sample": len(prompts), "reference": "float32"}

    def trial(tier: str) -> dict[str, Any]:
        """`tier`'s differences from `reference`, the model put back in float32 after. A tier
        that does not run (a kernel this device lacks) is refused with the first line of its
        error, and one whose scores are not finite (float16 overflow) with the count."""
        undo = apply_tier(model, tier)
        try:
            scored = list(model.scorer(answers, epsilon=0.0).score(prompts))
        except RuntimeError as error:
            return {"tier": tier, "failed": str(error).splitlines()[0], "accepted": False}
        finally:
            undo()
        if bad := overflowed(scored):
            return {"tier": tier, "overflow": bad, "accepted": False}
        measured = score_differences(scored, reference, answers.numeric)
        return {
            "tier": tier,
            **measured,
            "accepted": measured["max_prob_diff"] <= record["tolerance"],
        }

    picked = None
    for tier in record["offered"]:
        if tier == "float32":
            break
        if picked and body_of(tier) == "float16":
            continue  # a fallback must not overflow where its tier did
        record["tried"].append(trial(tier))
        if not record["tried"][-1]["accepted"]:
            continue
        if picked:
            record["fallback"] = tier
            break
        picked = record["tier"] = tier
        if body_of(tier) != "float16":
            break
    if picked and body_of(picked) == "float16":
        record.setdefault("fallback", "float32")
    print(f"probekit: {describe_precision(record)}", file=sys.stderr)
    _put(model, record)
    return record


def overflowed(results: Sequence[ScoreResult]) -> int:
    """How many of `results` are not finite (their activations overflowed)."""
    return sum(not math.isfinite(r.valid_mass) for r in results)


def _put(model: HookableModel, record: dict[str, Any]) -> None:
    """Put the float32 `model` in `record`'s tier and keep the record; with a fallback, keep the
    way back to float32 too (`fall_back`)."""
    undo = apply_tier(model, record["tier"])
    if "fallback" in record:
        model.meta[UNDO] = undo
    model.meta["precision"] = record


def fall_back(model: HookableModel, overflowed: int) -> bool:
    """After `overflowed` prompts of a batch overflowed: put a model in the fallback its record
    measured, say so in one line on stderr and return True; False where there is none (a tier
    without one, or the model already fell back)."""
    undo = model.meta.pop(UNDO, None)
    if undo is None:
        return False
    undo()
    record = model.meta["precision"]
    old, new = record["tier"], record.pop("fallback")
    apply_tier(model, new)
    record |= {"tier": new, "fell_back_from": old}
    print(
        f"probekit: {TIER_LABELS[old]} overflowed on {overflowed} prompt(s) (activations beyond "
        f"its range); scoring in {TIER_LABELS[new]} from here on",
        file=sys.stderr,
    )
    return True


def settle_precision(
    model: HookableModel, answers: AnswerSet, prompts: Sequence[Sequence[int]], seed: int = 0
) -> dict[str, Any]:
    """`LoadedModel.settle_precision`: the record of a model whose tier is chosen, else
    `choose_precision` on a seeded sample of `NOISE_SAMPLE` of `prompts` with the tolerance it
    was loaded with."""
    record = model.meta.get("precision", {})
    if "tier" in record:
        return record
    sample = seeded_sample(prompts, NOISE_SAMPLE, seed)
    return choose_precision(model, sample, answers, record.get("tolerance"), record.get("offered"))


def seeded_sample(prompts: Sequence[Sequence[int]], count: int, seed: int) -> list[Sequence[int]]:
    """At most `count` of `prompts`, drawn with `seed`, in their order."""
    picked = random.Random(seed).sample(range(len(prompts)), min(count, len(prompts)))
    return [prompts[i] for i in sorted(picked)]


def keep_tier(
    model: HookableModel, record: Mapping[str, Any], why: str = "kept from the run being resumed"
) -> dict[str, Any] | None:
    """`LoadedModel.keep_precision`: `model`, its tier not chosen yet, put in the tier of
    `record` without measuring (`why` its note); None where it is chosen or `record`'s is not
    offered."""
    pending = model.meta.get("precision", {})
    offered = pending.get("offered", offered_tiers(model)[0])
    if "tier" in pending or record.get("tier") not in offered:
        return None
    kept = {**record, "note": why}
    _put(model, kept)
    return kept


# ------------------------------------------------------------------ the noise figure


@contextlib.contextmanager
def as_dtype(model: HookableModel, dtype: torch.dtype) -> Iterator[HookableModel]:
    """`model` with every floating parameter cast to `dtype` in place, restored on exit: the
    model as `load_model(..., dtype=dtype)` gives it (buffers such as the rotary frequencies stay
    float32 there too). Widening and narrowing back is lossless, so no second copy of the model is
    loaded: the peak memory is the model in `dtype`."""
    tensors = [t for t in model.hf.parameters() if t.is_floating_point()]
    saved = [t.dtype for t in tensors]
    old = model.dtype
    try:
        for t in tensors:
            t.data = t.data.to(dtype)
        model.dtype = dtype
        yield model
    finally:
        for t, was in zip(tensors, saved, strict=True):
            t.data = t.data.to(was)
        model.dtype = old


@public(SeedOption)
def noise_figure(
    model: HookableModel,
    prompts: Sequence[Sequence[int]],
    answers: AnswerSet,
    reference: torch.dtype | None = None,
    sample: int = NOISE_SAMPLE,
    *,
    seed: int = 0,
    epsilon: float,
    own: Sequence[ScoreResult] | None = None,
) -> dict[str, Any]:
    """Score a seeded sample of `prompts` (token ids) in the model's dtype and in `reference`
    (default: float64 for a float32 or wider model, float32 for a narrower one) at the same
    `epsilon` (a run's; 0: every answer exactly, so the difference is the arithmetic's alone);
    return the dtypes, the sample size, the largest
    differences, the cost and the parts kept in float32 (`fp32_parts`). A float64 reference on
    MPS, which has none, is a `note` instead.

    `own`: the run's results of exactly these prompts, which then are all used and not scored
    again in the model's dtype (a run's noise costs one reference pass of its sample).
    `max_abs_diff` is of the headline per-prompt score: the expected value for numeric answers
    (`score: "expected"`), else the answer probabilities (`score: "probability"`);
    `max_valid_mass_rel_diff` is of the valid mass relative to the reference's;
    `most_probable_changes` counts prompts whose most probable answer differs."""
    wider = model.dtype in (torch.float32, torch.float64)
    reference = reference or (torch.float64 if wider else torch.float32)
    if model.device.type == "mps" and reference.itemsize == 8:
        return {"dtype": dtype_name(model.dtype), "note": "MPS has no float64 to measure against"}
    if not prompts:
        raise ProbekitError("the noise figure needs at least one prompt")
    started, cpu = time.perf_counter(), time.process_time()
    if own is None:
        prompts = seeded_sample(prompts, sample, seed)
        own = list(model.scorer(answers, epsilon=epsilon).score(prompts))
    with as_dtype(model, reference):
        wide = list(model.scorer(answers, epsilon=epsilon).score(prompts))
    return {
        "dtype": dtype_name(model.dtype),
        "reference_dtype": dtype_name(reference),
        "device": str(model.device),
        "sample": len(prompts),
        "seed": seed,
        "epsilon": epsilon,
        **score_differences(own, wide, numeric=answers.numeric),
        "seconds": round(time.perf_counter() - started, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "fp32_parts": model.meta.get("fp32_parts", []),
    }


def score_differences(results: Sequence[Any], reference: Sequence[Any], numeric: bool) -> dict:
    """The largest differences between two lists of `ScoreResult` of the same prompts."""
    probs, ref = (np.array([r.probs for r in rs]) for rs in (results, reference))
    mass, ref_mass = (np.array([r.valid_mass for r in rs]) for rs in (results, reference))
    diff = prob_diff = np.abs(probs - ref)
    if numeric:
        expected = [[r.expected for r in rs] for rs in (results, reference)]
        diff = np.abs(np.subtract(*np.array(expected, dtype=float)))
    return {
        "score": "expected" if numeric else "probability",
        "max_abs_diff": float(np.max(diff)),
        "max_prob_diff": float(np.max(prob_diff)),
        "max_valid_mass_rel_diff": float(np.max(np.abs(mass - ref_mass) / ref_mass)),
        "most_probable_changes": int(
            sum(r.most_probable != w.most_probable for r, w in zip(results, reference, strict=True))
        ),
    }
