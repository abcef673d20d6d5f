"""The TransformerLens bridge over a Hugging Face model, installed only while it is used.

Building a `TransformerBridge` over a loaded model changes that model in place: it swaps the
model's submodules for hookable bridge components (blocks, attention, MLP, norms, embeddings,
LM head) and switches the attention implementation to eager. Every later forward of the model,
the scoring engine's included, would then run the bridge's kernels (other numbers, ~1e-5, and
slower). `BridgeSwitch` records both versions of the module tree (the model's own and the
bridge's) once, when the bridge is built, and switches between them by reassigning each
module's children, parameters and buffers and each config's attention implementation: the
weights are shared, nothing is copied, and switching back gives the model exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class _Tree:
    """One version of a module tree: each module's children, parameters and buffers, and
    each config's attention implementation."""

    modules: list[tuple[torch.nn.Module, dict, dict, dict]]
    attention: list[tuple[Any, Any]]

    @classmethod
    def of(cls, root: torch.nn.Module, also: list[torch.nn.Module] = ()) -> _Tree:
        seen: dict[int, torch.nn.Module] = {id(m): m for m in [*root.modules(), *also]}
        modules = [
            (m, dict(m._modules), dict(m._parameters), dict(m._buffers)) for m in seen.values()
        ]
        return cls(modules, [(c, c._attn_implementation_internal) for c in _configs(root)])

    def apply(self) -> None:
        for module, children, parameters, buffers in self.modules:
            module._modules = dict(children)
            module._parameters = dict(parameters)
            module._buffers = dict(buffers)
        for config, implementation in self.attention:
            config._attn_implementation_internal = implementation


def _configs(root: torch.nn.Module) -> list[Any]:
    """Every model config (and sub-config) reachable from the modules of `root`."""
    found: dict[int, Any] = {}
    todo = [getattr(m, "config", None) for m in root.modules()]
    while todo:
        config = todo.pop()
        if config is None or id(config) in found or not hasattr(config, "sub_configs"):
            continue
        found[id(config)] = config
        todo += [getattr(config, key, None) for key in config.sub_configs]
    return list(found.values())


class BridgeSwitch:
    """A model's TransformerBridge and the switch between the model's own modules and the
    bridge's (`install`, `remove`; `installed` says which are in place). Each switch first
    records the version in place, so what changed since (a module the bridge wires lazily, an
    attention implementation set by hand) is kept."""

    def __init__(self, hf: torch.nn.Module, build: Any) -> None:
        """Build the bridge with `build()` (which changes `hf` in place) and record both trees;
        the bridge stays installed."""
        self.hf = hf
        self._own = _Tree.of(hf)
        self._originals = [m for m, *_ in self._own.modules]
        self.bridge = build()
        self._bridged = _Tree.of(hf, self._originals)
        self.installed = True

    def install(self) -> None:
        if not self.installed:
            self._own = _Tree.of(self.hf)
            self._bridged.apply()
            self.installed = True

    def remove(self) -> None:
        if self.installed:
            self._bridged = _Tree.of(self.hf, self._originals)
            self._own.apply()
            self.installed = False
