"""The options of every command that loads a model (`--model`, `--device`, `--dtype`,
`--tolerance`, `--engine`, and where the model goes: `--device-map`, `--max-memory`,
`--offload-folder`, vLLM's `--tensor-parallel-size` and `--pipeline-parallel-size`), on the
option types of `probekit.core.options`; `load_options` turns them into `load_engine`'s
keywords. `check_device` says in one line when a named device is missing from this torch, for the
command line and the API alike."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.options import DTYPES, device_name, dtype_name, probability


def add_model_options(
    parser: argparse.ArgumentParser, several: bool = False, hooks: bool = True
) -> None:
    """`--model`, `--device`, `--dtype` and `--engine`, the options of every command that loads a
    model; `several`: `--model` may be repeated (a list, None when not given); `hooks`: the
    command needs a hookable model, so `--engine` takes only engines that have one."""
    if several:
        parser.add_argument(
            "--model",
            action="append",
            default=None,
            help="hub id, model dir, .gguf or default (the default); repeat it to run several "
            "models, each into OUT/<model name>, summarised side by side",
        )
    else:
        parser.add_argument(
            "--model", default="default", help="hub id, model dir, .gguf or default"
        )
    parser.add_argument(
        "--device", type=device_name, default=None, help="cuda, mps or cpu (default: the best)"
    )
    parser.add_argument(
        "--dtype",
        type=dtype_name,
        default=None,
        help=f"{', '.join(DTYPES)} (default: float32 on the CPU and wherever the float32 "
        "weights fit in half the accelerator's memory, else bfloat16)",
    )
    parser.add_argument(
        "--tolerance",
        type=probability,
        default=None,
        metavar="T",
        help="largest change of an answer probability the chosen arithmetic may cause (see "
        "docs/concepts.md; default 0.005): on a GPU the fastest of bfloat16, TF32 and float32 "
        "that meets it on the run's prompts; not with --dtype",
    )
    parser.add_argument(
        "--device-map",
        type=checked_type("probekit.engines.plan:parse_device_map"),
        default=None,
        help="place the model over several devices with accelerate: auto, balanced, "
        "sequential, or a JSON object (text or .json file) of module -> device",
    )
    parser.add_argument(
        "--max-memory",
        type=checked_type("probekit.engines.plan:parse_devices"),
        default=None,
        metavar="DEVICE=SIZE[,...]",
        help="memory the device map may fill per device, e.g. cuda:0=70GiB,cpu=150MiB "
        "(implies --device-map auto)",
    )
    parser.add_argument(
        "--offload-folder",
        default=None,
        metavar="DIR",
        help="where the device map may put weights that fit nowhere else (disk offload; "
        "implies --device-map auto)",
    )
    if not hooks:
        for name, what in (("tensor", "splits every layer"), ("pipeline", "splits the layers")):
            parser.add_argument(
                f"--{name}-parallel-size",
                type=_positive,
                default=None,
                metavar="N",
                help=f"vLLM {what} over N GPUs (--engine vllm only)",
            )
    parser.add_argument(
        "--engine",
        type=engine_name(hooks),
        default="hf",
        help="hf (transformers, the default)"
        + ("" if hooks else " or vllm (generation through vLLM; the exact view stays hf's)"),
    )


def engine_name(hooks: bool) -> Callable[[str], str]:
    """argparse type for `--engine`: a registered engine; with `hooks`, one with a hookable model
    (today only hf), else one line saying why not."""
    from probekit.engines import ENGINES

    def check(text: str) -> str:
        if text not in ENGINES:
            raise argparse.ArgumentTypeError(
                f"unknown engine '{text}'; choose one of: {', '.join(ENGINES)}"
            )
        if hooks and text != "hf":
            from probekit.engines.base import hooks_unavailable

            raise argparse.ArgumentTypeError(str(hooks_unavailable(text)))
        return text

    return check


LOAD_OPTIONS = (
    "device",
    "dtype",
    "tolerance",
    "device_map",
    "max_memory",
    "offload_folder",
    "tensor_parallel_size",
    "pipeline_parallel_size",
)
"""The `load_engine` keywords that `add_model_options` adds options for."""


def load_options(args: argparse.Namespace, **changes: Any) -> dict[str, Any]:
    """`load_engine`'s keywords from the parsed model options (those given), updated by
    `changes` (e.g. a distributed launch's own device)."""
    given = {name: getattr(args, name, None) for name in LOAD_OPTIONS}
    given.update(changes)
    return {name: value for name, value in given.items() if value is not None}


def checked_type(where: str) -> Callable[[str], Any]:
    """argparse type calling the parser `module:function`, its one-line error as argparse's."""

    def check(text: str) -> Any:
        import importlib

        module, function = where.split(":")
        try:
            return getattr(importlib.import_module(module), function)(text)
        except ProbekitError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return check


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive whole number")
    return int(text)


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
