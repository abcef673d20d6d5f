"""The sections of `summary.md` that every study shares, read from the run folders alone: which
runs are partial (`## Partial run`, a manifest `limit` below the prompts of the study's
configuration) or too small for an interval (`## No interval`, a manifest `interval_note`),
each run's arithmetic and numeric noise (`## Numerics`, from its manifest's `precision` and
`numerics`: the tier picked, its measured error and what was tried) and a weak-signal line for a
run whose mean valid mass is below `WEAK_SIGNAL_VALID_MASS` (`## Signal`). `probekit run` and
`probekit report` write them the same way (`Study.write_summary`), so a re-report keeps them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from probekit.core.options import given
from probekit.core.rundir import RunDir
from probekit.core.signal import weak_signal
from probekit.engines.base import describe_precision
from probekit.reporting.headline import INTERVAL_NOTE

SAMPLE_LINE = (
    "**SAMPLE DATA, not the study's data set.** The rows whose `data` says \"probekit's own "
    'sample" read records written for probekit to try the study end to end: their numbers '
    "describe the model on those few records and say nothing about the paper's results."
)
"""The first line of a `summary.md` that holds a run on probekit's sample data."""

NO_INTERVAL = (
    "too few units for the interval of the study's headline, so its interval cells are empty; "
    "the numbers are those units' alone (a first try, not a result)"
)
"""What `summary.md` says of a run whose manifest has an `interval_note`."""


def run_sections(runs: Sequence[Path], out: Path) -> str:
    """The Markdown sections about `runs` (folders), each named relative to `out`; empty when
    there is nothing to say."""
    numerics, signal, partial, interval = [], [], [], []
    for folder in runs:
        manifest = RunDir(folder).read_manifest() or {}
        where = run_name(folder, out)
        if line := describe_limit(manifest):
            partial.append(f"- {where}: {line}")
        if manifest.get(INTERVAL_NOTE):
            interval.append(f"- {where}: {manifest[INTERVAL_NOTE]}: {NO_INTERVAL}")
        precision = manifest.get("precision")
        if isinstance(precision, dict) and "tier" in precision:
            numerics.append(f"- {where}: {described(manifest, 'precision', describe_precision)}")
        if line := described(manifest, "numerics", describe_numerics):
            numerics.append(f"- {where}: {line}")
        if line := weak_signal(mean_valid_mass(folder)):
            signal.append(f"- {where}: {line}")
    sections = {"Partial run": partial, "No interval": interval, "Signal": signal}
    sections["Numerics"] = numerics
    return "\n\n".join(
        f"## {title}\n\n" + "\n".join(lines) for title, lines in sections.items() if lines
    )


def describe_limit(manifest: Mapping[str, Any]) -> str | None:
    """One line saying that a run scored some of its units only (`--limit`; the probe's
    `limit` field names them); None for a whole run."""
    done, total = manifest.get("prompts"), manifest.get("prompts_total")
    if manifest.get("limit") is None or done == total:
        return None
    kept = manifest["probe"]["limit"]
    unit, groups = kept["unit_name"], kept["groups"]
    name = kept["group_name"] or "unit"
    turn = f", taken in turn from its {groups} {name} groups" if groups > 1 else ""
    return (
        f"PARTIAL RUN ({given('limit', manifest['limit'])}): {done} of {total} prompts, all those "
        f"of {len(kept['units'])} of the {kept['units_total']} {unit}s{turn}; its figures "
        f"describe those {unit}s only"
    )


def described(
    manifest: Mapping[str, Any], key: str, describe: Callable[[dict[str, Any]], str]
) -> str | None:
    """`describe` of the manifest's record `key` (None where it holds none); one line saying so
    where the record holds other fields or types than probekit writes (an edited manifest), not
    a traceback."""
    record = manifest.get(key)
    if not isinstance(record, dict):
        return None
    try:
        return describe(record)
    except (KeyError, TypeError, ValueError, AttributeError):
        return f"{key}: not as probekit records it ({json.dumps(record, default=str)})"


def describe_numerics(figure: dict[str, Any]) -> str:
    """One line about a run's noise figure (`manifest["numerics"]`): the dtype, the reference
    and the largest differences, or why there are none."""
    if "max_abs_diff" not in figure:
        note = figure.get("note", "not measured")
        return f"numerics: scored in {figure.get('dtype')}; noise {note}"
    what = "expected value" if figure["score"] == "expected" else "answer probability"
    changes = figure["most_probable_changes"]
    return (
        f"numerics: scored in {figure['dtype']} on {figure['device']}; against "
        f"{figure['reference_dtype']} on {figure['sample']} seeded prompts the {what} moves by "
        f"at most {figure['max_abs_diff']:.2g}, the valid mass by "
        f"{figure['max_valid_mass_rel_diff']:.2g} (relative); "
        f"{changes} most probable answer(s) change"
    )


def mean_valid_mass(folder: Path) -> float | None:
    """The mean valid mass of the run's `scores.parquet` (None without one or its column)."""
    path = RunDir(folder).scores_path
    if not path.is_file():
        return None
    import pyarrow.parquet as pq

    if "valid_mass" not in pq.ParquetFile(path).schema_arrow.names:
        return None
    column = pq.read_table(path, columns=["valid_mass"]).column("valid_mass").to_pandas()
    return float(column.mean()) if len(column) else None


def run_name(folder: Path, out: Path) -> str:
    """A run folder as `summary.md` names it: relative to `out` (`run` for `out` itself), else
    its path."""
    try:
        rel = Path(folder).resolve().relative_to(Path(out).resolve()).as_posix()
    except ValueError:
        return os.fspath(folder)
    return "run" if rel == "." else rel
