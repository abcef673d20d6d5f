"""The options of loading and scoring a model, declared once (`probekit.core.options`) for every
command that loads one and for `load_engine`, `score` and the engines' scorers: `ModelOptions`
(which model, on which device, in which dtype, placed how), `EpsilonOption`, `ScoreOptions` and
`ScorerOptions` (what an engine's scorer is asked to do). `probekit plan`'s
`probekit.engines.plan.PlanOptions` shares the model and its dtype (`ModelChoice`). Nothing
here imports a model library."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from probekit.core.answers import AnswerSet, as_answer_set
from probekit.core.errors import ProbekitError
from probekit.core.kinds import (
    Kind,
    choice,
    function,
    non_negative_float,
    non_negative_int,
    path,
    positive_int,
    probability,
    refuse,
    text,
)
from probekit.core.options import REQUIRED, given, named, option
from probekit.core.public import public
from probekit.core.shared_options import BatchSizeOption, SeedOption
from probekit.engines.base import ENGINES, Engine
from probekit.engines.chat_templates import check_chat_template
from probekit.engines.devices import parse_device_map, parse_devices

DTYPES = ("float32", "bfloat16", "float16", "float64")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
DEVICE_NAME = re.compile(r"cpu|mps|cuda(:\d+)?")
device_sizes = Kind("devices", str, parse_devices)
"""Devices and their memory, `cuda:0=70GiB,cpu=150MiB` (`--max-memory`, `probekit plan`)."""


def dtype_name(value: Any) -> str | None:
    """The name of a floating-point dtype (`bfloat16`) given by a name, an alias (fp32, bf16,
    fp16, half) or a `torch.dtype`; None for anything else. The one reading of a dtype: the
    options', the loader's and the memory plan's."""
    if type(value).__module__ == "torch":  # a torch.dtype: named without importing torch here
        value = str(value).removeprefix("torch.")
    name = DTYPE_ALIASES.get(value, value) if isinstance(value, str) else None
    return name if name in DTYPES else None


def _dtype_value(value: Any) -> str:
    named = str(value).removeprefix("torch.") if type(value).__module__ == "torch" else value
    return dtype_name(value) or refuse(f"{named!r} is not a dtype; choose {', '.join(DTYPES)}")


floating_dtype = Kind("dtype", str, _dtype_value)
"""A floating-point dtype, held by its name (`dtype_name`): text, or a `torch.dtype`."""


def _device_value(value: Any) -> str:
    if type(value).__module__ == "torch":  # a torch.device
        value = str(value)
    if not isinstance(value, str) or not DEVICE_NAME.fullmatch(value):
        refuse(f"'{value}' is not a device; use cpu, cuda, cuda:N or mps")
    return value


device_name = Kind("device", str, _device_value)
"""cpu, cuda, cuda:N or mps: text, or a `torch.device`."""


DEFAULT_TOLERANCE = 0.005
"""The tolerance of a run that names none (docs/concepts.md, "The precision tier"): between what
the two faster tiers were measured to cause on the default model, each by a factor of about 3
(`benchmarks/results/dtype.json`: TF32 moves an answer probability by at most 1.6e-3 on every
study's slice, 1.3e-3 on an H100; bfloat16 by at least 0.016, 0.015 on the H100), so that TF32
is taken where it passes and bfloat16, which moves the intergroup Δ and ISEAR's max_diff by
several times their 95 % interval's half-width, only when a run asks for it."""
NOISE_SAMPLE = 8
"""The most prompts a precision tier is chosen on (a seeded sample of the run's), and a run's
noise figure measured on."""


def _model(value: Any) -> str:
    return str(value) if isinstance(value, Path) else text.check(value)


model_spec = Kind("model", str, _model)
"""A model: `default`, a Hugging Face id, a model folder or a `.gguf` file (text or a Path)."""


def _vllm_gpus(split: str) -> Any:
    """The option of a vLLM parallel size: vLLM splits `split` over N GPUs (`probekit run`)."""
    return option(
        None,
        help=f"vLLM splits {split} over N GPUs (--engine vllm only)",
        kind=positive_int,
        commands=("run",),
        metavar="N",
    )


_MODEL = "hub id, model folder, .gguf file or default (default %(default)s)"


