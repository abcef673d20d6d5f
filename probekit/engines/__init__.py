"""Engines: what runs a model. Everything above this package talks to an engine (the protocol in
`probekit.engines.base`), never to a model library's internals.

`load_engine` picks an engine by name from `ENGINES`. An engine is one module whose loader takes
`(spec, device=..., dtype=...)` and returns an object satisfying `Engine`; adding one is that
module plus one line here, and no study changes. Engine modules are imported on first use, so
`import probekit.engines` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from probekit.core.errors import ProbekitError

if TYPE_CHECKING:
    from probekit.engines.base import Engine

ENGINES: dict[str, str] = {
    "hf": "probekit.engines.hf.model:load_model",
    "vllm": "probekit.engines.vllm:load_vllm",
}
"""Engine name -> `module:loader`."""


def load_engine(
    spec: str = "default", engine: str = "hf", device: str | None = None, dtype: Any = None
) -> Engine:
    """Load model `spec` (`default`, a hub id, a directory, a `.gguf` file) on `engine`."""
    if engine not in ENGINES:
        raise ProbekitError(f"unknown engine '{engine}'; choose one of: {', '.join(ENGINES)}")
    module, loader = ENGINES[engine].split(":")
    return getattr(importlib.import_module(module), loader)(spec, device=device, dtype=dtype)
