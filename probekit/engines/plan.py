"""Where a model goes before it loads: device sizes, accelerate's dispatch options, and the memory
plan (`probekit plan`, `probekit.plan`, the check `load_engine` runs before every load on an
accelerator or a device map, and the batch the exact scorer starts from on an accelerator).

The plan is arithmetic on the model's config, never its weights: the parameter count (the model
built on the meta device), times the bytes of the dtype the precision policy picks
(`engines/hf/precision.py`: float32 where its weights take at most `FP32_MEMORY_SHARE` of the first
accelerator, else bfloat16); per token of a batch the KV cache (2 x layers x key/value heads x head
width) and the forward's working activations (4 x width + 2 x MLP width); per prompt the float32
logits and float64 log-probabilities of the answer position. The batch is counted in tokens: the
largest of `BATCH_SIZES` whose prompts (prompt length plus answer positions) fit beside the
weights. A capture's activations (one site at every layer, float32, every position at most) are
reported beside: they are copied to host memory as each batch is read, so they do not count
against the device.

Given several devices and no placement, the plan tries the placements in turn (one device, a
device map over the GPUs, a device map with CPU offload, vLLM tensor parallelism) and answers
with the first that fits, with its batch; it refuses, in one line naming the options that would
fit, only when none does, and says so when the weights fit but the batch or the prompt length
does not.
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
MAX_BATCH = 2048
"""The largest batch the plan gives: beyond it a GPU's throughput no longer grows (benchmarks/gpu.py
sweeps it), and the scorer's window of prompts stays several batches long."""
BATCH_SIZES = tuple(MAX_BATCH >> k for k in range(MAX_BATCH.bit_length()))
"""Batch sizes the plan tries, largest first: the powers of two from `MAX_BATCH` down to 1 (the
scorer halves a batch that runs out of memory)."""
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

    @classmethod
    def of(cls, config: Any, name: str, parameters: int) -> Shape:
        """The shape of a transformers `config` (its text config, for a multimodal one)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(text.num_attention_heads)
        width = int(text.hidden_size)
        return cls(
            name=name,
            parameters=parameters,
            layers=int(text.num_hidden_layers),
            width=width,
            mlp_width=int(getattr(text, "intermediate_size", None) or 4 * width),
            kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            head_width=int(getattr(text, "head_dim", None) or width // heads),
            vocabulary=int(text.vocab_size),
        )

    def kv_bytes(self, dtype: str) -> int:
        """KV cache of one token: 2 (key, value) x layers x key/value heads x head width."""
        return 2 * self.layers * self.kv_heads * self.head_width * DTYPE_BYTES[dtype]

    def work_bytes(self, dtype: str) -> int:
        """The forward's working activations of one token: 4 x width + 2 x MLP width."""
        return (4 * self.width + 2 * self.mlp_width) * DTYPE_BYTES[dtype]

    def prompt_bytes(self, dtype: str, tokens: int) -> int:
        """Device memory of one prompt of `tokens` tokens in a batch: its KV cache and working
        activations, and its answer position's float32 logits and float64 log-probabilities."""
        return tokens * (self.kv_bytes(dtype) + self.work_bytes(dtype)) + 12 * self.vocabulary


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
    placement: str  # "cuda:0", "--device-map over ...", ..., or "" when it does not fit
    fits: bool
    advice: str = ""  # the refusal line when it does not fit
    notes: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)  # each placement tried, and how it went

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
        if len(self.tried) > 1:
            out += [f"tried: {line}" for line in self.tried]
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
    name = (
        model
        if model == "default" or not path.exists()
        else (path.parent if path.is_file() else path).name
    )
    return Shape.of(config, name, sum(p.numel() for p in hf.parameters()))


def largest_batch(room: float, per_prompt: int, batch_size: int | None = None) -> int:
    """The largest of `BATCH_SIZES` (or just `batch_size`) whose prompts of `per_prompt` bytes
    each fit in `room` bytes; 0 when none does."""
    tried = (batch_size,) if batch_size else BATCH_SIZES
    return next((b for b in tried if b * per_prompt <= room), 0)


