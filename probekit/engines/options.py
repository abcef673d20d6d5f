"""The options of loading and scoring a model, declared once (`probekit.core.options`) for every
command that loads one and for `load_engine` and `score`: `ModelOptions` (which model, on which
device, in which dtype, placed how), `EpsilonOption` and `ScoreOptions`. `probekit plan`'s
`probekit.engines.plan.PlanOptions` shares the model and its dtype (`ModelChoice`).
`check_device` says in one line when a named device is missing from this torch, for the command
line and the API alike. Nothing here imports a model library."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probekit.core.answers import AnswerSet, as_answer_set
from probekit.core.errors import ProbekitError
from probekit.core.kinds import (
    DTYPES,
    Kind,
    checked_by,
    device_name,
    floating_dtype,
    non_negative_float,
    path,
    positive_int,
    probability,
    text,
)
from probekit.core.options import REQUIRED, BatchSizeOption, option
from probekit.engines.base import DEFAULT_EPSILON, ENGINES, Engine
from probekit.engines.devices import parse_device_map, parse_devices


def _engine(value: Any) -> str:
    if value not in ENGINES:
        raise ProbekitError(f"unknown engine '{value}'; choose one of: {', '.join(ENGINES)}")
    return value


def _model(value: Any) -> str:
    if isinstance(value, Path):
        return str(value)
    return text.check(value)


model_spec = Kind("model", str, _model)
"""A model: `default`, a Hugging Face id, a model folder or a `.gguf` file (text or a Path)."""


@dataclass(frozen=True)
class ModelChoice:
    """Which model, in which dtype: the options of every command that loads a model, and of
    `probekit plan`."""

    model: str = option(
        "default",
        help="hub id, model folder, .gguf file or default (default %(default)s); probekit run "
        "takes it several times: one folder each, summarised side by side; probekit plan also "
        "reads a config.json, and a hub id only from the local cache",
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
        help="hf (transformers, the default) or vllm (probekit run only: generation through "
        "vLLM; the exact view stays hf's)",
        kind=checked_by("engine", _engine),
    )
    device_map: str | dict[str, Any] | None = option(
        None,
        help="place the model over several devices with accelerate: auto, balanced, "
        "sequential, or a JSON object (text or .json file) of module -> device",
        kind=checked_by("device map", parse_device_map),
    )
    max_memory: dict[str, int] | None = option(
        None,
        help="memory the device map may fill per device, e.g. cuda:0=70GiB,cpu=150MiB "
        "(implies --device-map auto)",
        kind=checked_by("devices", parse_devices),
        metavar="DEVICE=SIZE[,...]",
    )
    offload_folder: Path | None = option(
        None,
        help="where the device map may put weights that fit nowhere else (disk offload; "
        "implies --device-map auto)",
        kind=path,
        metavar="DIR",
    )
    tensor_parallel_size: int | None = option(
        None,
        help="vLLM splits every layer over N GPUs (--engine vllm only)",
        kind=positive_int,
        commands=("run",),
        metavar="N",
    )
    pipeline_parallel_size: int | None = option(
        None,
        help="vLLM splits the layers over N GPUs (--engine vllm only)",
        kind=positive_int,
        commands=("run",),
        metavar="N",
    )
    tolerance: float | None = option(
        None,
        help="largest change of an answer probability the chosen arithmetic may cause (see "
        "docs/concepts.md; default 0.005): on a GPU the fastest of bfloat16, TF32 and float32 "
        "that meets it on the run's prompts; not with --dtype",
        kind=probability,
        metavar="T",
    )
    quiet: bool = option(
        False, help="no progress lines or time estimates (errors, warnings and results still print)"
    )

    def load_keywords(self, **changes: Any) -> dict[str, Any]:
        """`load_engine`'s keywords after the model: the options given, updated by `changes`
        (e.g. a distributed launch's own device)."""
        given = {
            "engine": self.engine,
            "device": self.device,
            "dtype": self.dtype,
            "device_map": self.device_map,
            "max_memory": self.max_memory,
            "offload_folder": self.offload_folder,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "tolerance": self.tolerance,
            **changes,
        }
        return {name: value for name, value in given.items() if value is not None}

    @property
    def placed(self) -> list[str]:
        """The placement options given (a device map and what implies one, vLLM's sizes)."""
        names = ("device_map", "max_memory", "offload_folder", "tensor_parallel_size")
        return [name for name in names if getattr(self, name) is not None]


@dataclass(frozen=True)
class EpsilonOption:
    """Pruning bound."""

    epsilon: float = option(
        DEFAULT_EPSILON,
        help="pruning bound: every row's error_bound (pruned mass / valid mass) is at most "
        "this (default %(default)s; 0: exact)",
        kind=non_negative_float,
    )


answer_spec = checked_by("answers", as_answer_set)
"""An answer set: a spec (`0-10`, `A-E`, `A,B,C`, `@file`), a list, or an `AnswerSet`."""


@dataclass(frozen=True, kw_only=True)
class ScoreOptions(BatchSizeOption, EpsilonOption):
    """Scoring options: the answers, and how each prompt is scored."""

    answers: AnswerSet = option(
        REQUIRED,
        help="lo-hi (0-100), a list (A,B,C,D) or @file (one a line)",
        kind=answer_spec,
    )
    prefill: str = option("", help="text forced at the start of the response", kind=text)


def loaded_engine(model: Any) -> Engine | None:
    """The engine `model` is, or None for a model spec (text or a Path) still to load; one line
    for anything else."""
    if isinstance(model, str | Path):
        return None
    if not isinstance(model, Engine):
        raise ProbekitError(
            "model must be a model spec (default, a hub id, a model folder, a .gguf file) or a "
            f"loaded model, not {model!r}"
        )
    return model


def check_device(name: str) -> str:
    """`name` if this torch can use that device (`cuda`, `cuda:N`, `mps`; anything else is left
    to torch), else one line saying what is missing, before a model is read."""
    import torch

    kind, _, index = name.partition(":")
    if kind == "cuda":
        if not torch.cuda.is_available():
            built = "sees no CUDA device" if torch.backends.cuda.is_built() else "lacks CUDA"
            raise ProbekitError(
                f"--device {name}: this torch ({torch.__version__}) {built}; use --device cpu"
            )
        count = torch.cuda.device_count()
        if index.isdigit() and int(index) >= count:
            raise ProbekitError(
                f"--device {name}: there are {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
    if kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ProbekitError(
                f"--device {name}: MPS (Apple silicon) is not available in this torch; use "
                "--device cpu"
            )
    return name
