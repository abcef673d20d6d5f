"""Precision tiers: the arithmetic a model scores in, chosen by the error it is measured to cause.

A run states the largest change of an answer probability it accepts (`tolerance`, `--tolerance`)
and gets the fastest tier that meets it on its own prompts. The tiers (`arithmetic.TIERS`, fastest
first) pair the transformer body's arithmetic with the LM head's:

- `float16+head`, `bfloat16+head`: 16-bit weights and activations, the final norm in float32, the
  LM head on the hidden state rounded to 16 bits with its products summed in float32;
- `tf32+head`: float32 weights, every matrix product (the LM head's too) with TF32 inputs (10
  mantissa bits, float32 sums);
- `float16`, `bfloat16`, `tf32`: the same bodies with the LM head in float32 (`bfloat16` as
  `load_model(dtype="bfloat16")` gives it);
- `float32`: the reference of the others (its own error against float64 is every run's noise
  figure, `precision.noise_figure`).

The log-softmax and the vocabulary sums are float64-accurate in every tier. A CUDA device of
compute capability 8 or more (Ampere and later) offers all of them, one of 7.x (Volta, Turing:
float16 tensor cores only) the float16 tiers and float32; any other device, a model dispatched by
a device map, and a model whose float32 weights did not fit (loaded in bfloat16 by the memory
policy) offer one, which is then taken without measuring anything: on a CPU float32 is the
fastest arithmetic there is. Where tiers are offered, `choose_precision` scores a seeded sample
of the run's prompts exactly (epsilon 0) in float32, then in each faster tier, fastest first, and
keeps the first whose largest |difference| of an answer probability is at most the tolerance; the
record (`LoadedModel.meta["precision"]`, in `describe()` and so in every run manifest) says what
was offered, tried, measured and picked.

float16 has 5 exponent bits: an activation beyond 65504 overflows. A float16 tier whose sample
overflows (non-finite scores) is not taken; when one is taken, the next measured tier that meets
the tolerance and is not float16 is its `fallback`, to which the scorer switches, with one line,
if a later batch overflows (`fall_back`).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.kinds import probability
from probekit.core.options import option_message
from probekit.engines.base import ScoreResult
from probekit.engines.hf.arithmetic import LABELS, TIERS, apply_tier, body_of
from probekit.engines.hf.precision import NOISE_SAMPLE, dtype_name, score_differences
from probekit.engines.options import DEFAULT_TOLERANCE

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel


UNDO = "undo_tier"
"""`LoadedModel.meta` key of the call that puts a model with a fallback back in float32."""


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
    capability = torch.cuda.get_device_capability(model.device)
    if capability < (7, 0):
        return ("float32",)
    if capability < (8, 0):
        return tuple(t for t in TIERS if body_of(t) in ("float16", "float32"))
    return TIERS


def _why_one(model: HFModel) -> str:
    """Why `model` is offered a single tier."""
    if model.dtype != torch.float32:
        return f"loaded in {dtype_name(model.dtype)}: the only tier offered"
    if model.dispatched:
        return "a model dispatched by a device map is scored in float32"
    if model.device.type == "cuda":
        return "this GPU has no tensor cores: float32 only"
    return f"float32 is the fastest arithmetic on {model.device.type}: nothing to choose"


def initial_record(model: HFModel, forced: bool, tolerance: float | None) -> dict[str, Any]:
    """The precision record of a model just loaded: the dtype given (`forced`), the one tier
    its device offers, or the tolerance a first score will choose the tier by."""
    if forced:
        return {"tier": dtype_name(model.dtype), "note": "the dtype given"}
    offered = offered_tiers(model)
    record = {
        "tolerance": DEFAULT_TOLERANCE if tolerance is None else tolerance,
        "offered": list(offered),
    }
    if len(offered) == 1:
        return {**record, "tier": offered[0], "tried": [], "note": _why_one(model)}
    return record


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
    `offered`, `tried` (per measured tier `score_differences`' fields, or `overflow` (the
    prompts whose scores were not finite) or `failed` (why it did not run), and `accepted`),
    `sample`, `reference`, and for a float16 tier its `fallback` (see the module's docstring).
    A single offered tier is taken without measuring."""
    tolerance = DEFAULT_TOLERANCE if tolerance is None else check_tolerance(tolerance)
    offered = tuple(offered or offered_tiers(model))
    record: dict[str, Any] = {"tolerance": tolerance, "offered": list(offered), "tried": []}
    if len(offered) == 1:
        record |= {"tier": offered[0], "note": _why_one(model)}
        model.meta["precision"] = record
        return record
    if not prompts:
        raise ProbekitError("choosing a precision tier needs at least one prompt")
    reference = _exact(model, prompts, answers)
    record |= {"tier": "float32", "sample": len(prompts), "reference": "float32"}
    picked = None
    for tier in offered:
        if tier == "float32":
            break
        if picked and overflows(tier):
            continue  # a fallback must not overflow where its tier did
        trial = _trial(model, tier, prompts, answers, reference, tolerance)
        record["tried"].append(trial)
        if not trial["accepted"]:
            continue
        if picked:
            record["fallback"] = tier
            break
        picked = record["tier"] = tier
        if not overflows(tier):
            break
    if picked and overflows(picked):
        record.setdefault("fallback", "float32")
    print(f"probekit: {describe_precision(record)}", file=sys.stderr)
    _put(model, record)
    return record


