"""Engines: what runs a model. Everything above this package talks to an engine (the protocol in
`probekit.engines.base`), never to a model library's internals.

`load_engine` picks an engine by name from `ENGINES` (in `probekit.engines.base`). An engine is
one module whose loader takes `(model, device=..., dtype=...)` (and the placement keywords it
supports) and returns an object satisfying `Engine`; adding one is that module plus one line in
`ENGINES`, and no study changes. Engine
modules are imported on first use, so `import probekit.engines` stays light. Before a model loads
on an accelerator, by a device map or over vLLM's GPUs, the memory plan (`probekit.engines.plan`)
checks that it fits and refuses in one line naming the options that would.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probekit.core.errors import ProbekitError
from probekit.core.public import public
from probekit.engines.base import ENGINES
from probekit.engines.options import PARALLEL, ModelOptions, model_conflict

if TYPE_CHECKING:
    from probekit.engines.base import Engine

__all__ = ["ENGINES", "PARALLEL", "load_engine", "run_in_engine_env"]


@public(ModelOptions)
def load_engine(
    model: str | Path = "default",
    engine: str = "hf",
    device: str | None = None,
    dtype: Any = None,
    *,
    device_map: str | dict[str, Any] | None = None,
    max_memory: str | dict[str, Any] | None = None,
    offload_folder: str | Path | None = None,
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    tolerance: float | None = None,
    chat_template: str | None = None,
) -> Engine:
    """Load `model` (`default`, a hub id, a directory, a `.gguf` file) on `engine`.

    The keywords are `probekit.engines.options.ModelOptions`, checked as the command line checks
    its options (a bad one is one line naming the keyword): `dtype` a name (`bfloat16`, `bf16`)
    or a `torch.dtype`, `device` a name or a `torch.device`.
    `tolerance`: the largest change of an answer probability the arithmetic may cause, by which
    the hf engine picks its precision tier on a GPU (`probekit.engines.hf.precision`; default
    `DEFAULT_TOLERANCE`); `dtype` forces one instead.

    `device_map`, `max_memory` and `offload_folder` place the model over several devices with
    accelerate's dispatch (`probekit.engines.hf.model.load_model`; for the vllm engine, the
    transformers copy its exact view reads); `tensor_parallel_size` and
    `pipeline_parallel_size` are vLLM's (vllm engine only). `chat_template`: a Jinja file, or
    `gemma`, that renders chat prompts where the model has no chat template of its own
    (`probekit.engines.chat_templates`)."""
    keywords = dict(locals())  # first: the parameters only
    placement = {k: v for k, v in list(keywords.items())[4:] if v is not None}  # after `dtype`
    from probekit.engines.plan import check_before_load

    if conflict := model_conflict(engine, device=device, dtype=dtype, **placement):
        raise ProbekitError(conflict)
    parallel = (tensor_parallel_size or 1) * (pipeline_parallel_size or 1)
    if parallel > 1:  # vLLM's shards (the hf engine's load checks its own plan)
        check_before_load(model, device, dtype, parallel=parallel)
    module, loader = ENGINES[engine].split(":")
    load = getattr(importlib.import_module(module), loader)
    return load(model, device=device, dtype=dtype, **placement)


def run_in_engine_env(engine: str, argv: Sequence[str]) -> None:
    """Where `engine` lives in a Python environment of its own and not in this one (vLLM:
    `./setup.sh --vllm`), run this same command line (`sys.argv`) there: the process is
    replaced, so this returns only when there is nothing to do."""
    if engine == "vllm":
        from probekit.engines.vllm import run_in_vllm_env

        run_in_vllm_env(argv)
