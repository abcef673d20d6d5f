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
    "score": "probekit.engines.score",
    "score_file": "probekit.run.score",
    "load_engine": "probekit.engines",
    "ModelOptions": "probekit.engines.options",
    "load_model": "probekit.engines.hf.model",
    "plan": "probekit.engines.plan",
    "MemoryPlan": "probekit.engines.plan",
    "LoadedModel": "probekit.engines.hf.model",
    "AnswerSet": "probekit.core.answers",
    "AnswerKind": "probekit.core.answers",
    "HFScorer": "probekit.engines.hf.scorer",
    "ScoreResult": "probekit.engines.base",
    # prompts
    "Item": "probekit.core.items",
    "CharSpan": "probekit.core.items",
    "EncodedItem": "probekit.core.items",
    "encode_item": "probekit.core.items",
    "fill_template": "probekit.core.items",
    "Pair": "probekit.core.items",
    # mechanism
    "patch": "probekit.mechanism.api",
    "capture": "probekit.mechanism.api",
    "steer": "probekit.mechanism.steering",
    "make_pair": "probekit.mechanism.api",
    "recovery": "probekit.mechanism.api",
    "hookable": "probekit.mechanism.api",
    "patch_study": "probekit.run.patch",
    "steer_study": "probekit.run.steer",
    "capture_study": "probekit.run.capture",
    "lens": "probekit.mechanism.lens",
    "lens_study": "probekit.run.lens",
    "read_activations": "probekit.mechanism.capture",
    "Activations": "probekit.mechanism.capture",
    "Readout": "probekit.mechanism.readouts",
    "parse_readout": "probekit.mechanism.readouts",
    "sweep": "probekit.mechanism.patching",
    "Patch": "probekit.mechanism.components",
    # studies and runs
    "run_study": "probekit.run.study",
    "Run": "probekit.run.study",
    "Headline": "probekit.reporting.headline",
    "RunDir": "probekit.core.rundir",
    "report": "probekit.run.report",
    "run_probe": "probekit.run.loop",
    "Probe": "probekit.studies.base",
    "Study": "probekit.studies.base",
    "get_study": "probekit.studies.base",
    "list_studies": "probekit.studies.base",
    # statistics
    "empathy_gap": "probekit.stats",
    "permutation_test": "probekit.stats",
    "bootstrap_ci": "probekit.stats",
    "bootstrap_mean": "probekit.stats",
    "ProbekitError": "probekit.core.errors",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'probekit' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