def batch_for(shape: Shape, dtype: str, memory: int, tokens: int) -> int:
    """The batch the exact scorer starts from on one accelerator of `memory` bytes holding the
    whole model: the largest of `BATCH_SIZES` whose prompts of `tokens` tokens (prompt, answer
    positions and any generated tokens) fit beside the weights in `USABLE_SHARE` of it (at
    least 1: the scorer halves it again on out-of-memory)."""
    room = memory * USABLE_SHARE - shape.parameters * DTYPE_BYTES[dtype]
    return max(1, largest_batch(room, shape.prompt_bytes(dtype, tokens)))


def plan_dtype(shape: Shape, sizes: Mapping[str, int], dtype: str | None) -> str:
    """`dtype` by its name, else the policy's pick: float32 on the CPU and where its weights
    take at most `FP32_MEMORY_SHARE` of the first accelerator, else bfloat16."""
    if dtype is None:
        from probekit.engines.hf.precision import FP32_MEMORY_SHARE

        first = next((b for d, b in sizes.items() if d != "cpu"), None)
        fits = first is None or 4 * shape.parameters <= FP32_MEMORY_SHARE * first
        dtype = "float32" if fits else "bfloat16"
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(
        dtype, dtype
    )
    if dtype not in DTYPE_BYTES:
        raise ProbekitError(f"unknown dtype '{dtype}'; use {', '.join(DTYPE_BYTES)}")
    return dtype


@dataclass(frozen=True)
class _Placement:
    """One way to place the model: its name as the plan answers it, whether the weights fit
    and the device memory left for the batch."""

    name: str
    weights_fit: bool
    room: float


