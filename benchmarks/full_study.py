"""The paper's full grid, counted by probekit's own probes: the prompts of one model's run of the
intergroup study over every category and every prompt setting on every event of crowd-enVent
(`probekit run intergroup --category all --setting all --events all`).

    python benchmarks/full_study.py --json benchmarks/results/full_study.json  # $PROBEKIT_DATA

It builds the probes that run would build (the study's own `probes`, on the data root given or
found as the other benchmarks find it) and writes, per probe, its category, setting, answer set,
identities, events and prompts, and the total, without scoring anything. docs/performance.md's
"The full study" section (`benchmarks/report.py`) turns the count into GPU-hours per model with
the prompts/s the GPU runs measured.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import DATA_HELP, data_root, load_line, write_results

from probekit.run import runner
from probekit.studies.base import Context, get_study

GRID = {"category": "all", "setting": "all", "events": "all"}
"""The options of a run of the full grid (as `probekit run intergroup` takes them)."""


def grid_probes(data: str | None) -> tuple[list[Any], dict[str, Any]]:
    """The intergroup probes of the full grid on the data root `data` (None: probekit's own
    default), and the data's manifest fields (where it came from, its checksum)."""
    study = get_study("intergroup")
    options = runner("run").build({**GRID, "data": data}, "full_study.py", study)
    probes = study.probes(options.study, Context("run", options.own.seed, say=lambda *a, **k: None))
    data_fields = ("data_origin", "data_sha256", "data_verified")  # not its path: this machine's
    return probes, {key: probes[0].manifest().get(key) for key in data_fields}


def answers_spec(probe: Any) -> str:
    """The probe's numeric answer set as a spec (`0-100`)."""
    values = probe.answers.answers
    return f"{values[0]}-{values[-1]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, metavar="ROOT", help=DATA_HELP)
    parser.add_argument("--json", type=Path, default=None, help="also write the count here")
    args = parser.parse_args(argv)
    start = load_line("at start")
    probes, data = grid_probes(data_root(args.data))
    figures = [
        {
            "figure": f"{probe.category.name}, {probe.setting.name}: prompts",
            "value": len(probe),
            "unit": "prompts",
            "category": probe.category.name,
            "setting": probe.setting.name,
            "answers": answers_spec(probe),
            "identities": len(probe.identities),
            "events": len(probe.events),
            "series": "per category and prompt setting",
        }
        for probe in probes
    ]
    total = sum(len(probe) for probe in probes)
    figures.append(
        {
            "figure": "the full grid of one model: prompts",
            "value": total,
            "unit": "prompts",
            "probes": len(probes),
            "options": GRID,
            **data,
            "series": "the full grid",
        }
    )
    print(f"{len(probes)} probes, {total:,} prompts a model ({data['data_origin']} data)")
    if args.json:
        write_results(
            "full_study",
            figures,
            device="cpu",
            threads=None,
            load_start=start,
            load_end=load_line("at end"),
            path=args.json,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