@dataclass(frozen=True)
class ModelChoice:
    """Which model, in which dtype: the options of every command that loads a model, and of
    `probekit plan`."""

    model: str = option(
        "default",
        help={
            "run": f"{_MODEL}; give it several times for one folder each, summarised side by side",
            "plan": f"{_MODEL}, or a config.json; a hub id only from the local cache",
            "": _MODEL,
        },
        kind=model_spec,
        several=("run",),
    )
    dtype: str | None = option(
        None,
        help=f"{', '.join(DTYPES)} (default: float32 on the CPU and wherever the float32 "
        "weights fit in half the accelerator's memory, else bfloat16)",
        kind=floating_dtype,
    )


@dataclass(frozen=True)
class ModelOptions(ModelChoice):
    """Model options: which model, on which device, in which dtype, placed how."""

    device: str | None = option(
        None, help="cpu, cuda, cuda:N or mps (default: the best there is)", kind=device_name
    )
    engine: str = option(
        "hf",
        help={
            "run": "hf (transformers, the default) or vllm (generation through vLLM; the exact "
            "view stays hf's)",
            "": "hf (transformers, the default; the only engine with hooks)",
        },
        kind=choice("engine", ENGINES.keys()),  # a live view: engines registered later too
    )
    device_map: str | dict[str, Any] | None = option(
        None,
        help="place the model over several devices with accelerate: auto, balanced, "
        "sequential, or a JSON object (text or .json file) of module -> device",
        kind=Kind("device map", str, parse_device_map),
    )
    max_memory: dict[str, int] | None = option(
        None,
        help="memory the device map may fill per device, e.g. cuda:0=70GiB,cpu=150MiB "
        "(implies --device-map auto)",
        kind=device_sizes,
        metavar="DEVICE=SIZE[,...]",
    )
    offload_folder: Path | None = option(
        None,
        help="where the device map may put weights that fit nowhere else (disk offload; "
        "implies --device-map auto)",
        kind=path,
        metavar="DIR",
    )
    tensor_parallel_size: int | None = _vllm_gpus("every layer")
    pipeline_parallel_size: int | None = _vllm_gpus("the layers")
    tolerance: float | None = option(
        None,
        help="largest change of an answer probability the chosen arithmetic may cause (see "
        "docs/concepts.md; default %(default)s): on a GPU the fastest precision tier that meets "
        "it on the run's prompts, of float16+head, bfloat16+head, tf32+head, float16, bfloat16, "
        "tf32, float32 (fastest first; a +head tier runs the LM head in its arithmetic too); not "
        "with --dtype",
        kind=probability,
        metavar="T",
        none=f"{DEFAULT_TOLERANCE:g}",
    )
    chat_template: str | None = option(
        None,
        help="the chat template of a model without one of its own (a model with one keeps it): "
        "a Jinja file, or gemma (Gemma's turns, shipped with probekit)",
        kind=Kind("chat template", str, check_chat_template),
        metavar="FILE|NAME",
    )
    quiet: bool = option(
        False, help="no progress lines or time estimates (errors, warnings and results still print)"
    )

    def load_keywords(self, **changes: Any) -> dict[str, Any]:
        """`load_engine`'s keywords after the model: the options given, updated by `changes`
        (e.g. a distributed launch's own device)."""
        given = {f.name: getattr(self, f.name) for f in fields(self)} | changes
        return {k: v for k, v in given.items() if v is not None and k not in ("model", "quiet")}

    def check(self) -> None:
        """One line for options valid one by one but not together (`model_conflict`), before
        any data or model loads."""
        if conflict := model_conflict(**self.load_keywords()):
            raise ProbekitError(conflict)

    @property
    def tolerance_asked(self) -> float | None:
        """The tolerance the hf engine picks its precision tier by (`DEFAULT_TOLERANCE` when
        none is given); None where a dtype is given or another engine scores."""
        if self.dtype is not None or self.engine != "hf":
            return None
        return DEFAULT_TOLERANCE if self.tolerance is None else self.tolerance

    @property
    def placed(self) -> list[str]:
        """The placement options given (a device map and what implies one, vLLM's sizes)."""
        return [n for n in (*DISPATCH, PARALLEL[0]) if getattr(self, n) is not None]


def check_models(parsed: tuple) -> None:
    """A command's check (`probekit.core.options.Command.checks`): every `ModelOptions` among its
    values (`probekit run` takes several) checked together (`ModelOptions.check`)."""
    for value in parsed:
        for model in value if isinstance(value, list) else [value]:
            if isinstance(model, ModelOptions):
                model.check()


PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size")
"""vLLM's own placement keywords (the hf engine places a model with a device map instead)."""
DISPATCH = ("device_map", "max_memory", "offload_folder")
"""The options that place a model with accelerate's device map (`max_memory` and
`offload_folder` imply `device_map="auto"`)."""


