"""Model shapes: the sizes of a model the memory plan needs (`Shape`), read from its config alone.
The model is built on PyTorch's `meta` device (shapes, no memory) to count its parameters and
name its modules; no weights are read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probekit.core.errors import ProbekitError


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


def meta_model(model: str) -> tuple[Any, str]:
    """`model` built on the meta device, and the name the plan gives it. `model`: `default`, a
    `.gguf` file already converted, a model folder (or hub-style folder) with config.json, a
    config.json path, or a hub id in the local Hugging Face cache."""
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
    return hf, name


def parameter_count(spec: str) -> int | None:
    """Weights of model `spec` (as `load_model` takes it) without loading them: a GGUF's tensor
    shapes, else the config's model built on the meta device; None when neither can be read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from probekit.engines.hf.gguf import converted_cache_dir, default_gguf_path

    try:
        path = default_gguf_path() if spec == "default" else Path(spec).expanduser()
        if path.suffix == ".gguf":
            converted = converted_cache_dir(path)  # after the first load; else read the GGUF
            if not (converted / "config.json").is_file():
                from gguf import GGUFReader

                return sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors)
            spec = str(converted)
        config = AutoConfig.from_pretrained(spec)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError, ImportError, ProbekitError):
        return None
    return sum(p.numel() for p in model.parameters())


def shape_of(hf: Any, name: str) -> Shape:
    """The shape of a transformers model (on any device, the meta device included)."""
    return Shape.of(hf.config, name, sum(p.numel() for p in hf.parameters()))


def read_shape(model: str) -> Shape:
    """The shape of `model` (as `meta_model` takes it); no weights are read."""
    return shape_of(*meta_model(model))
