"""The memory plan: where a model goes before it loads (`probekit plan`, `probekit.plan`, the
check `load_engine` runs before every load on an accelerator or a device map).

The plan is arithmetic on the model's config, never its weights: the model's `Shape` (built on
PyTorch's `meta` device: shapes, no memory), the bytes of its weights, and per token of a batch
its KV cache (2 x layers x key/value heads x head width) and the forward's working activations
(4 x width + 2 x MLP width); per prompt the float32 logits and float64 log-probabilities of the
answer position. The batch is counted in tokens: the largest of `BATCH_SIZES` whose prompts
(prompt length plus answer positions) fit beside the weights. A capture's activations (one site
at every layer, float32, every position at most) are counted apart: they are copied to host
memory as each batch is read, so they do not count against the device.

Given several devices and no placement, the plan tries the placements in turn (one device, a
device map over the GPUs, a device map with CPU offload, vLLM tensor parallelism) and answers
with the first that fits, with its batch; it refuses, in one line naming the options that would
fit, only when none does, and says so when the weights fit but the batch or the prompt length
does not. Device names, sizes and maps are `probekit.engines.devices`'.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.kinds import positive_int
from probekit.core.options import REQUIRED, as_keywords, given, named, option
from probekit.core.public import public
from probekit.core.shared_options import BatchSizeOption
from probekit.engines.devices import (
    check_map_modules,
    device_key,
    device_memory,
    format_size,
    parse_device_map,
    parse_devices,
    physical_memory,
    visible_gpus,
)
from probekit.engines.options import DTYPES, ModelChoice, device_sizes, dtype_name

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
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
FP32_MEMORY_SHARE = 0.5
"""An accelerator runs a model in float32 by default when its float32 weights take at most this
share of its memory (the rest holds the KV caches of the prompt and trie passes)."""
LOGIT_BYTES = 12
"""Bytes per vocabulary entry of a prompt's answer position: float32 logits, float64
log-probabilities."""


# ------------------------------------------------------------------ the model's shape


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


def shape_of(hf: Any, name: str) -> Shape:
    """The shape of a transformers model (on any device, the meta device included; its text
    config for a multimodal one)."""
    text = hf.config.get_text_config()
    heads, width = int(text.num_attention_heads), int(text.hidden_size)
    return Shape(
        name=name,
        parameters=sum(p.numel() for p in hf.parameters()),
        layers=int(text.num_hidden_layers),
        width=width,
        mlp_width=int(getattr(text, "intermediate_size", None) or 4 * width),
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_width=int(getattr(text, "head_dim", None) or width // heads),
        vocabulary=int(text.vocab_size),
    )


def on_meta(config: Any) -> Any:
    """The causal LM of a transformers `config` built on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def meta_model(model: str) -> tuple[Any, str]:
    """`model` built on the meta device, and the name the plan gives it. `model`: `default`, a
    `.gguf` file already converted, a model folder (or hub-style folder) with config.json, a
    config.json path, or a hub id in the local Hugging Face cache."""
    from transformers import AutoConfig
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
            if data.get("model_type") not in CONFIG_MAPPING:
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
    named_as = path.parent if path.is_file() else path
    return on_meta(config), model if model == "default" or not path.exists() else named_as.name


def read_shape(model: str) -> Shape:
    """The shape of `model` (as `meta_model` takes it); no weights are read."""
    return shape_of(*meta_model(model))


# ------------------------------------------------------------------ bytes and batches


def kv_bytes(shape: Shape, dtype: str) -> int:
    """KV cache of one token: 2 (key, value) x layers x key/value heads x head width."""
    return 2 * shape.layers * shape.kv_heads * shape.head_width * DTYPE_BYTES[dtype]


def token_bytes(shape: Shape, dtype: str) -> int:
    """Device memory of one token of a prompt in a batch: its KV cache and the forward's working
    activations (4 x width + 2 x MLP width)."""
    work = (4 * shape.width + 2 * shape.mlp_width) * DTYPE_BYTES[dtype]
    return kv_bytes(shape, dtype) + work


def prompt_bytes(shape: Shape, dtype: str, tokens: int) -> int:
    """Device memory of one prompt of `tokens` tokens in a batch: its tokens', and its answer
    position's float32 logits and float64 log-probabilities."""
    return tokens * token_bytes(shape, dtype) + LOGIT_BYTES * shape.vocabulary


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
    return max(1, largest_batch(room, prompt_bytes(shape, dtype, tokens)))


