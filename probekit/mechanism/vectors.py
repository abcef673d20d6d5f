"""Steering vectors as `probekit steer STUDY` takes them (`--vector`): made from the study's
contrast (`mean_diff`: the mean over the contrast's prompts minus the mean over the others of
each prompt's activation averaged over a span, at each (site, layer); `direction`: the same as a
unit vector, the contrast direction of `probekit.mechanism.directions`), or read from a file
(.npy, .pt, .safetensors: one [d_model] vector, or one per layer [n_layers, d_model]).

A contrast's vector is cross-fitted: the units are split into folds (`directions.unit_folds`),
and the prompts of each fold are steered along the vector fitted on the other folds' units only,
so no prompt is steered along a vector made from its own unit (`contrast_vectors` gives one row
per prompt, its fold's vector). Prompts of one unit (a first try) have no other unit to fit on:
their vector is fitted on their own prompts, and `probekit steer` says so.

A file is read and checked before any model loads (readable, one tensor, finite, not zero) and
known by its content (`VectorFile.sha256`), so a steering run resumes only with the same numbers
whatever the file is called; its shape is checked against the model once it is loaded, before
anything is written (`probekit.mechanism.steering.as_vectors`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem
from probekit.core.options import given, named
from probekit.mechanism import steering
from probekit.mechanism.directions import diff_of_means, mean_difference, unit_folds

VECTORS = ("mean_diff", "direction")
LOADERS: dict[str, Callable[[Path], Any]] = {
    ".npy": lambda path: np.load(path, allow_pickle=False),
    ".pt": lambda path: torch.load(path, map_location="cpu", weights_only=True),
    ".safetensors": lambda path: safetensors.torch.load_file(path),
}
"""How a vector file of each type is read."""
FILE_TYPES = tuple(LOADERS)


@dataclass(frozen=True)
class VectorFile:
    """A vector file read and checked: its path, its values (float64, [d_model] or
    [n_layers, d_model]) and the SHA-256 of its bytes."""

    path: Path
    values: np.ndarray
    sha256: str


def check_vector_name(vector: str) -> None:
    """One line for a vector (`--vector`) that is neither a kind (`VECTORS`) nor a file of a
    known type that exists."""
    if vector in VECTORS:
        return
    path = Path(vector)
    if path.suffix not in FILE_TYPES:
        raise ProbekitError(
            f"{given('vector', vector)}: give mean_diff, direction or a "
            f"{', '.join(FILE_TYPES)} file"
        )
    if not path.is_file():
        raise ProbekitError(f"{named('vector')}: no file {vector}")


def read_vector_file(vector: str | Path) -> VectorFile:
    """The file's only tensor, checked: one or two dimensions, finite, not all zero (one line
    naming the file otherwise)."""
    path = Path(vector)
    check_vector_name(str(path))
    name = given("vector", str(path))
    try:
        content = path.read_bytes()
        values = LOADERS[path.suffix](path)
    except (OSError, ValueError, RuntimeError) as error:
        raise ProbekitError(f"{name}: not readable ({error})".splitlines()[0]) from None
    if isinstance(values, dict):
        if len(values) != 1:
            raise ProbekitError(f"{name}: the file holds {len(values)} tensors; give one")
        (values,) = values.values()
    if isinstance(values, torch.Tensor):
        values = values.double().numpy()
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "biuf":
        raise ProbekitError(f"{name}: the file holds a {type(values).__name__}, not numbers")
    values = np.asarray(values, dtype=np.float64)
    if values.ndim not in (1, 2) or values.size == 0:
        raise ProbekitError(
            f"{name}: shape {values.shape}; give one [d_model] vector or one per layer "
            "([n_layers, d_model])"
        )
    steering.check_values(values, f"{name}: the vector")
    return VectorFile(path, values, hashlib.sha256(content).hexdigest())


def file_vectors(
    model: Any, found: VectorFile, targets: Sequence[steering.Target]
) -> dict[steering.Target, torch.Tensor]:
    """The file's vector at each target (a 2-D file: its row for the target's layer), checked
    against the model's width."""
    values = found.values
    if values.ndim == 2:
        if values.shape[0] != model.n_layers:
            raise ProbekitError(
                f"{given('vector', str(found.path))}: a 2-D file needs one row per layer "
                f"({model.n_layers}), got shape {tuple(values.shape)}"
            )
        return steering.as_vectors(model, {t: values[t[1]] for t in targets}, targets)
    try:
        return steering.as_vectors(model, values, targets)
    except ProbekitError as error:
        raise ProbekitError(f"{given('vector', str(found.path))}: {error}") from None


def contrast_vectors(
    model: Any,
    encoded: Sequence[EncodedItem],
    targets: Sequence[steering.Target],
    kind: str,
    span: str,
    contrast: Callable[[EncodedItem], Any],
    hooks: str = "transformer_lens",
    means: Mapping[steering.Target, np.ndarray] | None = None,
    seed: int = 0,
) -> dict[steering.Target, torch.Tensor]:
    """The contrast's mean difference at `span` (`kind` `mean_diff`) or its unit direction
    (`direction`) at each target, cross-fitted (see the module): one row per prompt, [prompts,
    d_model], each its fold's vector, from the prompts' span means (`steering.span_means`, read
    here unless given); one unit's prompts: the vector of their own prompts."""
    units = [p.item.unit for p in encoded]
    one = len(set(units)) == 1  # no other unit to fit on: fitted on its own prompts
    fold = np.zeros(len(units), int) if one else unit_folds(units, seed)
    side = np.array([bool(contrast(p)) for p in encoded])
    if means is None:
        means = steering.span_means(model, encoded, targets, span, hooks)
    fit = diff_of_means if kind == "direction" else mean_difference
    out = {}
    for target in targets:
        rows = np.empty_like(means[target])
        for k in np.unique(fold):
            train = (fold != k) | one
            rows[fold == k] = fit(means[target][train], side[train])
        out[target] = torch.as_tensor(rows)
        steering.as_vectors(model, {target: rows[0]}, [target])  # its width and values, checked
    return out
