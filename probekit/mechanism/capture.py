"""Capture residual-stream activations at named prompt spans, streamed to disk and resumable.

Sites follow TransformerLens names: `resid_pre` (block input), `attn_out` (attention output),
`mlp_out` (MLP output) and `resid_post` (block output). They are read either through the
TransformerBridge hook points (`blocks.{l}.hook_{site}`) or through nnsight on the Hugging Face
modules (block input, attention output, MLP output, block output). The two agree bit for bit
when both run the same attention kernel, and to float rounding otherwise (building the bridge
switches the model to eager attention; a model without a bridge uses SDPA).

Only span positions are kept. Each shard of prompts is one safetensors file with a tensor
`{site}.{layer}` of shape [rows, d_model] and one index parquet under `index/` with a row per
(prompt, span, layer, site): `shard`, `row_start`, `row_stop` (rows of that tensor),
`positions` (token positions in the unpadded prompt), `n_tokens`, `prompt_id` (the item id, as
in the run's scores table) and the item's key columns. A re-run into the same folder skips
prompt ids already indexed. Reading the TransformerLens hooks builds the model's bridge
(`model.enable_bridge()`, which changes the Hugging Face model; see `probekit.engines.hf.model`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from probekit.batching import left_pad, positions
from probekit.engines.hf.model import LoadedModel
from probekit.errors import ProbekitError
from probekit.io import atomic_write, write_parquet
from probekit.items import EncodedItem

SITES: tuple[str, ...] = ("resid_pre", "attn_out", "mlp_out", "resid_post")
BACKENDS: tuple[str, ...] = ("bridge", "nnsight")
_FORMAT = 1

Key = tuple[int, str]
Row = tuple[int, str, list[int]]  # (prompt in batch, span name, unpadded positions)


@dataclass(frozen=True)
class CaptureResult:
    """What one `capture` call did."""

    out_dir: Path
    captured: int
    skipped: int
    shards: list[Path]


def check_request(
    model: LoadedModel, layers: Sequence[int], sites: Sequence[str], backend: str
) -> None:
    """Raise a ProbekitError for an empty or out-of-range layer list, unknown site or backend."""
    model.check_layers(layers)
    if not sites:
        raise ProbekitError(f"no sites to capture; choose from {', '.join(SITES)}")
    for site in sites:
        if site not in SITES:
            raise ProbekitError(f"unknown site {site!r}; choose from {', '.join(SITES)}")
    if backend not in BACKENDS:
        raise ProbekitError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")


def gather(
    model: LoadedModel,
    prompts: Sequence[EncodedItem],
    layers: Sequence[int],
    sites: Sequence[str] = SITES,
    spans: Sequence[str] | None = None,
    backend: str = "bridge",
) -> tuple[list[Row], dict[Key, torch.Tensor]]:
    """Run one left-padded batch and return its span rows and, per (layer, site), [rows, d].

    Rows list every (prompt, span) in order; tensor rows follow them, one per position.
    """
    check_request(model, layers, sites, backend)
    ids, mask = left_pad([p.input_ids for p in prompts], model.tokenizer.pad_token_id)
    width = ids.shape[1]
    rows: list[Row] = []
    batch_idx: list[int] = []
    token_idx: list[int] = []
    for b, prompt in enumerate(prompts):
        shift = width - len(prompt.input_ids)
        names = prompt.positions if spans is None else spans
        for name in names:
            if name not in prompt.positions:
                raise ProbekitError(
                    f"unknown span {name!r}: the prompts have {', '.join(prompt.positions)}"
                )
            at = prompt.positions[name]
            rows.append((b, name, at))
            batch_idx += [b] * len(at)
            token_idx += [p + shift for p in at]
    inputs = {
        "input_ids": ids.to(model.device),
        "attention_mask": mask.to(model.device),
        "position_ids": positions(mask).to(model.device),
    }
    index = (
        torch.tensor(batch_idx, device=model.device),
        torch.tensor(token_idx, device=model.device),
    )
    run = _run_bridge if backend == "bridge" else _run_nnsight
    keys = [(layer, site) for layer in sorted(set(layers)) for site in SITES if site in sites]
    with torch.no_grad():
        acts = run(model, inputs, index, keys)
    missing = [f"blocks.{layer}.hook_{site}" for layer, site in keys if (layer, site) not in acts]
    if missing:
        raise ProbekitError(f"the {backend} backend did not reach {', '.join(missing)}")
    return rows, {key: acts[key] for key in keys}


def capture(
    model: LoadedModel,
    items: Iterable[EncodedItem],
    out_dir: str | Path,
    layers: Sequence[int],
    sites: Sequence[str] = SITES,
    spans: Sequence[str] | None = None,
    backend: str = "bridge",
    batch_size: int = 8,
    prompts_per_shard: int = 256,
    dtype: torch.dtype = torch.float16,
) -> CaptureResult:
    """Capture `sites` at `layers` for the `spans` of each prompt (all if None) into `out_dir`.

    Items are consumed lazily and written a shard at a time, so an interrupted run keeps every
    finished shard; running again with the same settings skips prompt ids already captured (and
    repeated ids). `dtype` is the storage type (fp16 by default; use float32 for exact checks).
    """
    check_request(model, layers, sites, backend)
    layers = model.check_layers(layers)
    if batch_size < 1 or prompts_per_shard < 1:
        raise ProbekitError("batch_size and prompts_per_shard must be at least 1")
    out = Path(out_dir)
    config = {
        "format": _FORMAT,
        "model": model.name,
        "weights": model.weights_fingerprint(),
        "d_model": int(model.hf.config.hidden_size),
        "layers": sorted(set(layers)),
        "sites": [s for s in SITES if s in sites],
        "spans": None if spans is None else list(spans),
        "dtype": str(dtype).removeprefix("torch."),
    }
    _open_folder(out, config)
    index = read_index(out)
    seen = set(index["prompt_id"]) if len(index) else set()
    shard_no = _next_shard(out)
    captured = skipped = 0
    written: list[Path] = []
    pending: list[EncodedItem] = []

    def flush() -> None:
        nonlocal shard_no, captured
        written.append(
            _write_shard(model, pending, out, shard_no, config, spans, backend, batch_size, dtype)
        )
        captured += len(pending)
        shard_no += 1
        pending.clear()

    for item in items:
        if item.id in seen:
            skipped += 1
            continue
        seen.add(item.id)
        pending.append(item)
        if len(pending) >= prompts_per_shard:
            flush()
    if pending:
        flush()
    return CaptureResult(out, captured, skipped, written)


def read_index(out_dir: str | Path) -> pd.DataFrame:
    """The index of everything captured in `out_dir` (empty if nothing is)."""
    parts = sorted((Path(out_dir) / "index").glob("shard-*.parquet"))
    if not parts:
        return pd.DataFrame(columns=["prompt_id", "span", "layer", "site", "shard"])
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def load_activations(
    out_dir: str | Path, layer: int, site: str, span: str
) -> tuple[pd.DataFrame, list[torch.Tensor]]:
    """The index rows of one (layer, site, span) and, for each, its [positions, d_model] tensor."""
    out = Path(out_dir)
    index = read_index(out)
    rows = index[(index["layer"] == layer) & (index["site"] == site) & (index["span"] == span)]
    if rows.empty:
        raise ProbekitError(
            f"nothing captured in {out} for layer {layer}, site {site}, span {span}"
        )
    rows = rows.reset_index(drop=True)
    blocks: dict[str, torch.Tensor] = {}
    tensors = []
    for shard, a, b in zip(rows["shard"], rows["row_start"], rows["row_stop"], strict=True):
        if shard not in blocks:
            with safe_open(out / shard, framework="pt") as f:
                blocks[shard] = f.get_tensor(f"{site}.{layer}")
        tensors.append(blocks[shard][a:b])
    return rows, tensors


def _run_bridge(
    model: Any, inputs: dict[str, torch.Tensor], index: Any, keys: list[Key]
) -> dict[Key, torch.Tensor]:
    acts: dict[Key, torch.Tensor] = {}

    def keep(key: Key) -> Any:
        def hook(value: Any, hook: Any) -> None:
            tensor = value[0] if isinstance(value, tuple) else value
            acts[key] = tensor[index].detach().float().cpu()

        return hook

    last = keys[-1][0]
    model.enable_bridge().run_with_hooks(
        inputs["input_ids"],
        fwd_hooks=[(f"blocks.{layer}.hook_{site}", keep((layer, site))) for layer, site in keys],
        stop_at_layer=last + 1 if last + 1 < model.n_layers else None,
        return_type=None,
        attention_mask=inputs["attention_mask"],
        position_ids=inputs["position_ids"],
    )
    return acts


def _run_nnsight(
    model: Any, inputs: dict[str, torch.Tensor], index: Any, keys: list[Key]
) -> dict[Key, torch.Tensor]:
    import nnsight

    lm = model.nnsight
    blocks_path, attn, mlp = block_module_names(model.hf)
    blocks = walk_path(lm, blocks_path)
    acts: dict[Key, Any] = {}
    # nnsight wants modules in the order they run: keys are sorted by layer, then site order.
    with lm.trace(inputs) as tracer:
        for layer, site in keys:
            tensor = site_value(blocks[layer], site, attn, mlp)
            acts[(layer, site)] = nnsight.save(tensor[index].detach().float().cpu())
        tracer.stop()
    return acts


def block_module_names(hf: Any) -> tuple[str, str, str]:
    """Dotted path of the block list and the attention and MLP attribute names in a block."""
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        try:
            blocks = walk_path(hf, path)
        except AttributeError:
            continue
        names = {name for name, _ in blocks[0].named_children()} | set(dir(blocks[0]))
        attn = next((n for n in ("self_attn", "attn", "attention") if n in names), None)
        if attn and "mlp" in names:
            return path, attn, "mlp"
    raise ProbekitError(
        f"the nnsight backend does not know the block layout of {type(hf).__name__}; "
        "use backend='bridge'"
    )


def site_value(block: Any, site: str, attn: str, mlp: str) -> Any:
    """The nnsight value of `site` (`resid_pre`, `attn_out`, `mlp_out`, `resid_post`) in a block."""
    if site == "resid_pre":
        value = block.input
    elif site == "attn_out":
        value = getattr(block, attn).output
    elif site == "mlp_out":
        value = getattr(block, mlp).output
    else:
        value = block.output
    return value[0] if isinstance(value, tuple) else value


def walk_path(root: Any, path: str) -> Any:
    """Follow a dotted attribute path such as `model.layers` from `root`."""
    for name in path.split("."):
        root = getattr(root, name)
    return root


def _open_folder(out: Path, config: dict[str, Any]) -> None:
    """Create `out` with its config, or check that an existing capture used the same settings."""
    meta = out / "capture.json"
    if meta.is_file():
        old = json.loads(meta.read_text())
        if old != config:
            changed = sorted(k for k in config if old.get(k) != config[k])
            raise ProbekitError(
                f"{out} holds a capture with other settings ({', '.join(changed)}); "
                "use a new --out folder or the same settings to resume"
            )
        return
    (out / "shards").mkdir(parents=True, exist_ok=True)
    (out / "index").mkdir(parents=True, exist_ok=True)
    atomic_write(meta, lambda tmp: tmp.write_text(json.dumps(config, indent=1)))


def _next_shard(out: Path) -> int:
    numbers = [int(p.stem.split("-")[1]) for p in (out / "index").glob("shard-*.parquet")]
    return max(numbers, default=-1) + 1


def _write_shard(
    model: Any,
    items: list[EncodedItem],
    out: Path,
    number: int,
    config: dict[str, Any],
    spans: Sequence[str] | None,
    backend: str,
    batch_size: int,
    dtype: torch.dtype,
) -> Path:
    """Capture `items` batch by batch; write the tensors, then the index part that commits them."""
    name = f"shard-{number:05d}"
    shard = Path("shards") / f"{name}.safetensors"
    blocks: dict[Key, list[torch.Tensor]] = {}
    records: list[dict[str, Any]] = []
    start = 0
    for i in range(0, len(items), batch_size):
        batch = items[i : i + batch_size]
        rows, acts = gather(model, batch, config["layers"], config["sites"], spans, backend)
        for key, tensor in acts.items():
            blocks.setdefault(key, []).append(tensor)
        for b, span, at in rows:
            item = batch[b]
            for layer, site in acts:
                records.append(
                    {
                        **item.item.key,
                        "prompt_id": item.id,
                        "span": span,
                        "layer": layer,
                        "site": site,
                        "shard": shard.as_posix(),
                        "row_start": start,
                        "row_stop": start + len(at),
                        "positions": at,
                        "n_tokens": len(item.input_ids),
                    }
                )
            start += len(at)
    tensors = {
        f"{site}.{layer}": torch.cat(parts).to(dtype) for (layer, site), parts in blocks.items()
    }
    for key, tensor in tensors.items():
        if not torch.isfinite(tensor).all():
            raise ProbekitError(
                f"activations at {key} overflow {config['dtype']}; capture with "
                "dtype=torch.bfloat16 or torch.float32"
            )
    atomic_write(
        out / shard, lambda tmp: save_file({k: v.contiguous() for k, v in tensors.items()}, tmp)
    )
    write_parquet(out / "index" / f"{name}.parquet", pd.DataFrame(records))
    return out / shard