def plan_dtype(parameters: int | None, memory: int | None, dtype: Any = None) -> str:
    """`dtype` by its name, else the policy's pick: float32 on the CPU (`memory` None) and where
    the float32 weights of `parameters` take at most `FP32_MEMORY_SHARE` of the accelerator's
    `memory` bytes, else (also where either is not known: None, 0) bfloat16."""
    if dtype is None:
        fits = memory is None or bool(
            parameters and memory and 4 * parameters <= FP32_MEMORY_SHARE * memory
        )
        return "float32" if fits else "bfloat16"
    if (name := dtype_name(dtype)) is None:
        raise ProbekitError(f"unknown dtype '{dtype}'; use {', '.join(DTYPES)}")
    return name


# ------------------------------------------------------------------ placements


@dataclass(frozen=True)
class Placement:
    """One way to place the model: its name as the plan answers it, whether the weights fit
    and the device memory left for the batch."""

    name: str
    weights_fit: bool
    room: float


def placements(
    weights: int, usable: Mapping[str, int], dispatched: bool, offload: bool, parallel: int
) -> list[Placement]:
    """The placements a plan tries, in order: the one asked for (`dispatched`: a device map;
    `parallel` > 1: vLLM's tensor parallelism), else one device, a device map over the GPUs, a
    device map with CPU offload (and disk offload with `offload`), vLLM tensor parallel over 2,
    4, ... of the GPUs. `usable`: the bytes of each device the plan may fill."""
    gpus = [d for d in usable if d != "cpu"]
    main = next(iter(usable))
    spill = weights - sum(usable[d] for d in gpus)
    # a dispatched model's batch lives on the first device: what the weights leave on the
    # accelerators, or (offloading) a quarter of the first one, which --max-memory keeps free
    map_room = -spill if spill < 0 else usable[main] // 4
    mapped = named("device_map")  # as the caller names it: --device-map, device_map
    over_gpus = Placement(f"{mapped} over {', '.join(gpus)}", spill <= 0, map_room)
    to_cpu = Placement(
        f"{mapped} with {format_size(spill)} offloaded to the CPU",
        "cpu" in usable and 0 < spill <= usable["cpu"],
        map_room,
    )
    to_disk = Placement(
        f"{mapped} with {format_size(max(spill, 0))} offloaded to CPU and disk", True, map_room
    )

    def sharded(k: int) -> Placement:
        room = k * min(usable[d] for d in gpus[:k]) if len(gpus) >= k else 0
        return Placement(f"vLLM tensor parallel over {k} GPUs", room >= weights, room - weights)

    if parallel > 1:
        return [sharded(parallel)]
    if dispatched:
        fits = [p for p in (over_gpus, to_cpu) if p.weights_fit and (gpus or p is to_cpu)]
        return fits[:1] or ([to_disk] if offload else [over_gpus if gpus else to_cpu])
    tried = [Placement(main, weights <= usable[main], usable[main] - weights)]
    tried += [over_gpus] * (len(gpus) > 1) + [to_cpu] * bool(gpus and "cpu" in usable)
    tried += [to_disk] * bool(gpus and offload)
    return tried + [sharded(k) for k in (2, 4, 8, 16) if k <= len(gpus)]