def _placements(
    weights: int,
    usable: Mapping[str, int],
    device_map: bool,
    offload: bool,
    tensor_parallel_size: int,
) -> list[_Placement]:
    """The placements a plan tries, in order: the one asked for (a device map, vLLM's tensor
    parallelism), else one device, a device map over the GPUs, a device map with CPU offload
    (and disk offload with `offload`), vLLM tensor parallel over 2, 4, ... of the GPUs."""
    gpus = [d for d in usable if d != "cpu"]
    main = next(iter(usable))
    accelerators = sum(usable[d] for d in gpus)
    spill = weights - accelerators
    # a dispatched model's batch lives on the first device: what the weights leave on the
    # accelerators, or (offloading) a quarter of the first one, which --max-memory keeps free
    map_room = accelerators - weights if spill < 0 else usable[main] // 4
    over_gpus = _Placement(f"--device-map over {', '.join(gpus)}", spill <= 0, map_room)
    to_cpu = _Placement(
        f"--device-map with {format_size(spill)} offloaded to the CPU",
        "cpu" in usable and 0 < spill <= usable["cpu"],
        map_room,
    )
    to_disk = _Placement(
        f"--device-map with {format_size(max(spill, 0))} offloaded to CPU and disk", True, map_room
    )

    def sharded(k: int) -> _Placement:
        room = k * min(usable[d] for d in gpus[:k]) if len(gpus) >= k else 0
        return _Placement(f"vLLM tensor parallel over {k} GPUs", room >= weights, room - weights)

    if tensor_parallel_size > 1:
        return [sharded(tensor_parallel_size)]
    if device_map:
        fits = [p for p in (over_gpus, to_cpu) if p.weights_fit and (gpus or p is to_cpu)]
        return fits[:1] or ([to_disk] if offload else [over_gpus if gpus else to_cpu])
    tried = [_Placement(main, weights <= usable[main], usable[main] - weights)]
    if len(gpus) > 1:
        tried.append(over_gpus)
    if gpus and "cpu" in usable:
        tried.append(to_cpu)
    if gpus and offload:
        tried.append(to_disk)
    return tried + [sharded(k) for k in (2, 4, 8, 16) if k <= len(gpus)]


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
    mapping): the dtype the policy picks unless `dtype`, the weights, a placement and the
    largest batch (of `BATCH_SIZES`, or `batch_size`) of prompts of `prompt_tokens` tokens whose
    KV cache and activations fit beside them.

    Without `device_map` or `tensor_parallel_size` the plan tries the placements in turn (one
    device, a device map over the GPUs, with CPU offload, with disk offload when `offload`,
    vLLM tensor parallel) and answers with the first whose weights and batch fit; `tried`
    says how each went. `device_map`/`offload`: plan the model dispatched over the
    accelerators and the CPU (with `offload` also to disk); `tensor_parallel_size`: vLLM shards
    the weights that many ways. `fits` False comes with `advice`, the one line the load
    refuses with."""
    for name, value in (("prompt_tokens", prompt_tokens), ("batch_size", batch_size or 1)):
        if not isinstance(value, int) or value < 1:
            raise ProbekitError(f"{name} must be a whole number of at least 1 (got {value!r})")
    shape = model if isinstance(model, Shape) else read_shape(model)
    sizes = parse_devices(devices)
    dtype = plan_dtype(shape, sizes, dtype)
    weights = shape.parameters * DTYPE_BYTES[dtype]
    per_token = shape.kv_bytes(dtype)
    per_prompt = shape.prompt_bytes(dtype, prompt_tokens)
    usable = {d: int(b * USABLE_SHARE) for d, b in sizes.items()}
    placements = _placements(weights, usable, device_map, offload, tensor_parallel_size)
    tried, chosen, batch = [], None, 0
    for placement in placements:
        fit = placement.weights_fit
        batch = largest_batch(placement.room, per_prompt, batch_size) if fit else 0
        if not fit:
            tried.append(f"{placement.name}: the weights do not fit")
        elif not batch:
            tried.append(f"{placement.name}: the weights fit, the batch does not")
        else:
            tried.append(f"{placement.name}: fits, batch {batch}")
            chosen = placement
            break
    notes: list[str] = []
    gpus = [d for d in sizes if d != "cpu"]
    if chosen is None:
        fitting = [p for p in placements if p.weights_fit]
        advice = (
            batch_refusal(shape, dtype, fitting[0], prompt_tokens, batch_size)
            if fitting
            else refusal(shape, dtype, weights, sizes, per_prompt)
        )
    else:
        advice = ""
        if chosen.name == next(iter(sizes)) and len(gpus) > 1:
            notes.append("the whole model fits on the first device; the others stay idle")
    return MemoryPlan(
        model=shape.name,
        parameters=shape.parameters,
        dtype=dtype,
        weights=weights,
        prompt_tokens=prompt_tokens,
        batch_size=batch,
        kv_cache=max(batch, 1) * prompt_tokens * per_token,
        workspace=max(batch, 1) * (per_prompt - prompt_tokens * per_token),
        capture=max(batch, 1) * prompt_tokens * shape.layers * shape.width * 4,
        devices=sizes,
        placement=chosen.name if chosen else "",
        fits=chosen is not None,
        advice=advice,
        notes=notes,
        tried=tried,
    )


def batch_refusal(
    shape: Shape, dtype: str, placement: _Placement, prompt_tokens: int, batch_size: int | None
) -> str:
    """The one line of a plan whose weights fit but whose batch does not: what the batch or the
    prompt needs beside the weights, what is left, and what would fit."""
    per_prompt = shape.prompt_bytes(dtype, prompt_tokens)
    left = max(placement.room, 0)
    head = f"{shape.name} in {dtype}: the weights fit ({placement.name}), but "
    most = largest_batch(left, per_prompt)
    if batch_size and most:
        return (
            f"{head}a batch of {batch_size} prompts of {prompt_tokens} tokens needs "
            f"{format_size(batch_size * per_prompt)} beside them and {format_size(left)} is "
            f"left: use --batch-size {most} or less"
        )
    token = shape.kv_bytes(dtype) + shape.work_bytes(dtype)
    longest = int((left - 12 * shape.vocabulary) // token)
    fix = (
        f"plan prompts of at most {longest} tokens (--prompt-tokens)"
        if longest > 0
        else "the weights leave no room for a prompt: use --dtype bfloat16 or a device map"
    )
    return (
        f"{head}one prompt of {prompt_tokens} tokens needs {format_size(per_prompt)} (KV cache "
        f"and activations) beside them and {format_size(left)} is left: {fix}"
    )


def refusal(
    shape: Shape,
    dtype: str,
    weights: int,
    sizes: Mapping[str, int],
    per_prompt: int,
) -> str:
    """The one line a plan whose weights fit nowhere refuses with, naming options that would."""
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
