"""The memory plan: where a model goes before it loads (`probekit plan`, `probekit.plan`, the
check `load_engine` runs before every load on an accelerator or a device map).

The plan is arithmetic on the model's config, never its weights, in four parts:
`probekit.engines.devices` (memory sizes, device names, device maps), `probekit.engines.shapes`
(the model's `Shape`, built on the meta device), `probekit.engines.memory` (the bytes of the
weights, the KV cache and the activations; the batch that fits; the dtype the precision policy
picks) and `probekit.engines.placement` (the placements tried, and the refusal). Given several
devices and no placement, the plan tries the placements in turn (one device, a device map over
the GPUs, a device map with CPU offload, vLLM tensor parallelism) and answers with the first
that fits, with its batch; it refuses, in one line naming the options that would fit, only when
none does, and says so when the weights fit but the batch or the prompt length does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.kinds import checked_by, positive_int
from probekit.core.options import REQUIRED, as_keywords, option
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
from probekit.engines.memory import (
    PROMPT_TOKENS,
    USABLE_SHARE,
    capture_bytes,
    kv_bytes,
    plan_dtype,
    prompt_bytes,
    weight_bytes,
)
from probekit.engines.options import ModelChoice
from probekit.engines.placement import batch_refusal, first_fit, placements, refusal
from probekit.engines.shapes import Shape, meta_model, read_shape, shape_of


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
        texts = {"placement": self.placement, "advice": self.advice}
        lines = {"notes": self.notes, "tried": self.tried}
        return replace(
            self,
            **{k: words(v) for k, v in texts.items()},
            **{k: [words(v) for v in vs] for k, vs in lines.items()},
        )


@dataclass(frozen=True, kw_only=True)
class PlanOptions(BatchSizeOption, ModelChoice):
    """Plan options: the model, the devices, the batch planned for."""

    devices: dict[str, int] = option(
        REQUIRED,
        help="the devices and their memory, e.g. cuda:0=80GiB,cuda:1=80GiB,cpu=256GiB",
        kind=checked_by("devices", parse_devices),
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
    """The memory plan of `model` (see `probekit.engines.shapes.meta_model`) on `devices`
    (`cuda:0=80GiB,...` or a mapping): the dtype the policy picks unless `dtype`, the weights,
    a placement and the largest batch (of `BATCH_SIZES`, or `batch_size`) of prompts of
    `prompt_tokens` tokens whose KV cache and activations fit beside them.

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
    devices: str | Mapping[str, Any],
    dtype: str | None,
    prompt_tokens: int,
    batch_size: int | None,
    dispatched: bool,
    offload: bool,
    tensor_parallel_size: int,
) -> MemoryPlan:
    """`plan` with the options its lines name marked (`probekit.core.options.named`): the
    command line words them as flags."""
    shape = model if isinstance(model, Shape) else read_shape(str(model))
    sizes = parse_devices(devices)
    dtype = plan_dtype(shape, sizes, dtype)
    weights = weight_bytes(shape, dtype)
    per_token = kv_bytes(shape, dtype)
    per_prompt = prompt_bytes(shape, dtype, prompt_tokens)
    usable = {d: int(b * USABLE_SHARE) for d, b in sizes.items()}
    tried = placements(weights, usable, dispatched, offload, tensor_parallel_size)
    chosen, batch, lines = first_fit(tried, per_prompt, batch_size)
    notes: list[str] = []
    advice = ""
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
        capture=prompts * capture_bytes(shape, prompt_tokens),
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
        devices = parse_devices(max_memory)
    elif dispatched or parallel > 1:
        devices = visible_gpus()
        if dispatched:
            devices["cpu"] = physical_memory()
    else:
        key = device_key(str(target))
        devices = {key: device_memory(torch.device(key))}
    if not devices:
        return None
    try:
        hf, name = meta_model(spec)
    except ProbekitError:
        return None
    mapping = None if device_map is None else parse_device_map(device_map)
    if isinstance(mapping, dict):
        check_map_modules(mapping, dict(hf.named_modules()), dict(hf.named_parameters()), name)
    result = marked_plan(
        shape_of(hf, name),
        parse_devices(devices),
        None if dtype is None else str(dtype).removeprefix("torch."),
        PROMPT_TOKENS,
        None,
        dispatched,
        offload_folder is not None,
        parallel,
    )
    if not result.fits:
        raise ProbekitError(result.advice)
    return result
