"""Numeric precision of the exact scores: the float32 answer head under reduced-precision
weights, and the noise figure every run reports.

The exact view is exact up to the arithmetic of the dtype it runs in. In float32 the answer
probabilities agree with a float64 copy of the model to ~1e-6; in bfloat16 the rounding of the
residual stream and of the logits moves them by up to ~1e-2 (`benchmarks/dtype.py` measures it
per study). Two things here keep that honest:

- `keep_head_fp32`: with bfloat16 or float16 weights, the final norm and the LM head (the
  parts that turn the last hidden state into the answer distribution) run in float32; the
  log-softmax and the vocabulary sums already do (`engines/hf/scorer.py`).
- `noise_figure`: re-scores a small seeded sample of a run's prompts in a wider dtype (float32
  for a reduced-precision run, float64 for a float32 one) and returns the largest difference of
  the headline per-prompt score and of the valid mass, so that a reader knows whether a
  difference in the results is larger than the arithmetic.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.public import public
from probekit.core.shared_options import SeedOption
from probekit.engines.base import ScoreResult

if TYPE_CHECKING:
    from probekit.engines.hf.protocol import HFModel

REDUCED = (torch.bfloat16, torch.float16)
"""Weight dtypes whose final norm and LM head `load_model` keeps in float32."""
FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm")
"""Attribute names of the final norm on a Hugging Face base model (Llama/Qwen/Gemma, GPT-2, ...)."""
NOISE_SAMPLE = 8
FP32_MEMORY_SHARE = 0.5
"""An accelerator runs a model in float32 by default when its float32 weights take at most this
share of its memory (the rest holds the KV caches of the prompt and trie passes)."""


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory of an accelerator (None where torch cannot say, e.g. MPS)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return None


def parameter_count(spec: str) -> int | None:
    """Weights of model `spec` (as `load_model` takes it) without loading them: a GGUF's tensor
    shapes, else the config's model built on the meta device; None when neither can be read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from probekit.engines.hf.gguf import converted_cache_dir, default_gguf_path

    try:
        path = default_gguf_path() if spec == "default" else Path(spec).expanduser()
        if path.suffix == ".gguf":
            converted = converted_cache_dir(path)  # after the first load; else read the GGUF
            if not (converted / "config.json").is_file():
                from gguf import GGUFReader

                return sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors)
            spec = str(converted)
        config = AutoConfig.from_pretrained(spec)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError, ImportError, ProbekitError):
        return None
    return sum(p.numel() for p in model.parameters())


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> `bfloat16`."""
    return str(dtype).removeprefix("torch.")


def keep_head_fp32(hf: Any) -> list[str]:
    """Run the final norm and the LM head of `hf` in float32 whatever the body's dtype; return
    the parts changed (for the manifest).

    The norm's weights become float32 and its input is cast up before it, so the hidden state
    the head reads is never rounded to the body's dtype; a head tied to the input embeddings gets
    its own float32 copy (the embeddings keep theirs), which costs vocab x width x 4 bytes. On a
    dispatched model the copy keeps the head's device hook; a head offloaded to the CPU or disk
    (its weights not in memory) keeps its dtype."""
    changed = []
    norm = final_norm(hf)
    if norm is not None:
        norm.float()
        norm.register_forward_pre_hook(inputs_to_fp32)
        changed.append("final norm")
    head = hf.get_output_embeddings()
    if head is not None and head.weight.device.type == "meta":
        return changed  # offloaded by a device map: its weights arrive per forward as stored
    if head is not None and head.weight.dtype != torch.float32:
        fp32 = torch.nn.Linear(
            head.in_features,
            head.out_features,
            bias=head.bias is not None,
            device=head.weight.device,
            dtype=torch.float32,
        )
        with torch.no_grad():
            fp32.weight.copy_(head.weight)
            if head.bias is not None:
                fp32.bias.copy_(head.bias)
        hook = getattr(head, "_hf_hook", None)
        if hook is not None:  # accelerate's dispatch: run where the head was put
            from accelerate.hooks import add_hook_to_module

            add_hook_to_module(fp32, hook)
        hf.set_output_embeddings(fp32)
        hf.config.tie_word_embeddings = False  # a later tie_weights() must not share it again
        changed.append("LM head")
    return changed


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


@contextlib.contextmanager
def as_dtype(model: HFModel, dtype: torch.dtype) -> Iterator[HFModel]:
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


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a run's noise is measured against: float64 for a float32 (or wider) run,
    float32 for a reduced-precision one."""
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


@public(SeedOption)
def noise_figure(
    model: HFModel,
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
    (default `reference_dtype`) at the same `epsilon` (a run's; 0: every answer exactly, so the
    difference is the arithmetic's alone); return the dtypes, the sample size, the largest
    differences and the cost.

    `own`: the run's results of exactly these prompts, which then are all used and not scored
    again in the model's dtype (a run's noise costs one reference pass of its sample).
    `max_abs_diff` is of the headline per-prompt score: the expected value for numeric answers
    (`score: "expected"`), else the answer probabilities (`score: "probability"`);
    `max_valid_mass_rel_diff` is of the valid mass relative to the reference's;
    `most_probable_changes` counts prompts whose most probable answer differs."""
    reference = reference or reference_dtype(model.dtype)
    if not prompts:
        raise ProbekitError("the noise figure needs at least one prompt")
    if own is not None and len(own) != len(prompts):
        raise ProbekitError(f"got {len(own)} results for {len(prompts)} prompts")
    started, cpu = time.perf_counter(), time.process_time()
    if own is None:
        count = min(sample, len(prompts))
        picked = sorted(random.Random(seed).sample(range(len(prompts)), count))
        prompts = [prompts[i] for i in picked]
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
    }


def score_differences(results: Sequence[Any], reference: Sequence[Any], numeric: bool) -> dict:
    """The largest differences between two lists of `ScoreResult` of the same prompts."""
    probs = np.array([r.probs for r in results])
    ref = np.array([r.probs for r in reference])
    mass = np.array([r.valid_mass for r in results])
    ref_mass = np.array([r.valid_mass for r in reference])
    if numeric:
        score = "expected"
        diff = np.abs(
            np.array([r.expected for r in results], dtype=float)
            - np.array([r.expected for r in reference], dtype=float)
        )
    else:
        score, diff = "probability", np.abs(probs - ref)
    return {
        "score": score,
        "max_abs_diff": float(np.max(diff)),
        "max_prob_diff": float(np.max(np.abs(probs - ref))),
        "max_valid_mass_rel_diff": float(np.max(np.abs(mass - ref_mass) / ref_mass)),
        "most_probable_changes": int(
            sum(r.most_probable != w.most_probable for r, w in zip(results, reference, strict=True))
        ),
    }


def describe_noise(figure: dict[str, Any]) -> str:
    """One line for a summary: dtype, reference and the largest differences."""
    what = "expected value" if figure["score"] == "expected" else "answer probability"
    return (
        f"numerics: scored in {figure['dtype']} on {figure['device']}; against "
        f"{figure['reference_dtype']} on {figure['sample']} seeded prompts the {what} moves by "
        f"at most {figure['max_abs_diff']:.2g}, the valid mass by "
        f"{figure['max_valid_mass_rel_diff']:.2g} (relative); "
        f"{_changes(figure)} most probable answer(s) change"
    )


def _changes(figure: dict[str, Any]) -> Any:
    """The figure's count of changed most probable answers (`argmax_changes` in the manifests of
    results format 3 and earlier)."""
    return figure.get("most_probable_changes", figure.get("argmax_changes"))
