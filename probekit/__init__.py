"""probekit: exact logit-based bias probes for language models, and the hooks to explain them.

The public API, imported on first use (so that `import probekit` and the command line start
fast; torch and transformers load only when a model-facing name is touched).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_MODULES = {
    "probekit.engines.score": ("score",),
    "probekit.run.score": ("score_file",),
    "probekit.engines": ("load_engine",),
    "probekit.engines.options": ("ModelOptions",),
    "probekit.engines.hf.model": ("load_model", "LoadedModel"),
    "probekit.engines.plan": ("plan", "MemoryPlan"),
    "probekit.core.answers": ("AnswerSet", "AnswerKind"),
    "probekit.engines.hf.scorer": ("HFScorer",),
    "probekit.engines.base": ("ScoreResult",),
    "probekit.core.items": (
        "Item",
        "CharSpan",
        "EncodedItem",
        "encode_item",
        "fill_template",
        "Pair",
    ),
    "probekit.mechanism.api": ("patch", "capture", "make_pair", "recovery", "hookable"),
    "probekit.mechanism.steering": ("steer",),
    "probekit.run.patch": ("patch_study",),
    "probekit.run.steer": ("steer_study",),
    "probekit.run.capture": ("capture_study",),
    "probekit.mechanism.lens": ("lens",),
    "probekit.run.lens": ("lens_study",),
    "probekit.mechanism.capture": ("read_activations", "Activations"),
    "probekit.mechanism.readouts": ("Readout", "parse_readout"),
    "probekit.mechanism.patching": ("sweep",),
    "probekit.mechanism.components": ("Patch",),
    "probekit.run.study": ("run_study", "Run"),
    "probekit.reporting.headline": ("Headline",),
    "probekit.core.rundir": ("RunDir",),
    "probekit.run.report": ("report",),
    "probekit.run.loop": ("run_probe",),
    "probekit.studies.base": ("Probe", "Study", "get_study", "list_studies"),
    "probekit.stats": ("empathy_gap", "permutation_test", "bootstrap_ci", "bootstrap_mean"),
    "probekit.core.errors": ("ProbekitError",),
}
_API = {name: module for module, names in _MODULES.items() for name in names}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'probekit' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