def model_conflict(engine: str = "hf", **values: Any) -> str | None:
    """Why the model options `values` (`ModelOptions` fields; None: not given) cannot go
    together, as one line naming them in the caller's words (`named`), or None. The one rule of
    `ModelOptions.check` (every command, while its options are parsed) and of `load_engine` and
    `load_model`."""
    values = {name: value for name, value in values.items() if value is not None}
    parallel = [name for name in PARALLEL if name in values]
    if parallel and engine != "vllm":
        return (
            f"{named(parallel[0])} is vLLM's ({given('engine', 'vllm')}); the {engine} engine "
            f"splits a model over devices with {named('device_map')}"
        )
    if "tolerance" in values and engine != "hf":
        return f"{named('tolerance')} picks the hf engine's arithmetic, not the {engine}'s"
    if "tolerance" in values and "dtype" in values:
        return (
            f"give {named('dtype')} or {named('tolerance')}, not both: the dtype forces the "
            "arithmetic, the tolerance lets probekit choose it by its measured error"
        )
    dispatch = [name for name in DISPATCH if name in values]
    if dispatch and "device" in values:
        return (
            f"give {given('device', values['device'])} or {named(dispatch[0])}, not both: a "
            "device map decides where each layer runs"
        )
    return None


@dataclass(frozen=True)
class EpsilonOption:
    """Pruning bound."""

    epsilon: float = option(
        1e-4,
        help="pruning bound: every row's error_bound (pruned mass / valid mass) is at most "
        "this (default %(default)s; 0: exact)",
        kind=non_negative_float,
        defaults={"patch": 0.0, "steer": 0.0},  # the mechanism reads exact distributions
    )


answer_spec = Kind("answers", str, as_answer_set)
"""An answer set: a spec (`0-10`, `A-E`, `A,B,C`, `@file`), a list, or an `AnswerSet`."""


@dataclass(frozen=True, kw_only=True)
class ScoreOptions(BatchSizeOption, EpsilonOption):
    """Scoring options: the answers, and how each prompt is scored."""

    answers: AnswerSet = option(
        REQUIRED,
        help="lo-hi (0-100), a list (A,B,C,D) or @file (one a line); from Python also an "
        "AnswerSet or a list of strings or numbers",
        kind=answer_spec,
    )
    prefill: str = option("", help="text forced at the start of the response", kind=text)


@dataclass(frozen=True, kw_only=True)
class ScorerOptions(EpsilonOption, BatchSizeOption, SeedOption):
    """What a scorer is asked to do: the keywords of `Engine.scorer` (and of the transformers
    engine's `HFScorer`), checked by their kinds when made. Besides the pruning bound and the
    batch size, a generation budget: `max_new_tokens` > 0 also decodes a continuation of every
    prompt (generate mode), from the same prompt pass, greedy or sampled at `temperature` > 0
    (seeded by `seed`); a row stops at end of sequence or as soon as `settled(text so far)` says
    that more text cannot change its parsed answer (the study's stop rule), so a large budget
    costs little on rows that answer early."""

    max_new_tokens: int = option(
        0, help="new tokens decoded per prompt (0: none, exact scores only)", kind=non_negative_int
    )
    settled: Any = option(
        None,
        help="(text so far) -> True once more text cannot change the parsed answer",
        kind=function,
    )
    temperature: float = option(
        0.0, help="0 decodes greedily, > 0 samples (seeded by seed)", kind=non_negative_float
    )


public(ScorerOptions)(ScorerOptions)  # made in code (`VllmEngine.scorer`): checked as it is made


def loaded_engine(model: Any, **load: Any) -> Engine | None:
    """The engine `model` is, or None for a model spec (text or a Path) still to load; one line
    for anything else, and for an option of `load` (`ModelOptions` fields) given with a loaded
    model: it cannot apply to a model that is loaded already."""
    if isinstance(model, str | Path):
        return None
    if not isinstance(model, Engine):
        raise ProbekitError(
            "model must be a model spec (default, a hub id, a model folder, a .gguf file) or a "
            f"loaded model, not {model!r}"
        )
    defaults = {f.name: f.default for f in fields(ModelOptions)}
    if asked := [k for k, v in load.items() if k != "quiet" and v not in (None, defaults[k])]:
        raise ProbekitError(
            f"{given(asked[0], load[asked[0]])} cannot apply to a model loaded already (it "
            f"scores as it was loaded): give it to load_model, or give the model's name"
        )
    return model
