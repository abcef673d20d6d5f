"""The two hook libraries the mechanism reads and writes activations with: TransformerLens (the
default, `transformer_lens`) and nnsight. Each is an ordinary dependency, but an environment can
lack one (a GPU image built without it): a command that needs it then ends in one line naming the
package, how to install it and the other library, never in a `ModuleNotFoundError` traceback from
deep inside a patch or a capture."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from probekit.core.errors import ProbekitError

HOOK_PACKAGES: dict[str, str] = {
    "transformer_lens": "transformer-lens>=4,<5",
    "nnsight": "nnsight>=0.8",
}
"""Each hook library's import name and the pip requirement probekit is tested with (as in
pyproject.toml): TransformerLens 4's `TransformerBridge`, nnsight's `TransformersModel`."""


def installed(name: str) -> bool:
    """Whether hook library `name`'s package can be found here (without importing it)."""
    return importlib.util.find_spec(name) is not None


def missing_line(name: str, reason: str = "is not installed here") -> str:
    """One line: hook library `name`'s package `reason`, how to install it, and the other one."""
    other = next(n for n in HOOK_PACKAGES if n != name)
    also = "" if installed(other) else f" (also missing: `pip install '{HOOK_PACKAGES[other]}'`)"
    return (
        f"the {name} package {reason}; install it with `pip install '{HOOK_PACKAGES[name]}'`, "
        f"or use the other hook library, {other}{also}"
    )


def require(name: str) -> str:
    """`name` when its package is installed, else one line (`missing_line`); checked before any
    model loads, by the `hooks` option of patch, capture and steer."""
    if not installed(name):
        raise ProbekitError(missing_line(name))
    return name


def import_from(name: str, module: str) -> ModuleType:
    """`module` (a module of hook library `name`) imported; one line where it cannot be (the
    package missing, or broken by a missing dependency of its own)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ProbekitError(missing_line(name, f"cannot be imported here ({error})")) from None
