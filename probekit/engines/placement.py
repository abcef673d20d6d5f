"""Placement search: the ways a model may be placed on some devices (one device, a device map over
the GPUs, a device map with CPU or disk offload, vLLM tensor parallelism), the first of them whose
weights and batch fit, and the one line a plan refuses with when none does, naming the options
that would fit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from probekit.core.options import given, named
from probekit.engines.devices import format_size
from probekit.engines.memory import (
    USABLE_SHARE,
    largest_batch,
    longest_prompt,
    prompt_bytes,
    weight_bytes,
)
from probekit.engines.shapes import Shape


@dataclass(frozen=True)
class Placement:
    """One way to place the model: its name as the plan answers it, whether the weights fit
    and the device memory left for the batch."""

    name: str
    weights_fit: bool
    room: float


def placements(
    weights: int,
    usable: Mapping[str, int],
    dispatched: bool,
    offload: bool,
    tensor_parallel_size: int,
) -> list[Placement]:
    """The placements a plan tries, in order: the one asked for (`dispatched`: a device map;
    vLLM's tensor parallelism), else one device, a device map over the GPUs, a device map with
    CPU offload (and disk offload with `offload`), vLLM tensor parallel over 2, 4, ... of the
    GPUs. `usable`: the bytes of each device the plan may fill."""
    gpus = [d for d in usable if d != "cpu"]
    main = next(iter(usable))
    accelerators = sum(usable[d] for d in gpus)
    spill = weights - accelerators
    # a dispatched model's batch lives on the first device: what the weights leave on the
    # accelerators, or (offloading) a quarter of the first one, which --max-memory keeps free
    map_room = accelerators - weights if spill < 0 else usable[main] // 4
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

    if tensor_parallel_size > 1:
        return [sharded(tensor_parallel_size)]
    if dispatched:
        fits = [p for p in (over_gpus, to_cpu) if p.weights_fit and (gpus or p is to_cpu)]
        return fits[:1] or ([to_disk] if offload else [over_gpus if gpus else to_cpu])
    tried = [Placement(main, weights <= usable[main], usable[main] - weights)]
    if len(gpus) > 1:
        tried.append(over_gpus)
    if gpus and "cpu" in usable:
        tried.append(to_cpu)
    if gpus and offload:
        tried.append(to_disk)
    return tried + [sharded(k) for k in (2, 4, 8, 16) if k <= len(gpus)]


def first_fit(
    tried: list[Placement], per_prompt: int, batch_size: int | None
) -> tuple[Placement | None, int, list[str]]:
    """The first of `tried` whose weights fit and that leaves room for a batch (of
    `BATCH_SIZES`, or just `batch_size`) of prompts of `per_prompt` bytes, that batch, and a
    line for each placement tried saying how it went; (None, 0, lines) when none fits."""
    lines = []
    for placement in tried:
        batch = largest_batch(placement.room, per_prompt, batch_size)
        if not placement.weights_fit:
            lines.append(f"{placement.name}: the weights do not fit")
        elif not batch:
            lines.append(f"{placement.name}: the weights fit, the batch does not")
        else:
            lines.append(f"{placement.name}: fits, batch {batch}")
            return placement, batch, lines
    return None, 0, lines


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
    longest = longest_prompt(shape, dtype, left)
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
    weights = weight_bytes(shape, dtype)
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
    mapped = f"{given('device_map', 'auto')} with {named('max_memory')} and "
    options = [mapped + named("offload_folder")]
    if dtype in ("float32", "float64") and weights / 2 + per_prompt <= max(usable.values()):
        options.insert(0, given("dtype", "bfloat16"))
    if shards:
        options.append(given("engine", "vllm") + ", " + given("tensor_parallel_size", shards))
    return (
        f"{shape.name} in {dtype} needs {format_size(weights)} of weights; {have}: use "
        f"{', '.join(options[:-1]) + ', or ' if len(options) > 1 else ''}{options[-1]}"
    )
