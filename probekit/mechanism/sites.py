"""The sites the mechanism reads and writes: one table, in TransformerLens's vocabulary.

A site is one place in every transformer block. Its name is the TransformerLens hook name inside
the block (`hook_resid_pre`; the full hook is `blocks.{layer}.hook_resid_pre`), and its short
form is accepted wherever a site is named (`resid_pre`, as `transformer_lens.utils.get_act_name`
spells it). Each row also says where nnsight finds the same values on the Hugging Face modules
and what shape they have; capture, patching, attribution and directions all read and write
through this table, so a new site is one row here.

| site              | short      | nnsight (block: the model's decoder block) | per position    |
|-------------------|------------|--------------------------------------------|-----------------|
| `hook_resid_pre`  | resid_pre  | `block.input`                              | [d_model]       |
| `attn.hook_z`     | z          | input of the attention's output projection | [heads, d_head] |
| `hook_attn_out`   | attn_out   | `block.<attn>.output`                      | [d_model]       |
| `hook_mlp_out`    | mlp_out    | `block.mlp.output`                         | [d_model]       |
| `hook_resid_post` | resid_post | `block.output`                             | [d_model]       |

Rows are in the order a block runs them. The hook library that reads and writes them is
`transformer_lens` (hooks of the model's `TransformerBridge`) or `nnsight` (a trace of the
Hugging Face modules). Layers are counted from 0;
a negative layer counts from the end (-1 is the last), as in Python and TransformerLens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import numpy as np
import torch

from probekit.core.errors import ProbekitError
from probekit.engines.hook_libraries import HOOK_PACKAGES, require


@dataclass(frozen=True)
class Layout:
    """Where a Hugging Face model keeps its blocks (dotted path) and, in a block, the attention,
    the MLP and the attention's output projection (None when unknown)."""

    blocks: str
    attn: str
    mlp: str
    out_proj: str | None


@dataclass(frozen=True)
class Site:
    """One row of the table: the TransformerLens name in a block, its short form, whether its
    values are per attention head, and how nnsight reaches them (`nnsight(block, layout,
    heads)` -> the [batch, positions, ...] value inside a trace, editable in place)."""

    name: str
    short: str
    per_head: bool
    nnsight: Callable[[Any, Layout, int], Any]

    def hook(self, layer: int) -> str:
        """The full TransformerLens hook name, `blocks.{layer}.{name}`."""
        return f"blocks.{layer}.{self.name}"


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, tuple) else value


def _z(block: Any, layout: Layout, heads: int) -> Any:
    if layout.out_proj is None:
        raise ProbekitError(
            "the nnsight hook library does not know this model's attention output projection; "
            "use hooks='transformer_lens' for attn.hook_z"
        )
    flat = getattr(getattr(block, layout.attn), layout.out_proj).input
    return flat.view(*flat.shape[:2], heads, -1)


_TABLE: tuple[Site, ...] = (
    Site("hook_resid_pre", "resid_pre", False, lambda b, lay, h: _first(b.input)),
    Site("attn.hook_z", "z", True, _z),
    Site("hook_attn_out", "attn_out", False, lambda b, lay, h: _first(getattr(b, lay.attn).output)),
    Site("hook_mlp_out", "mlp_out", False, lambda b, lay, h: _first(getattr(b, lay.mlp).output)),
    Site("hook_resid_post", "resid_post", False, lambda b, lay, h: _first(b.output)),
)
SITES: dict[str, Site] = {site.name: site for site in _TABLE}
"""Every site by its TransformerLens name, in the order a block runs them."""
HEAD_SITE = "attn.hook_z"
"""The per-head site: the attention's output per head, before the output projection."""
DEFAULT_SITES: tuple[str, ...] = tuple(s.name for s in _TABLE if not s.per_head)
"""The residual-width sites: what `probekit patch` and `probekit capture` use by default."""
_BY_ANY_NAME = {n: s for s in _TABLE for n in (s.name, s.short, f"hook_{s.short}")}


def site(name: str) -> Site:
    """The site a name gives: its TransformerLens name or short form (`hook_resid_pre`,
    `resid_pre`; `attn.hook_z`, `hook_z`, `z`)."""
    if not isinstance(name, str) or name not in _BY_ANY_NAME:
        raise ProbekitError(
            f"unknown site {name!r}; choose from {', '.join(SITES)} (or their short forms "
            f"{', '.join(s.short for s in _TABLE)})"
        )
    return _BY_ANY_NAME[name]


def parse_hook(hook: str) -> tuple[int, Site]:
    """`blocks.3.hook_resid_pre` -> (3, the resid_pre site)."""
    parts = hook.split(".", 2)
    if len(parts) != 3 or parts[0] != "blocks" or not parts[1].isdigit():
        raise ProbekitError(f"{hook!r} is not a block hook name such as blocks.3.hook_resid_pre")
    return int(parts[1]), site(parts[2])


def hook_order(hook: str) -> tuple[int, int]:
    """Sort key of full hook names in the order a forward pass reaches them."""
    layer, found = parse_hook(hook)
    return layer, _TABLE.index(found)


