"""Where a model goes before it loads: device sizes, accelerate's dispatch options, and the memory
plan (`probekit plan`, `probekit.plan`, and the check `load_engine` runs before every load on an
accelerator or a device map).

The plan is arithmetic on the model's config, never its weights: the parameter count (the model
built on the meta device), times the bytes of the dtype the precision policy picks
(`engines/hf/precision.py`: float32 where its weights take at most `FP32_MEMORY_SHARE` of the first
accelerator, else bfloat16); per token of a batch the KV cache (2 x layers x key/value heads x head
width) and the forward's working activations (4 x width + 2 x MLP width); per prompt the float32
logits and float64 log-probabilities of the answer position. A capture's activations (one site at
every layer, float32, every position at most) are reported beside: they are copied to host memory
as each batch is read, so they do not count against the device. What cannot fit is refused in one
line naming the options that would.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.kinds import DTYPES, checked_by, floating_dtype, positive_int, text
from probekit.core.options import REQUIRED, BatchSizeOption, checked, option

MAP_POLICIES = ("auto", "balanced", "balanced_low_0", "sequential")
"""accelerate's device-map strategies `--device-map` takes by name."""
UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
USABLE_SHARE = 0.9
"""Share of a device's memory the plan fills (the rest: the CUDA context, allocator slack)."""
PROMPT_TOKENS = 512
"""Prompt length the load-time check plans a batch for (`probekit plan --prompt-tokens`)."""
BATCH_SIZES = (64, 32, 16, 8, 4, 2, 1)
"""Batch sizes the plan tries, largest first (64: the exact scorer's default on CUDA)."""
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def parse_size(text: str | int) -> int:
    """Bytes of a size: `80GiB`, `150MiB`, `16GB`, `1.5GiB`, or a number of bytes."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b)?\s*", str(text), re.IGNORECASE)
    if not match or (match.group(2) or "b").lower() not in UNITS:
        raise ProbekitError(f"'{text}' is not a memory size; write e.g. 80GiB, 150MiB or 16GB")
    return int(float(match.group(1)) * UNITS[(match.group(2) or "b").lower()])


def device_key(name: str) -> str:
    """`cuda`, `0`, `cuda:0` -> `cuda:0`; `cpu`, `mps` as they are; anything else one line."""
    name = name.strip().lower()
    if name.isdigit():
        return f"cuda:{name}"
    if name == "cuda":
        return "cuda:0"
    if name in ("cpu", "mps") or re.fullmatch(r"cuda:\d+", name):
        return name
    raise ProbekitError(f"unknown device '{name}'; use cuda:N (or N), cpu or mps")


def parse_devices(text: str | Mapping[str, Any]) -> dict[str, int]:
    """`cuda:0=80GiB,cpu=150MiB` (or a mapping of the same) -> {device: bytes}."""
    if isinstance(text, Mapping):
        pairs = [(str(k), v) for k, v in text.items()]
    else:
        pairs = []
        for part in filter(None, (p.strip() for p in str(text).split(","))):
            name, sep, size = part.partition("=")
            if not sep:
                raise ProbekitError(f"'{part}' is not DEVICE=SIZE; write e.g. cuda:0=80GiB")
            pairs.append((name, size))
    if not pairs:
        raise ProbekitError("no devices given; write e.g. cuda:0=80GiB,cpu=64GiB")
    return {device_key(name): parse_size(size) for name, size in pairs}


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
    placed: dict[str, Any] = {}
    for module, where in mapping.items():
        if isinstance(where, int) or str(where) == "disk":
            placed[str(module)] = where
        else:
            placed[str(module)] = device_key(str(where))
    return placed


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


def format_size(n: float, binary: bool = False) -> str:
    """`141 GB` (decimal, as model sizes are quoted) or `80 GiB` (binary, as devices are)."""
    step, units = (
        (2**10, ("B", "KiB", "MiB", "GiB", "TiB"))
        if binary
        else (1000, ("B", "kB", "MB", "GB", "TB"))
    )
    for unit in units:
        if n < step or unit == units[-1]:
            return f"{n:.0f} {unit}" if n >= 10 or unit == "B" else f"{n:.1f} {unit}"
        n /= step
    raise AssertionError  # the loop always returns


@dataclass(frozen=True)
class Shape:
    """The sizes of a model that the plan needs, read from its config."""

    name: str
    parameters: int
    layers: int
    width: int
    mlp_width: int
    kv_heads: int
    head_width: int
    vocabulary: int


@dataclass(frozen=True)
class MemoryPlan:
    """The memory plan of one model on some devices (`plan`); sizes in bytes."""

    model: str
    parameters: int
    dtype: str
    weights: int
    prompt_tokens: int
    batch_size: int
    kv_cache: int  # of `batch_size` prompts of `prompt_tokens`
    workspace: int  # the forward's activations and the answer position's logits, same batch
    capture: int  # one site at every layer, float32, same batch: host memory (not in the fit)
    devices: dict[str, int]
    placement: str  # "cuda:0", "--device-map auto over ...", or "" when it does not fit
    fits: bool
    advice: str = ""  # the refusal line when it does not fit
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The plan as a reader reads it, one figure a line."""
        size = format_size
        devices = ", ".join(f"{d}={format_size(b, True)}" for d, b in self.devices.items())
        out = [
            f"model: {self.model} ({self.parameters / 1e9:.2f} B parameters)",
            f"devices: {devices}",
            f"dtype: {self.dtype}",
            f"weights: {size(self.weights)}",
            f"batch: {self.batch_size or 'none'} prompts of {self.prompt_tokens} tokens",
            f"KV cache: {size(self.kv_cache)}",
            f"forward activations and logits: {size(self.workspace)}",
            f"a capture's activations (one site, every layer; host memory): {size(self.capture)}",
            f"placement: {self.placement or 'does not fit'}",
        ]
        return out + self.notes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_shape(model: str) -> Shape:
    """The shape of `model`: `default`, a model folder (or hub-style folder) with config.json,
    a config.json path, or a hub id in the local Hugging Face cache; no weights are read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    where = model
    if model == "default" or model.endswith(".gguf"):
        from probekit.engines.hf.gguf import converted_cache_dir, default_gguf_path

        gguf = default_gguf_path() if model == "default" else Path(model).expanduser()
        where = str(converted_cache_dir(gguf))
        if not Path(where, "config.json").is_file():
            raise ProbekitError(f"'{model}' is not converted yet; load it once (probekit setup)")
    path = Path(where).expanduser()
    try:
        if path.is_file():
            data = json.loads(path.read_text())
            if "model_type" not in data or data["model_type"] not in CONFIG_MAPPING:
                raise ProbekitError(
                    f"'{model}' is not a transformers config.json (no known model_type)"
                )
            config = CONFIG_MAPPING[data["model_type"]].from_dict(data)
        else:
            config = AutoConfig.from_pretrained(
                str(path) if path.is_dir() else where, local_files_only=True
            )
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise ProbekitError(
            f"cannot read the config of '{model}' ({str(exc).strip().splitlines()[0][:120]}); give "
            "a model folder, its config.json, `default` or a hub id in the local cache"
        ) from None
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    width = int(text.hidden_size)
    return Shape(
        name=model
        if model == "default" or not path.exists()
        else (path.parent if path.is_file() else path).name,
        parameters=sum(p.numel() for p in hf.parameters()),
        layers=int(text.num_hidden_layers),
        width=width,
        mlp_width=int(getattr(text, "intermediate_size", None) or 4 * width),
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_width=int(getattr(text, "head_dim", None) or width // heads),
        vocabulary=int(text.vocab_size),
    )


def _display_name(model: str, path: Path) -> str:
    """`default`, a GGUF's file name, a folder's name (a config.json's folder), or the hub id."""
    if model == "default" or not Path(model).expanduser().exists():
        return model
    if model.endswith(".gguf"):
        return Path(model).name
    return (path.parent if path.is_file() else path).name


@dataclass(frozen=True, kw_only=True)
class PlanOptions(BatchSizeOption):
    """Plan options: the model, the devices, the batch planned for."""

    model: str = option(
        REQUIRED,
        help="a model folder, its config.json, default, or a hub id in the local cache",
        kind=text,
    )
    devices: dict[str, int] = option(
        REQUIRED,
        help="the devices and their memory, e.g. cuda:0=80GiB,cuda:1=80GiB,cpu=256GiB",
        kind=checked_by("devices", parse_devices),
        metavar="DEVICE=SIZE[,...]",
    )
    dtype: str | None = option(
        None, help=f"{', '.join(DTYPES)} (default: the policy's pick)", kind=floating_dtype
    )
    prompt_tokens: int = option(
        PROMPT_TOKENS,
        help="tokens per prompt the batch is planned for (default %(default)s)",
        kind=positive_int,
    )
    device_map: bool = option(False, help="plan a model placed by a device map")
    offload: bool = option(False, help="the device map may offload to disk")
    tensor_parallel_size: int = option(1, help="plan vLLM over N GPUs", kind=positive_int)
    json: bool = option(False, help="print the plan as JSON")


@checked(PlanOptions, skip=("model",))
def plan(
    model: str | Shape,
    devices: str | Mapping[str, Any],
    dtype: str | None = None,
    prompt_tokens: int = PROMPT_TOKENS,
    batch_size: int | None = None,
    device_map: bool = False,
    offload: bool = False,
    tensor_parallel_size: int = 1,
) -> MemoryPlan:
    """The memory plan of `model` (see `read_shape`) on `devices` (`cuda:0=80GiB,...` or a
    mapping): the dtype the policy picks unless `dtype`, the weights, and the largest batch
    (of `BATCH_SIZES`, or `batch_size`) whose KV cache and activations fit beside them.
    `device_map`/`offload`: the model will be dispatched (over the accelerators and the CPU,
    with `offload` also to disk); `tensor_parallel_size`: vLLM shards the weights that many ways.
    `fits` False comes with `advice`, the one line the load refuses with."""
    shape = model if isinstance(model, Shape) else read_shape(model)
    sizes = parse_devices(devices)
    gpus = {d: b for d, b in sizes.items() if d != "cpu"}
    first = next(iter(gpus.values()), None)
    if dtype is None:
        from probekit.engines.hf.precision import FP32_MEMORY_SHARE

        on_cpu = first is None
        dtype = (
            "float32" if on_cpu or 4 * shape.parameters <= FP32_MEMORY_SHARE * first else "bfloat16"
        )
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(
        dtype, dtype
    )
    if dtype not in DTYPE_BYTES:
        raise ProbekitError(f"unknown dtype '{dtype}'; use {', '.join(DTYPE_BYTES)}")
    width = DTYPE_BYTES[dtype]
    weights = shape.parameters * width
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_width * width
    work_token = (4 * shape.width + 2 * shape.mlp_width) * width
    capture_token = shape.layers * shape.width * 4
    per_prompt = prompt_tokens * (per_token + work_token) + 12 * shape.vocabulary

    def batch_fitting(room: float) -> int:
        tried = (batch_size,) if batch_size else BATCH_SIZES
        return next((b for b in tried if b * per_prompt <= room), 0)

    notes: list[str] = []
    name = shape.name
    usable = {d: int(b * USABLE_SHARE) for d, b in sizes.items()}
    main = next(iter(usable))
    placement, batch, advice = "", 0, ""
    shard = tensor_parallel_size if tensor_parallel_size > 1 else 1
    if shard > 1:  # vLLM: each of `shard` GPUs holds 1/shard of the weights and of the KV cache
        room = min(usable[d] for d in list(gpus)[:shard]) if len(gpus) >= shard else 0
        batch = batch_fitting(shard * room - weights) if room else 0
        placement = f"vLLM tensor parallel over {shard} GPUs" if batch else ""
    elif not device_map:
        batch = batch_fitting(usable[main] - weights)
        placement = main if batch else ""
    else:  # accelerate's dispatch: weights over the accelerators, then the CPU, then disk
        accelerators = sum(usable[d] for d in gpus)
        spill = weights - accelerators
        # the batch lives on the first device: what the weights leave there, or (offloading) a
        # quarter of it, which --max-memory should keep free
        room = accelerators - weights if spill < 0 else usable[main] // 4
        batch = batch_fitting(room)
        if spill <= 0 and gpus:
            placement = f"--device-map over {', '.join(gpus)}"
        elif spill <= usable.get("cpu", 0) and "cpu" in usable:
            placement = f"--device-map with {format_size(spill)} offloaded to the CPU"
        elif offload:
            placement = f"--device-map with {format_size(max(spill, 0))} offloaded to CPU and disk"
        if not batch:
            placement = ""
    if not placement:
        advice = refusal(shape, dtype, weights, sizes, per_prompt)
    elif placement == main and len(gpus) > 1:
        notes.append("the whole model fits on the first device; the others stay idle")
    return MemoryPlan(
        model=name,
        parameters=shape.parameters,
        dtype=dtype,
        weights=weights,
        prompt_tokens=prompt_tokens,
        batch_size=batch,
        kv_cache=max(batch, 1) * prompt_tokens * per_token,
        workspace=max(batch, 1) * (prompt_tokens * work_token + 12 * shape.vocabulary),
        capture=max(batch, 1) * prompt_tokens * capture_token,
        devices=sizes,
        placement=placement,
        fits=bool(placement),
        advice=advice,
        notes=notes,
    )


def refusal(
    shape: Shape,
    dtype: str,
    weights: int,
    sizes: Mapping[str, int],
    per_prompt: int,
) -> str:
    """The one line a plan that does not fit refuses with, naming options that would fit."""
    gpus = {d: b for d, b in sizes.items() if d != "cpu"}
    usable = {d: int(b * USABLE_SHARE) for d, b in sizes.items()}
    if gpus:
        size = max(gpus.values())
        kind = "GPU" if len(gpus) == 1 else "GPUs"
        count = "one" if len(gpus) == 1 else str(len(gpus))
        have = f"{count} {format_size(size, True)} {kind}"
        room = int(size * USABLE_SHARE)
        shards = next((k for k in (2, 4, 8, 16, 32, 64) if weights / k + per_prompt <= room), None)
    else:
        have = f"{format_size(sum(sizes.values()), True)} of memory"
        shards = None
    options = ["--device-map auto with --max-memory and --offload-folder"]
    if dtype in ("float32", "float64") and weights / 2 + per_prompt <= max(usable.values()):
        options.insert(0, "--dtype bfloat16")
    if shards:
        options.append(f"--engine vllm --tensor-parallel-size {shards}")
    return (
        f"{shape.name} in {dtype} needs {format_size(weights)} of weights; {have}: use "
        f"{', '.join(options[:-1]) + ', or ' if len(options) > 1 else ''}{options[-1]}"
    )


def check_before_load(
    spec: str,
    device: str | None = None,
    dtype: Any = None,
    device_map: Any = None,
    max_memory: Any = None,
    offload_folder: Any = None,
    parallel: int = 1,
) -> MemoryPlan | None:
    """The plan of loading `spec` as `load_engine` was asked to, when the model goes to an
    accelerator or by a device map (None otherwise, or when its config cannot be read here, as
    for a hub id not in the local cache); raises the plan's one line when it does not fit."""
    import torch

    dispatched = any(v is not None for v in (device_map, max_memory, offload_folder))
    target = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not dispatched and not str(target).startswith("cuda"):
        return None  # the CPU (RAM is the operating system's to refuse) or MPS (size unknown)
    if max_memory is not None:
        devices = parse_devices(max_memory)
    elif dispatched or parallel > 1:
        devices = visible_gpus()
        if dispatched:
            devices["cpu"] = _physical_memory()
    else:
        key = device_key(str(target))
        devices = {key: torch.cuda.get_device_properties(torch.device(key)).total_memory}
    if not devices:
        return None
    try:
        shape = read_shape(spec)
    except ProbekitError:
        return None
    name = None if dtype is None else str(dtype).removeprefix("torch.")
    result = plan(
        shape,
        devices,
        dtype=name,
        device_map=dispatched,
        offload=offload_folder is not None,
        tensor_parallel_size=parallel,
    )
    if not result.fits:
        raise ProbekitError(result.advice)
    return result


def visible_gpus() -> dict[str, int]:
    """The CUDA devices torch sees and their memory in bytes ({} without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {
        f"cuda:{i}": torch.cuda.get_device_properties(i).total_memory
        for i in range(torch.cuda.device_count())
    }


def _physical_memory() -> int:
    """Bytes of RAM of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