def overflows(tier: str) -> bool:
    """Whether `tier` can overflow where float32 does not (a float16 body)."""
    return body_of(tier) == "float16"


def _trial(
    model: HFModel,
    tier: str,
    prompts: Sequence[Sequence[int]],
    answers: AnswerSet,
    reference: list[ScoreResult],
    tolerance: float,
) -> dict[str, Any]:
    """`tier`'s differences from `reference` on `prompts`, the model put back in float32 after.
    A tier that does not run (a kernel this device lacks) is refused with the first line of its
    error, and one whose scores are not finite (float16 overflow) with the count."""
    undo = apply_tier(model, tier)
    try:
        scored = _exact(model, prompts, answers)
    except RuntimeError as error:
        return {"tier": tier, "failed": str(error).splitlines()[0], "accepted": False}
    finally:
        undo()
    bad = overflowed(scored)
    if bad:
        return {"tier": tier, "overflow": bad, "accepted": False}
    measured = score_differences(scored, reference, answers.numeric)
    return {"tier": tier, **measured, "accepted": measured["max_prob_diff"] <= tolerance}


def overflowed(results: Sequence[ScoreResult]) -> int:
    """How many of `results` are not finite (their activations overflowed)."""
    return sum(not math.isfinite(r.valid_mass) for r in results)


def _exact(model: HFModel, prompts: Sequence[Sequence[int]], answers: AnswerSet) -> list:
    return list(model.scorer(answers, epsilon=0.0).score(prompts))


def _put(model: HFModel, record: dict[str, Any]) -> None:
    """Put the float32 `model` in `record`'s tier and keep the record; with a fallback, keep the
    way back to float32 too (`fall_back`)."""
    undo = apply_tier(model, record["tier"])
    if "fallback" in record:
        model.meta[UNDO] = undo
    model.meta["precision"] = record


def fall_back(model: HFModel, overflowed: int) -> bool:
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
        f"probekit: {LABELS[old]} overflowed on {overflowed} prompt(s) (activations beyond "
        f"its range); scoring in {LABELS[new]} from here on",
        file=sys.stderr,
    )
    return True


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
    kept = {**record, "note": "kept from the run being resumed"}
    _put(engine, kept)
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
    parts = [f"{LABELS[t['tier']]} {_outcome(t)}" for t in tried]
    line = f"{head}; on {record['sample']} prompts against float32: {'; '.join(parts)}"
    if "fallback" in record:
        line += f"; on overflow: {LABELS[record['fallback']]}"
    return line


def _outcome(trial: Mapping[str, Any]) -> str:
    """What one tier's measurement found, for `describe_precision`."""
    if "failed" in trial:
        return f"did not run ({trial['failed']})"
    if "overflow" in trial:
        return f"overflowed on {trial['overflow']} prompt(s)"
    verdict = "accepted" if trial["accepted"] else "over the tolerance"
    return f"moves an answer probability by {trial['max_prob_diff']:.2g} ({verdict})"
