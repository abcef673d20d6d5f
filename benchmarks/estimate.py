"""How good a run's first estimate is: the time its first line says, against the time it takes.

Runs `probekit.run_study` on a machine with no pace recorded for it (the record is pointed at an
empty temporary file, so the estimate comes from the warm-up and one timed batch, as on a first
run), notes the seconds each "about ... on this device" line says, and times the scoring that
follows. The rule (docs/running.md): within 2x of the real time, on a busy machine too.

    python benchmarks/estimate.py                                   # the main job
    python benchmarks/estimate.py --category all --name all-categories
    python benchmarks/estimate.py --limit 96 --name "main job, first 96 prompts"
    python benchmarks/estimate.py --json benchmarks/results/estimate.json

Each run appends to the JSON's figures (estimate, real, their ratio), so both rows of the
issue's record sit in one file when the two commands above write to it one after the other.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import commit, load_line, write_results

import probekit
from probekit.run import loop, scoring
from probekit.run import study as study_run

UNITS = {"h": 3600.0, "min": 60.0, "s": 1.0}


def seconds_of(text: str) -> float:
    """`1 h 06 min` / `1 min 15 s` / `59 s` (`probekit.core.progress.duration`) in seconds."""
    return sum(float(n) * UNITS[u] for n, u in re.findall(r"(\d+) (h|min|s)\b", text))


def estimate_and_real(study: str, model: str, options: dict[str, Any]) -> dict[str, float]:
    """Run `study` once with no recorded pace: the first line's estimate and the real seconds
    from that line to the end of the run."""
    said: list[tuple[float, float]] = []  # (estimate, when said)

    def noted(line: str) -> str:
        found = re.search(r"about (.+?) on this device", line)
        if found and not said:
            said.append((seconds_of(found.group(1)), time.monotonic()))
        return line

    with tempfile.TemporaryDirectory() as tmp:
        scoring.record_path = lambda: Path(tmp) / "pace.json"  # no earlier run of this model
        forecast, forecast_runs = scoring.forecast, study_run.forecast_runs
        study_run.forecast_runs = lambda *a, **k: noted(forecast_runs(*a, **k))
        loop.forecast = lambda *a, **k: noted(forecast(*a, **k))  # a one-probe run's line
        probekit.run_study(study, model, out=Path(tmp) / "run", **options)
        ended = time.monotonic()
    estimate, started = said[0]
    return {"estimate_s": estimate, "real_s": ended - started}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="intergroup")
    parser.add_argument("--model", default="default")
    parser.add_argument("--category", default=None, help="the study's --category (default its)")
    parser.add_argument("--events", default=None, help="the study's --events (default its)")
    parser.add_argument("--limit", type=int, default=None, help="the run's --limit N")
    parser.add_argument("--name", default="main job", help="the row's name in the JSON")
    parser.add_argument("--json", type=Path, default=None, help="append the figures here")
    args = parser.parse_args(argv)
    given = {"category": args.category, "events": args.events, "limit": args.limit}
    options = {k: v for k, v in given.items() if v}
    start = load_line("at start")
    found = estimate_and_real(args.study, args.model, options)
    ratio = found["estimate_s"] / found["real_s"]
    print(
        f"{args.name}: estimated {found['estimate_s']:.0f} s, took {found['real_s']:.0f} s "
        f"(estimate / real {ratio:.2f}; the rule: between 0.5 and 2)"
    )
    if args.json:
        end = load_line("at end")
        figures = json.loads(args.json.read_text())["figures"] if args.json.exists() else []
        figures = [f for f in figures if f.get("run") != args.name]
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        series = f"{args.name}: {when}, commit {commit()}, load {start[0]:.1f} at start"
        series += f", {end[0]:.1f} at end"  # each run's own: the file's header has the last's
        rows = (("estimate", found["estimate_s"], "s"), ("real", found["real_s"], "s"))
        for what, value, unit in (*rows, ("estimate / real", ratio, "ratio")):
            figure = {"figure": f"{args.name}: {what}", "value": value, "unit": unit}
            figures.append(figure | {"series": series, "run": args.name, "options": options})
        on = {"device": "cpu", "threads": None, "load_start": start, "load_end": end}
        write_results("estimate", figures, path=args.json, **on)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
