"""Capture residual-stream activations at named prompt spans, streamed to disk and resumable.

Sites are those of `probekit.mechanism.sites` (TransformerLens names, short forms accepted;
by default the four residual-width sites). They are read either through the TransformerBridge
hook points (`hooks="transformer_lens"`) or through nnsight on the Hugging Face modules
(`hooks="nnsight"`). The two agree bit for bit when both run the same attention kernel, and to
float rounding otherwise (the bridge's blocks run eager attention; the model's own use SDPA).

Only span positions are kept. Each shard of prompts is one safetensors file with a tensor per
full hook name (`blocks.3.hook_resid_pre`) of shape [rows, ...] and one index parquet under
`index/` with a row per (prompt, span, layer, site (`hook_resid_pre`)): `shard`, `row_start`,
`row_stop` (rows of that tensor),
`positions` (token positions in the unpadded prompt), `n_tokens`, `prompt_id` (the item id, as
in the run's scores table) and the item's key columns.

A capture folder is a `RunDir` run: `manifest.json` records what changes a number (the model,
its weights, dtype and device, the layers, sites, spans, hook library and storage dtype), and a
re-run with other settings is refused in one line naming the setting. Each index part is written
as finished work (`probekit.core.store`): atomically, with a checksum on every page, the settings
its rows were captured under and the SHA-256 of its shard; a re-run into the same folder skips
the prompt ids of the parts that verify, and sets aside (`*.damaged`, `*.mismatched`, one line
each) a part that is damaged, whose shard is missing or not the one written, or that was
captured under other settings (a manifest deleted and the folder captured again otherwise): its
prompts are captured again. Reading the TransformerLens hooks builds the model's bridge and
installs it for the read only (`model.bridged()`; see `probekit.engines.hf.model`).
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from probekit.core.errors import ProbekitError
from probekit.core.io import atomic_write
from probekit.core.items import PROMPT_ID, EncodedItem
from probekit.core.progress import progress
from probekit.core.public import public
from probekit.core.rundir import RESULTS_FORMAT, RowKey, RunDir, device_kind
from probekit.core.store import Damaged, read_table, take_rows, write_rows
from probekit.mechanism.interventions import read_forward
from probekit.mechanism.options import HookOptions
from probekit.mechanism.pairs import span_positions
from probekit.mechanism.sites import (
    DEFAULT_SITES,
    SITES,
    d_model,
    layer_indices,
    library,
    parse_hook,
    site,
)

STORAGE_DTYPE = torch.float16
"""The dtype shards store activations in unless `capture(storage_dtype=...)` says otherwise."""


@dataclass(frozen=True, repr=False)
class CaptureResult:
    """What one `capture` call did: the folder, the prompts captured now and those skipped (a
    finished shard's, on resuming), the shards written. Printed, it is one line."""

    out_dir: Path
    captured: int
    skipped: int
    shards: list[Path]

    def __repr__(self) -> str:
        return (
            f"CaptureResult({str(self.out_dir)!r}: {self.captured} prompts captured, "
            f"{self.skipped} already there, {len(self.shards)} shards written)"
        )


def check_request(
    model: Any, layers: Sequence[int], sites: Sequence[str], hooks: str
) -> tuple[list[int], list[str]]:
    """The layers (from 0) and the sites' short names in the order a block runs them; a
    ProbekitError for an empty or out-of-range layer list or an unknown site or hook library."""
    layers = layer_indices(model, layers)
    shorts = site_shorts(sites)
    library(hooks)
    return sorted(set(layers)), shorts


def site_shorts(sites: Sequence[str]) -> list[str]:
    """The sites' short names in the order a block runs them (one line for an unknown one)."""
    if isinstance(sites, str) or not sites:
        raise ProbekitError(f"give a list of sites to capture; choose from {', '.join(SITES)}")
    wanted = {site(name).name for name in sites}
    return [s.short for s in SITES.values() if s.name in wanted]


@public()
@dataclass(frozen=True, repr=False)
class Activations:
    """Captured activations in memory: `index` has a row per (prompt, span) with `prompt_id`,
    `span`, `positions` (unpadded), `n_tokens`, `row_start`, `row_stop` and the item's key
    columns; `tensors[hook]` (by full TransformerLens hook name, `blocks.3.hook_resid_pre`) is
    [rows, ...], rows `row_start:row_stop` being that prompt's span positions."""

    index: pd.DataFrame
    tensors: dict[str, torch.Tensor]

    def __repr__(self) -> str:
        """One line: the prompts and spans, each hook with its shape (not the values)."""
        prompts = self.index[PROMPT_ID].nunique() if PROMPT_ID in self.index else 0
        spans = sorted(self.index["span"].unique()) if "span" in self.index else []
        hooks = [f"{hook} {list(tensor.shape)}" for hook, tensor in self.tensors.items()]
        shown = ", ".join(hooks[:4]) + (f" and {len(hooks) - 4} more" if len(hooks) > 4 else "")
        return (
            f"Activations({prompts} prompts, spans {', '.join(spans) or 'none'}; {shown}; "
            ".index, .tensors, .at(hook, prompt_id, span))"
        )

    def __getitem__(self, hook: str) -> torch.Tensor:
        if hook not in self.tensors:
            raise ProbekitError(f"nothing captured at {hook!r}; have {', '.join(self.tensors)}")
        return self.tensors[hook]

    def at(self, hook: str, prompt_id: str, span: str) -> torch.Tensor:
        """The [positions, ...] values of one prompt's span at `hook`."""
        hit = self.index[(self.index[PROMPT_ID] == prompt_id) & (self.index["span"] == span)]
        if hit.empty:
            raise ProbekitError(f"nothing captured for prompt {prompt_id!r}, span {span!r}")
        return self[hook][int(hit["row_start"].iloc[0]) : int(hit["row_stop"].iloc[0])]


@public(HookOptions, command="capture", skip=("layers",))
def read_spans(
    model: Any,
    items: Sequence[EncodedItem],
    layers: Sequence[int],
    sites: Sequence[str] = DEFAULT_SITES,
    spans: Sequence[str] | None = None,
    hooks: str = "transformer_lens",
    batch_size: int = 8,
) -> Activations:
    """The float32 values at `sites` and `layers` of every prompt's `spans` (all if None), in
    memory: `capture` without writing anything. Each left-padded batch of `batch_size` prompts
    is one forward that stops after the last layer read; the progress is the prompts'
    (`probekit.core.progress`)."""
    layers, shorts = check_request(model, layers, sites, hooks)
    names = [site(short).hook(layer) for layer in layers for short in shorts]
    rows: list[tuple[EncodedItem, str, list[int]]] = []
    values: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    with progress(len(items), "prompt", "capture") as bar:
        for i in range(0, len(items), batch_size):
            batch = list(items[i : i + batch_size])
            found = [
                (b, span, span_positions(prompt, span))
                for b, prompt in enumerate(batch)
                for span in (prompt.positions if spans is None else spans)
            ]
            locs = [(b, p) for b, _, at in found for p in at]
            ids = [p.input_ids for p in batch]
            read = read_forward(model, ids, dict.fromkeys(names, locs), hooks)
            for name in names:
                values[name].append(read[name].float())
            rows += [(batch[b], span, at) for b, span, at in found]
            bar.update(len(batch))
    stops = itertools.accumulate(len(at) for *_, at in rows)
    records = [
        {**item.item.key, PROMPT_ID: item.id, "span": span, "positions": at}
        | {"n_tokens": len(item.input_ids), "row_start": stop - len(at), "row_stop": stop}
        for (item, span, at), stop in zip(rows, stops, strict=True)
    ]
    return Activations(pd.DataFrame(records), {k: torch.cat(v) for k, v in values.items()})


@public(HookOptions, command="capture", skip=("layers",))
def capture(
    model: Any,
    items: Iterable[EncodedItem],
    out_dir: str | Path,
    layers: Sequence[int],
    sites: Sequence[str] = DEFAULT_SITES,
    spans: Sequence[str] | None = None,
    hooks: str = "transformer_lens",
    batch_size: int = 8,
    prompts_per_shard: int = 256,
    storage_dtype: torch.dtype = STORAGE_DTYPE,
) -> CaptureResult:
    """Capture `sites` at `layers` for the `spans` of each prompt (all if None) into `out_dir`.

    Items are consumed lazily and written a shard at a time, so an interrupted run keeps every
    finished shard; running again with the same settings skips prompt ids already captured (and
    repeated ids). `storage_dtype` is the dtype the shards store (float16 by default; float32
    for exact checks).
    """
    layers, shorts = check_request(model, layers, sites, hooks)
    if batch_size < 1 or prompts_per_shard < 1:
        raise ProbekitError("batch_size and prompts_per_shard must be at least 1")
    out = Path(out_dir)
    storage = str(storage_dtype).removeprefix("torch.")
    run = RunDir(out)
    run.start(capture_manifest(model, layers, shorts, spans, hooks, storage))  # or check it
    for folder in ("shards", "index"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    config = run.manifest
    seen = scan_capture(out, config)
    numbers = [int(p.stem.split("-")[1]) for p in (out / "index").glob("shard-*.parquet")]
    already, skipped, written, pending = len(seen), 0, [], []

    def write_shard() -> None:
        """Capture the pending items; write their tensors, then the index part committing them."""
        name = f"shard-{max(numbers, default=-1) + 1 + len(written):05d}"
        shard = Path("shards") / f"{name}.safetensors"
        acts = read_spans(model, pending, layers, shorts, spans, hooks, batch_size)
        records = [
            {**record, "layer": layer, "site": hook_site.name, "shard": shard.as_posix()}
            for record in acts.index.to_dict("records")
            for layer, hook_site in map(parse_hook, acts.tensors)
        ]
        tensors = {k: v.to(storage_dtype).contiguous() for k, v in acts.tensors.items()}
        for hook, tensor in tensors.items():
            if not torch.isfinite(tensor).all():
                raise ProbekitError(
                    f"activations at {hook} overflow {storage}; capture with "
                    "storage_dtype=torch.bfloat16 or torch.float32"
                )
        atomic_write(out / shard, functools.partial(save_file, tensors))
        key, index = RowKey.of(config, None, "captured"), out / "index" / f"{name}.parquet"
        write_rows(index, pd.DataFrame(records), key, commits=out / shard)
        written.append(out / shard)

    for item in items:
        if item.id in seen:
            skipped += 1
            continue
        seen.add(item.id)
        pending.append(item)
        if len(pending) >= prompts_per_shard:
            write_shard()
            pending.clear()
    if pending:
        write_shard()
    captured = len(seen) - already
    return CaptureResult(out, captured, skipped, written)


@public()
def read_activations(out_dir: str | Path, prompt_ids: Iterable[str] | None = None) -> Activations:
    """Everything captured in `out_dir` (or the prompts `prompt_ids` only: a folder may hold
    others) as `Activations` (in the stored dtype), shard by shard in the order written."""
    out = Path(out_dir)
    index = read_index(out)
    if prompt_ids is not None:
        index = index[index[PROMPT_ID].isin(set(prompt_ids))]
    if index.empty:
        raise ProbekitError(f"nothing captured in {out}")
    records, parts = [], {}
    for shard, rows in index.groupby("shard", sort=True):
        first = rows.drop_duplicates([PROMPT_ID, "span"]).sort_values("row_start")
        spans = list(zip(first["row_start"], first["row_stop"], strict=True))
        with safe_open(out / shard, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has keys(), no iteration)
                values = f.get_tensor(name)
                parts.setdefault(name, []).extend(values[a:b] for a, b in spans)
        records.append(first.drop(columns=["layer", "site", "shard"]))
    index = pd.concat(records, ignore_index=True)
    stops = (index["row_stop"] - index["row_start"]).cumsum()
    index = index.assign(row_start=stops.shift(fill_value=0), row_stop=stops)
    index["positions"] = [[int(p) for p in at] for at in index["positions"]]
    return Activations(index, {k: torch.cat(v) for k, v in parts.items()})


def read_index(out_dir: str | Path) -> pd.DataFrame:
    """The index of everything captured in `out_dir` (empty if nothing is)."""
    parts = sorted((Path(out_dir) / "index").glob("shard-*.parquet"))
    if not parts:
        return pd.DataFrame(columns=["prompt_id", "span", "layer", "site", "shard"])
    frames = []
    for part in parts:
        try:
            frames.append(read_table(part).to_pandas())
        except Damaged as damaged:
            raise ProbekitError(
                f"{part} {damaged.describe()}; run the same capture again to set it aside and "
                "capture its prompts anew"
            ) from None
    return pd.concat(frames, ignore_index=True)


def capture_manifest(
    model: Any,
    layers: Sequence[int] | None,
    sites: Sequence[str],
    spans: Sequence[str] | None,
    hooks: str,
    storage: str,
) -> dict[str, Any]:
    """What defines a capture (its manifest; `probekit.core.rundir.RECORDED_ONLY` says which
    fields are resume keys); with `model` None (before it loads) the fields it gives, and
    `layers` when they need it, are None."""
    described = model.describe() if model is not None else {}
    manifest = {
        "results_format": RESULTS_FORMAT,
        **{field: described.get(field) for field in ("model", "weights", "dtype")},
        "device": device_kind(described.get("device")),
        "d_model": d_model(model) if model is not None else None,
        "layers": None if layers is None else list(layers),
        "sites": list(sites),
        "spans": None if spans is None else list(spans),
        "hooks": hooks,
        "storage_dtype": storage,
    }
    return json.loads(json.dumps(manifest, default=str))  # as it reads back from the file


def scan_capture(out: Path, manifest: dict[str, Any]) -> set[str]:
    """The prompt ids of the index parts that verify (`probekit.core.store`: page checksums,
    their shard's SHA-256, the settings they were captured under); the others are set aside
    with their shards, one line each."""
    key = RowKey.of(manifest, None, "captured")  # a capture folder grows with its items
    seen: set[str] = set()
    for part in sorted((out / "index").glob("shard-*.parquet")):
        shard = out / "shards" / f"{part.stem}.safetensors"
        found = take_rows(part, key, "its prompts are captured again", commits=shard)
        if found is not None:
            seen.update(found.ids)
    return seen