def batch_refusal(
    shape: Shape, dtype: str, placement: Placement, prompt_tokens: int, batch_size: int | None
) -> str:
    """The one line of a plan whose weights fit but whose batch does not: what the batch or the
    prompt needs beside the weights, what is left, and what would fit."""
    per_prompt = prompt_bytes(shape, dtype, prompt_tokens)
    left = max(placement.room, 0)
    head = f"{shape.name} in {dtype}: the weights fit ({placement.name}), but "
    most = largest_batch(left, per_prompt)
    if batch_size and most:
        return (
            f"{head}a batch of {batch_size} prompts of {prompt_tokens} tokens needs "
            f"{format_size(batch_size * per_prompt)} beside them and {format_size(left)} is "
            f"left: use {given('batch_size', most)} or less"
        )
    longest = int((left - LOGIT_BYTES * shape.vocabulary) // token_bytes(shape, dtype))
    fix = (
        f"plan prompts of at most {longest} tokens ({named('prompt_tokens')})"
        if longest > 0
        else f"the weights leave no room for a prompt: use {given('dtype', 'bfloat16')} or a "
        "device map"
    )
    return (
        f"{head}one prompt of {prompt_tokens} tokens needs {format_size(per_prompt)} (KV cache "
        f"and activations) beside them and {format_size(left)} is left: {fix}"
    )


def refusal(shape: Shape, dtype: str, sizes: Mapping[str, int], per_prompt: int) -> str:
    """The one line a plan whose weights fit nowhere refuses with, naming options that would."""
    weights = shape.parameters * DTYPE_BYTES[dtype]
    gpus = [b for d, b in sizes.items() if d != "cpu"]
    shards = None
    if gpus:
        count, kind = ("one", "GPU") if len(gpus) == 1 else (str(len(gpus)), "GPUs")
        have = f"{count} {format_size(max(gpus), True)} {kind}"
        room = int(max(gpus) * USABLE_SHARE)
        shards = next((k for k in (2, 4, 8, 16, 32, 64) if weights / k + per_prompt <= room), None)
    else:
        have = f"{format_size(sum(sizes.values()), True)} of memory"
    options = [f"{given('device_map', 'auto')} with {named('max_memory')} and "]
    options[0] += named("offload_folder")
    usable = max(sizes.values()) * USABLE_SHARE
    if dtype in ("float32", "float64") and weights / 2 + per_prompt <= int(usable):
        options.insert(0, given("dtype", "bfloat16"))
    if shards:
        options.append(given("engine", "vllm") + ", " + given("tensor_parallel_size", shards))
    return (
        f"{shape.name} in {dtype} needs {format_size(weights)} of weights; {have}: use "
        f"{', '.join(options[:-1]) + ', or ' if len(options) > 1 else ''}{options[-1]}"
    )


# ------------------------------------------------------------------ the plan


@public()
@dataclass(frozen=True)
class MemoryPlan:
    """The memory plan of one model on some devices (`plan`); sizes in bytes."""

    model: str
    parameters: int
    dtype: str
    weights: int
    prompt_tokens: int
    batch_size: int  # 0 when no placement fits
    kv_cache: int  # of `batch_size` prompts of `prompt_tokens` (of one when none fits)
    workspace: int  # the forward's activations and the answer position's logits, same batch
    capture: int  # one site at every layer, float32, same batch: host memory (not in the fit)
    devices: dict[str, int]
    placement: str  # "cuda:0", "device_map over ..." (`--device-map`), ...; "" if it does not fit
    fits: bool
    advice: str = ""  # the refusal line when it does not fit
    notes: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)  # each placement tried, and how it went

    def lines(self) -> list[str]:
        """The plan as a reader reads it, one figure a line; a plan that does not fit says so
        in its batch line and gives the figures of one prompt (its refusal is `advice`)."""
        size = format_size
        devices = ", ".join(f"{d}={format_size(b, True)}" for d, b in self.devices.items())
        prompts = f"{self.prompt_tokens} tokens"
        batch = (
            f"batch: {self.batch_size} prompts of {prompts}"
            if self.fits
            else f"batch: none fits (the figures below are of one prompt of {prompts})"
        )
        out = [
            f"model: {self.model} ({self.parameters / 1e9:.2f} B parameters)",
            f"devices: {devices}",
            f"dtype: {self.dtype}",
            f"weights: {size(self.weights)}",
            batch,
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

    def worded(self, words: Callable[[str], str]) -> MemoryPlan:
        """The plan with the options its lines name worded by `words` (`as_keywords`,
        `as_flags`: `probekit.core.options`)."""
        return replace(
            self,
            placement=words(self.placement),
            advice=words(self.advice),
            notes=[words(v) for v in self.notes],
            tried=[words(v) for v in self.tried],
        )


@dataclass(frozen=True, kw_only=True)
class PlanOptions(BatchSizeOption, ModelChoice):
    """Plan options: the model, the devices, the batch planned for."""

    devices: dict[str, int] = option(
        REQUIRED,
        help="the devices and their memory, e.g. cuda:0=80GiB,cuda:1=80GiB,cpu=256GiB",
        kind=device_sizes,
        metavar="DEVICE=SIZE[,...]",
    )
    prompt_tokens: int = option(
        PROMPT_TOKENS,
        help="tokens per prompt the batch is planned for (default %(default)s)",
        kind=positive_int,
    )
    dispatched: bool = option(
        False, help="plan the model dispatched by a device map only (as --device-map loads it)"
    )
    offload: bool = option(False, help="the device map may offload to disk")
    tensor_parallel_size: int = option(1, help="plan vLLM over N GPUs", kind=positive_int)
    json: bool = option(False, help="print the plan as JSON")


@public(PlanOptions, skip=("model",))
def plan(
    model: str | Path | Shape,
    devices: str | Mapping[str, Any],
    dtype: str | None = None,
    prompt_tokens: int = PROMPT_TOKENS,
    batch_size: int | None = None,
    dispatched: bool = False,
    offload: bool = False,
    tensor_parallel_size: int = 1,
) -> MemoryPlan:
    """The memory plan of `model` (see `meta_model`) on `devices` (`cuda:0=80GiB,...` or a
    mapping): the dtype the policy picks unless `dtype`, the weights, a placement and the
    largest batch (of `BATCH_SIZES`, or `batch_size`) of prompts of `prompt_tokens` tokens whose
    KV cache and activations fit beside them.

    Without `dispatched` or `tensor_parallel_size` the plan tries the placements in turn (one
    device, a device map over the GPUs, with CPU offload, with disk offload when `offload`,
    vLLM tensor parallel) and answers with the first whose weights and batch fit; `tried`
    says how each went. `dispatched`/`offload`: plan the model dispatched by a device map over
    the accelerators and the CPU (with `offload` also to disk); `tensor_parallel_size`: vLLM
    shards the weights that many ways. `fits` False comes with `advice`, the one line the load
    refuses with."""
    return marked_plan(**locals()).worded(as_keywords)


def marked_plan(
    model: str | Path | Shape,
    devices: Mapping[str, int],
    dtype: str | None,
    prompt_tokens: int,
    batch_size: int | None,
    dispatched: bool,
    offload: bool,
    tensor_parallel_size: int,
) -> MemoryPlan:
    """`plan` with the options its lines name marked (`probekit.core.options.named`): the
    command line words them as flags. `devices` as their kind reads them (`device_sizes`)."""
    shape = model if isinstance(model, Shape) else read_shape(str(model))
    sizes = dict(devices)
    first = next((b for d, b in sizes.items() if d != "cpu"), None)
    dtype = plan_dtype(shape.parameters, first, dtype)
    weights = shape.parameters * DTYPE_BYTES[dtype]
    per_token = kv_bytes(shape, dtype)
    per_prompt = prompt_bytes(shape, dtype, prompt_tokens)
    usable = {d: int(b * USABLE_SHARE) for d, b in sizes.items()}
    tried = placements(weights, usable, dispatched, offload, tensor_parallel_size)
    chosen, batch, lines = None, 0, []
    for placement in tried:
        fit = placement.weights_fit
        batch = largest_batch(placement.room, per_prompt, batch_size) if fit else 0
        how = f"fits, batch {batch}" if batch else "the weights fit, the batch does not"
        lines.append(f"{placement.name}: {how if fit else 'the weights do not fit'}")
        if batch:
            chosen = placement
            break
    notes, advice = [], ""
    if chosen is None:
        fitting = [p for p in tried if p.weights_fit]
        advice = (
            batch_refusal(shape, dtype, fitting[0], prompt_tokens, batch_size)
            if fitting
            else refusal(shape, dtype, sizes, per_prompt)
        )
    elif chosen.name == next(iter(sizes)) and sum(d != "cpu" for d in sizes) > 1:
        notes.append("the whole model fits on the first device; the others stay idle")
    prompts = max(batch, 1)
    return MemoryPlan(
        model=shape.name,
        parameters=shape.parameters,
        dtype=dtype,
        weights=weights,
        prompt_tokens=prompt_tokens,
        batch_size=batch,
        kv_cache=prompts * prompt_tokens * per_token,
        workspace=prompts * (per_prompt - prompt_tokens * per_token),
        capture=prompts * prompt_tokens * shape.layers * shape.width * 4,
        devices=sizes,
        placement=chosen.name if chosen else "",
        fits=chosen is not None,
        advice=advice,
        notes=notes,
        tried=lines,
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
    for a hub id not in the local cache); raises the plan's one line when it does not fit, and
    one line when a device map names a module the model lacks or leaves one without a
    device."""
    import torch

    dispatched = any(v is not None for v in (device_map, max_memory, offload_folder))
    target = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not dispatched and not str(target).startswith("cuda"):
        return None  # the CPU (RAM is the operating system's to refuse) or MPS (size unknown)
    if max_memory is not None:
        sizes = parse_devices(max_memory)
    elif dispatched or parallel > 1:
        sizes = visible_gpus() | ({"cpu": physical_memory()} if dispatched else {})
    else:
        key = device_key(str(target))
        sizes = {key: device_memory(torch.device(key))}
    if not sizes:
        return None
    try:
        hf, name = meta_model(spec)
    except ProbekitError:
        return None
    if isinstance(mapping := device_map and parse_device_map(device_map), dict):
        check_map_modules(mapping, hf, name)
    shape, offload = shape_of(hf, name), offload_folder is not None
    result = marked_plan(shape, sizes, dtype, PROMPT_TOKENS, None, dispatched, offload, parallel)
    if not result.fits:
        raise ProbekitError(result.advice)
    return result