def library(name: str) -> str:
    """`name` if it is a hook library (`transformer_lens`, `nnsight`) whose package is installed,
    else one line (an unknown name; the package missing, how to install it, the other library)."""
    if name not in HOOK_PACKAGES:
        raise ProbekitError(
            f"unknown hook library {name!r}; choose from {', '.join(HOOK_PACKAGES)}"
        )
    return require(name)


def layer_indices(model: Any, layers: Sequence[Any]) -> list[int]:
    """The layers as indices from 0 (a negative layer counts from the end); one line for an
    empty list, a non-integer or a layer outside the model."""
    n = model.n_layers
    if isinstance(layers, str | bytes) or not isinstance(layers, Sequence | range):
        raise ProbekitError(f"layers must be a list of integers, got {layers!r}")
    if not layers:
        raise ProbekitError("no layers given; give at least one layer index")
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, Integral):
            raise ProbekitError(f"layer {layer!r} is not a layer index (an integer)")
        if not -n <= layer < n:
            raise ProbekitError(
                f"layer {layer} is out of range: the model has {n} layers (0 to {n - 1}, or "
                f"{-n} to -1 counted from the end)"
            )
        out.append(int(layer) % n)
    return out


PATCH_LAYERS = 6
"""Layers patching measures when none are given, evenly spaced from the first to the last (with 2
events, 1 pair each, the default `probekit patch` fits in 10 min on 2 CPU cores)."""


def chosen_layers(model: Any, layers: Sequence[Any] | None, command: str) -> list[int]:
    """The layers given (`layer_indices`), or, for None, the command's default (as the `layers`
    option says): patch `PATCH_LAYERS` evenly spaced, capture the first, middle and last, steer
    the middle one."""
    if layers is not None:
        return layer_indices(model, layers)
    n = model.n_layers
    if command == "patch":
        return sorted({int(x) for x in np.linspace(0, n - 1, PATCH_LAYERS).round()})
    if command == "capture":
        return sorted({0, n // 2, n - 1})
    return [n // 2]


def hf_module(model: Any) -> Any:
    """The Hugging Face module of a hookable model (`Engine.hookable()`, the transformers engine's
    `LoadedModel`): the mechanism's one way to it. The engine seam gives layers, dtype, hooks and
    nnsight, not the head count, the width, the block layout nnsight needs or the output head's
    weights; those are read from the module here."""
    return model.hf


def n_heads(model: Any) -> int:
    """Attention heads per layer (query heads: `attn.hook_z` has one slot per query head)."""
    return int(hf_module(model).config.num_attention_heads)


def d_model(model: Any) -> int:
    """The width of the residual stream (a `[d_model]` site's values per position)."""
    return int(hf_module(model).config.hidden_size)


def layout(hf: Any) -> Layout:
    """Where the blocks, their attention, MLP and output projection are in a Hugging Face model."""
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        try:
            blocks = walk(hf, path)
        except AttributeError:
            continue
        names = {name for name, _ in blocks[0].named_children()} | set(dir(blocks[0]))
        attn = next((n for n in ("self_attn", "attn", "attention") if n in names), None)
        if attn and "mlp" in names:
            children = {name for name, _ in getattr(blocks[0], attn).named_children()}
            out = next(
                (n for n in ("o", "o_proj", "out_proj", "dense", "c_proj") if n in children), None
            )
            return Layout(path, attn, "mlp", out)
    raise ProbekitError(
        f"the nnsight hook library does not know the block layout of {type(hf).__name__}; "
        "use hooks='transformer_lens'"
    )


def walk(root: Any, path: str) -> Any:
    """Follow a dotted attribute path such as `model.layers` from `root`."""
    for name in path.split("."):
        root = getattr(root, name)
    return root


@contextlib.contextmanager
def bridged(model: Any, on: bool = True) -> Iterator[Any]:
    """Within the block the model runs its TransformerBridge's modules (`on`; built on first
    use) or its own Hugging Face modules (`on=False`: what nnsight traces); afterwards it is as
    it was found (`LoadedModel.bridged`). Yields the bridge (or None).

    The bridge's attention adds the additive mask (whose minimum is float64's) and takes the
    softmax in float32, where that minimum becomes -inf: the leading pad rows of a left-padded
    prompt then have no finite key and turn NaN, and 0 x NaN carries it into the real rows. In
    float64 a hook at every `attn.hook_attn_scores` clamps the scores to float32's range first;
    other dtypes are left as they are."""
    with model.bridged(on) as bridge:
        if on and model.dtype == torch.float64 and not getattr(bridge, "_probekit_clamped", 0):
            low = torch.finfo(torch.float32).min
            for layer in range(model.n_layers):
                point = bridge.hook_dict[f"blocks.{layer}.attn.hook_attn_scores"]
                point.add_perma_hook(lambda scores, hook: scores.clamp(min=low))
            bridge._probekit_clamped = True
        yield bridge


def hook_library(model: Any, hooks: str) -> contextlib.AbstractContextManager:
    """The model as a hook library reads and writes it: with the bridge installed for
    `transformer_lens`, with its own modules for `nnsight`."""
    return bridged(model, library(hooks) == "transformer_lens")
