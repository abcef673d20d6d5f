"""The options of every command that loads a model (`--model`, `--device`, `--dtype`,
`--engine`), on the option types of `probekit.core.options`."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from probekit.core.options import DTYPES, device_name, dtype_name


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
