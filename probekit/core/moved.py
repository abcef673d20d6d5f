"""Old module paths of probekit, kept importable with a one-line deprecation warning.

probekit's modules moved into layers (core, engines, run, studies, mechanism, stats,
reporting, cli); a script that still imports `probekit.items` or `probekit.api` gets the
module at its new place and a `FutureWarning` naming it, once per old name."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "probekit.errors": "probekit.core.errors",
    "probekit.paths": "probekit.core.paths",
    "probekit.io": "probekit.core.io",
    "probekit.answers": "probekit.core.answers",
    "probekit.items": "probekit.core.items",
    "probekit.prompts": "probekit.core.prompts",
    "probekit.batching": "probekit.core.padding",
    "probekit.choices": "probekit.core.choices",
    "probekit.options": "probekit.core.options",
    "probekit.api": "probekit.engines.score",
    "probekit.numerics": "probekit.run.numerics",
    "probekit.distributed": "probekit.run.distributed",
    "probekit.plots": "probekit.reporting.figures",
    "probekit.scoring": "probekit.engines",
    "probekit.scoring.trie": "probekit.engines.trie",
    "probekit.scoring.readouts": "probekit.mechanism.readouts",
    "probekit.scoring.generate": "probekit.studies.intergroup.parse",
    "probekit.commands": "probekit.cli",
    "probekit.commands.run": "probekit.cli.run",
    "probekit.commands.patch": "probekit.cli.patch",
    "probekit.commands.capture": "probekit.cli.capture",
    "probekit.commands.report": "probekit.cli.report",
    "probekit.scale": "probekit.run",
    "probekit.scale.ray": "probekit.run.ray",
}
"""Old module name -> its new place."""


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and loads the module at its new place under it."""

    def find_spec(self, name: str, path: object = None, target: object = None):  # noqa: ANN201
        if name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} has moved to {new}; import it from there (the old name will be "
            "removed in a later release)",
            FutureWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        return None


def install() -> None:
    """Put the finder on `sys.meta_path` once."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())  # before the path finder: no second copy
