"""probekit: exact logit-based bias probes for language models, and the hooks to explain them.

The public API, imported on first use (so that `import probekit` and the command line start
fast; torch and transformers load only when a model-facing name is touched).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    # scoring
    "score": "probekit.api",
    "load_engine": "probekit.engines",
    "load_model": "probekit.engines.hf.model",
    "LoadedModel": "probekit.engines.hf.model",
    "AnswerSet": "probekit.answers",
    "Scorer": "probekit.engines.hf.scorer",
    "ScoreResult": "probekit.engines.base",
    # prompts
    "Item": "probekit.items",
    "CharSpan": "probekit.items",
    "EncodedItem": "probekit.items",
    "encode_item": "probekit.items",
    "fill_template": "probekit.items",
    "Pair": "probekit.items",
    # mechanism
    "patch": "probekit.mechanism.api",
    "capture": "probekit.mechanism.api",
    "make_pair": "probekit.mechanism.api",
    "hookable": "probekit.mechanism.api",
    "read_activations": "probekit.mechanism.capture",
    "Activations": "probekit.mechanism.capture",
    "Readout": "probekit.scoring.readouts",
    "parse_readout": "probekit.scoring.readouts",
    "sweep": "probekit.mechanism.patching",
    "Patch": "probekit.mechanism.components",
    # studies and runs
    "run_probe": "probekit.run",
    "Probe": "probekit.studies.base",
    "Study": "probekit.studies.base",
    "get_study": "probekit.studies.base",
    "list_studies": "probekit.studies.base",
    # statistics
    "empathy_gap": "probekit.stats",
    "permutation_test": "probekit.stats",
    "bootstrap_ci": "probekit.stats",
    "ProbekitError": "probekit.errors",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'probekit' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
