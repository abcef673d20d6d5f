"""The methods record beside a summary: `methods.md`, a paragraph per run that a paper can adapt,
and `provenance.json`, the same facts as data with the versions of the packages installed when
it was written. Both come from the runs' manifests (`probekit run` writes them for its runs,
`probekit report` for the set it reports), so a paper states the model and its weights, the
arithmetic and its measured error, ε, the data and its hash, the prompts and the exclusion rule,
the statistics, the seed and the code version as the run recorded them."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from probekit.engines.base import describe_precision
from probekit.reporting.headline import Headline, missing
from probekit.reporting.summary import describe_limit, describe_numerics, described
from probekit.stats.bootstrap import RESAMPLES

PACKAGES = (
    "probekit torch transformers transformer-lens nnsight numpy pandas scipy pyarrow matplotlib"
)
"""The packages whose installed versions `provenance.json` records."""
FACTS = (
    "study model model_source weights engine device dtype tier tolerance epsilon view "
    "data_origin data_sha256 prompts prompts_total min_valid_mass seed commit versions"
)
"""The manifest's fields that a methods record states as they are."""


def run_facts(manifest: Mapping[str, Any], data: str) -> dict[str, Any]:
    """What a methods section states about one run, from its manifest; `data`: the data as the
    study names it (`Study.describe_data`)."""
    return {
        **{name: manifest.get(name) for name in FACTS.split()},
        "precision": described(manifest, "precision", describe_precision),
        "numerics": described(manifest, "numerics", describe_numerics),
        "data": data,
        "limit": describe_limit(manifest),
        "resamples": manifest.get("resamples", RESAMPLES),
        "probekit": (manifest.get("versions") or {}).get("probekit"),
    }


def methods_paragraph(facts: Mapping[str, Any]) -> str:
    """One run's methods as a paragraph a paper can adapt; facts the run did not record are left
    out."""
    f = facts
    data = f["data"] if f["data_sha256"] is None else f"{f['data']} (SHA-256 {f['data_sha256']})"
    sentences = [
        f"We ran {f['study']} on the model {f['model']} (source {f['model_source']}, weights "
        f"{f['weights']}) with the {f['engine']} engine on {f['device']} in {f['dtype']}",
        f["precision"] or f"Arithmetic: tier {f['tier']} at tolerance {f['tolerance']}",
        f["numerics"],
        f"Answer probabilities are exact up to a pruning bound ε = {f['epsilon']}, read in the "
        f"{f['view']} view",
        f"Data: {data}",
        f"Prompts: {f['prompts']} of {f['prompts_total']}",
        f["limit"],
        None
        if f["min_valid_mass"] is None
        else f"A unit with a prompt whose valid mass is below {f['min_valid_mass']} is excluded",
        f"Bootstrap resamples: {f['resamples']}; seed {f['seed']}",
        f"Code: probekit {f['probekit']}, commit {f['commit']}",
    ]
    return ". ".join(s[0].upper() + s[1:] for s in sentences if s) + "."


def installed_versions() -> dict[str, str | None]:
    """The installed version of each of `PACKAGES` (None where not installed), and Python's."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES.split():
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def statistics(headlines: Sequence[Headline]) -> list[dict[str, Any]]:
    """How each headline number was made: its label, view, unit, interval and whether it has a
    p-value."""
    return [
        {
            "headline": h.label,
            "view": h.view,
            "unit": h.unit,
            "interval": h.interval,
            "p_value": not missing(h.p_value),
        }
        for h in headlines
    ]


def statistics_paragraph(stats: Sequence[Mapping[str, Any]]) -> str:
    """The headlines' intervals and tests as one paragraph (empty without headlines)."""
    parts = [
        f"{s['headline']} ({s['view']}{', ' + s['unit'] if s['unit'] else ''}): "
        f"{s['interval'] or 'no interval'}{', with a p-value' if s['p_value'] else ''}"
        for s in stats
    ]
    return ("Statistics: " + "; ".join(parts) + ".") if parts else ""


def write_methods(
    out: Path,
    title: str,
    manifests: Mapping[str, Mapping[str, Any]],
    data: Mapping[str, str],
    headlines: Sequence[Headline],
) -> None:
    """`methods.md` and `provenance.json` in `out` for the runs of `manifests` (run name ->
    manifest; `data`: each run's data as its study names it) and the statistics of `headlines`."""
    from probekit.core.io import write_text

    runs = {name: run_facts(manifest, data[name]) for name, manifest in manifests.items()}
    stats = statistics(headlines)
    parts = [f"# Methods: {title}"]
    for name, facts in runs.items():
        parts.append((f"## {name}\n\n" if len(runs) > 1 else "") + methods_paragraph(facts))
    parts.append(statistics_paragraph(stats))
    write_text(out / "methods.md", "\n\n".join(p for p in parts if p) + "\n")
    packages = installed_versions()
    record = {"title": title, "runs": runs, "statistics": stats, "packages": packages}
    write_text(out / "provenance.json", json.dumps(record, indent=1, default=str) + "\n")
