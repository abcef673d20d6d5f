"""Devices and sizes: memory sizes (`80GiB`), device names (`cuda:0`), the devices a plan or a
device map may fill (`cuda:0=80GiB,cpu=150MiB`), device maps (a strategy or module -> device)
and accelerate's dispatch keywords. Read by the options (`--devices`, `--max-memory`,
`--device-map`), the memory plan and the loader; nothing here imports a model library."""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from probekit.core.errors import ProbekitError

MAP_POLICIES = ("auto", "balanced", "balanced_low_0", "sequential")
"""accelerate's device-map strategies `--device-map` takes by name."""
UNITS = {"b": 1} | {f"{p}b": 1000 ** (k + 1) for k, p in enumerate("kmgt")}
UNITS |= {f"{p}ib": 1024 ** (k + 1) for k, p in enumerate("kmgt")}
UNITS_DECIMAL, UNITS_BINARY = ("B", "kB", "MB", "GB", "TB"), ("B", "KiB", "MiB", "GiB", "TiB")


def parse_size(text: str | int) -> int:
    """Bytes of a size: `80GiB`, `150MiB`, `16GB`, `1.5GiB`, or a number of bytes; a size of
    zero or less is refused."""
    match = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*([kmgt]?i?b)?\s*", str(text), re.IGNORECASE)
    unit = (match.group(2) or "b").lower() if match else ""
    if isinstance(text, bool) or unit not in UNITS:
        raise ProbekitError(f"'{text}' is not a memory size; write e.g. 80GiB, 150MiB or 16GB")
    size = text if isinstance(text, int) else int(float(match.group(1)) * UNITS[unit])
    if size <= 0:
        raise ProbekitError(f"a memory size must be more than zero (got {text!r})")
    return size


def format_size(n: float, binary: bool = False) -> str:
    """`141 GB` (decimal, as model sizes are quoted) or `80 GiB` (binary, as devices are)."""
    step, units = (1024, UNITS_BINARY) if binary else (1000, UNITS_DECIMAL)
    power = 0
    while n >= step and power < len(units) - 1:
        n, power = n / step, power + 1
    return f"{n:.0f} {units[power]}" if n >= 10 or power == 0 else f"{n:.1f} {units[power]}"


def device_key(name: str) -> str:
    """`cuda`, `0`, `cuda:0` -> `cuda:0`; `cpu`, `mps` as they are; anything else one line."""
    name = name.strip().lower()
    key = "cuda:0" if name == "cuda" else f"cuda:{name}" if name.isdigit() else name
    if key in ("cpu", "mps") or re.fullmatch(r"cuda:\d+", key):
        return key
    raise ProbekitError(f"unknown device '{name}'; use cuda:N (or N), cpu or mps")


def parse_devices(text: str | Mapping[str, Any]) -> dict[str, int]:
    """`cuda:0=80GiB,cpu=150MiB` (or a mapping of the same) -> {device: bytes}; a device named
    twice (`cuda` and `0` are both `cuda:0`) or a size of zero or less is one line."""
    if isinstance(text, Mapping):
        pairs = [(str(k), "=", v) for k, v in text.items()]
    else:
        pairs = [part.strip().partition("=") for part in str(text).split(",") if part.strip()]
        if malformed := next((name for name, sep, _ in pairs if not sep), None):
            raise ProbekitError(f"'{malformed}' is not DEVICE=SIZE; write e.g. cuda:0=80GiB")
    if not pairs:
        raise ProbekitError("no devices given; write e.g. cuda:0=80GiB,cpu=64GiB")
    sizes: dict[str, int] = {}
    for name, _, size in pairs:
        key = device_key(name)
        if key in sizes:
            raise ProbekitError(f"{key} is named twice; give each device one size")
        try:
            sizes[key] = parse_size(size)
        except ProbekitError as error:
            raise ProbekitError(f"{key}: {error}") from None
    return sizes


def parse_device_map(value: str | Mapping[str, Any]) -> str | dict[str, Any]:
    """A strategy name (`MAP_POLICIES`), or module -> device as a mapping, JSON text or a JSON
    file; devices `cpu`, `disk`, `mps`, `cuda:N` or `N`."""
    if isinstance(value, str) and value in MAP_POLICIES:
        return value
    mapping: Any = value
    if isinstance(value, str):
        text = (
            Path(value).read_text() if value.endswith(".json") and Path(value).is_file() else value
        )
        try:
            mapping = json.loads(text)
        except json.JSONDecodeError:
            mapping = None
    if not isinstance(mapping, Mapping) or not mapping:
        raise ProbekitError(
            f"device map '{value}' is neither {', '.join(MAP_POLICIES)} nor a JSON object of "
            'module -> device (e.g. {"model.embed_tokens": 0, "model.layers": "cpu", ...})'
        )
    return {
        str(module): where
        if isinstance(where, int) or str(where) == "disk"
        else device_key(str(where))
        for module, where in mapping.items()
    }


def check_map_modules(mapping: Mapping[str, Any], hf: Any, model: str) -> None:
    """One line when the device map `mapping` (module -> device) names a module that the
    transformers model `hf` (of `model`) lacks (with the nearest of its modules), or leaves one
    of its parameters without a device: transformers would load such a map without a word."""
    modules = dict(hf.named_modules())
    for name in mapping:
        if name and name not in modules:
            near = difflib.get_close_matches(name, list(modules), n=2)
            hint = f"did you mean {' or '.join(near)}?" if near else "name its modules"
            raise ProbekitError(f"the device map names {name}, which {model} lacks; {hint}")

    def placed(parameter: str) -> bool:
        return any(not m or parameter == m or parameter.startswith(m + ".") for m in mapping)

    left = [p.rpartition(".")[0] or p for p, _ in hf.named_parameters() if not placed(p)]
    if left:
        shown = ", ".join(dict.fromkeys(left[:3]))
        raise ProbekitError(
            f"the device map gives no device to {shown}{', ...' if len(left) > 3 else ''} of "
            f"{model}; map every module (or a parent of it), or use the auto device map"
        )


def dispatch_options(
    device_map: str | Mapping[str, Any] | None = None,
    max_memory: str | Mapping[str, Any] | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> dict[str, Any] | None:
    """The keywords of transformers' `from_pretrained` for accelerate's dispatch (None when the
    model goes whole onto one device); `max_memory` or `offload_folder` alone mean `auto`."""
    if device_map is None and max_memory is None and offload_folder is None:
        return None
    options: dict[str, Any] = {"device_map": parse_device_map(device_map or "auto")}
    if max_memory is not None:
        options["max_memory"] = {
            int(k.removeprefix("cuda:")) if k.startswith("cuda:") else k: v
            for k, v in parse_devices(max_memory).items()
        }
    if offload_folder is not None:
        folder = Path(offload_folder).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ProbekitError(f"cannot use offload folder '{folder}': {exc.strerror}") from None
        options["offload_folder"] = str(folder)
    return options


def visible_gpus() -> dict[str, int]:
    """The CUDA devices torch sees and their memory in bytes ({} without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {
        f"cuda:{i}": device_memory(torch.device("cuda", i))
        for i in range(torch.cuda.device_count())
    }


def device_memory(device: Any) -> int | None:
    """Bytes of memory of an accelerator (a `torch.device`; None where torch cannot say, e.g.
    MPS)."""
    import torch

    cuda = device.type == "cuda"
    return int(torch.cuda.get_device_properties(device).total_memory) if cuda else None


def physical_memory() -> int:
    """Bytes of RAM of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
