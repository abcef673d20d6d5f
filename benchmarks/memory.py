"""Benchmark: peak resident memory of exact scoring, N prompts against 10 x N.

Each size runs in a fresh process that loads the model, warms it up, notes its RSS, resets the
kernel's peak counter (so that loading's own peak is not counted: Linux), then scores the first
prompts of the intergroup study (religion, P0S0T0 by default: answers 0-100) with
`Scorer.score`. Printed per size: RSS after loading, peak RSS, and the peak above the loaded
model (what scoring itself holds). Target: the peak of 10 x N prompts is less than 10 % above
the peak of N (the scorer keeps a bounded window, not every prompt's state); N is at least
the batch size, so that both sizes run full batches.

    python benchmarks/memory.py                 # N = 16 and 160
    python benchmarks/memory.py --prompts 32    # N = 32 and 320

`--json PATH` also writes the figures (`common.write_results`), for the performance page
(`benchmarks/results/memory.json`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from common import Target, load_line, print_targets, write_results
from scoring import SETTING, build_prompts, load_events

from probekit.core.answers import AnswerSet
from probekit.datasets.crowd_envent import sample_events
from probekit.engines import load_engine
from probekit.studies.intergroup import get_setting

MAX_GROWTH = 0.10
EVENTS_PER_EMOTION = 4  # 48 events x 36 pairs = 1,728 prompts, enough for 10 x N


def status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS: now, VmHWM: the peak), MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise SystemExit(f"no {field} in /proc/self/status: this benchmark needs Linux")


def reset_peak() -> None:
    """Start the peak (VmHWM) again from the current RSS, so that loading's peak is not counted."""
    Path("/proc/self/clear_refs").write_text("5")


def child(n: int, setting: str, data: str | None, batch_size: int) -> None:
    """Score `n` prompts and print one JSON line of memory figures."""
    events, _ = load_events(data)
    events = sample_events(events, EVENTS_PER_EMOTION, 0)
    model = load_engine("default")
    ids = build_prompts(model, events, n, setting)
    scorer = model.scorer(AnswerSet.range(0, get_setting(setting).scale_max), batch_size=batch_size)
    list(scorer.score(ids[:2]))  # warm-up, so that one-off allocations count as loading
    loaded = status_mib("VmRSS")
    reset_peak()
    results = list(scorer.score(ids))
    longest = max(len(p) for p in ids)
    print(
        json.dumps(
            {
                "prompts": len(results),
                "longest": longest,
                "loaded": loaded,
                "peak": status_mib("VmHWM"),
            }
        )
    )


def measure(n: int, args: argparse.Namespace) -> dict[str, float]:
    command = [
        sys.executable,
        __file__,
        "--child",
        str(n),
        "--setting",
        args.setting,
        "--batch-size",
        str(args.batch_size),
    ]
    if args.data:
        command += ["--data", args.data]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/memory.py",
        description=f"Peak RSS of scoring N vs 10 x N prompts; target growth < {MAX_GROWTH:.0%}.",
    )
    parser.add_argument("--prompts", type=int, default=16, metavar="N", help="N (default: 16)")
    parser.add_argument("--setting", default=SETTING, help=f"intergroup setting ({SETTING})")
    parser.add_argument("--data", default=None, metavar="ROOT", help="crowd-enVent data root")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=16,
        metavar="B",
        help="the scorer's batch size (default: 16, its CPU default); N must be at least B, so "
        "that both sizes run full batches",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child, args.setting, args.data, args.batch_size)
        return 0
    if args.batch_size < 1 or args.prompts < args.batch_size:
        parser.error("--batch-size must be >= 1 and --prompts at least the batch size")
    load_start = load_line("at start")
    print(
        f"torch threads {torch.get_num_threads()}; intergroup religion {args.setting}; batch "
        f"size {args.batch_size}"
    )
    rows = [measure(n, args) for n in (args.prompts, 10 * args.prompts)]
    for row in rows:
        print(
            f"{row['prompts']:>5} prompts (longest {row['longest']} tokens): RSS after loading "
            f"{row['loaded']:8.1f} MiB, peak {row['peak']:8.1f} MiB, above the loaded model "
            f"{row['peak'] - row['loaded']:7.1f} MiB"
        )
    small, large = rows
    growth = large["peak"] / small["peak"] - 1
    target = Target(f"peak(10N) / peak(N) - 1 < {MAX_GROWTH:.0%}", growth, MAX_GROWTH, False)
    print_targets([target], "target:")
    load_end = load_line("at end")
    if args.json is not None:
        figures = [
            {
                "figure": f"{row['prompts']} prompts (longest {row['longest']} tokens): {what}",
                "value": value,
                "unit": "MiB",
                **row,
            }
            for row in rows
            for what, value in (
                ("peak RSS", row["peak"]),
                ("peak above the loaded model", row["peak"] - row["loaded"]),
            )
        ]
        figures.append(
            {"figure": target.name, "value": growth, "unit": "", "verdict": target.verdict}
        )
        write_results(
            "memory",
            figures,
            device="cpu",
            threads=torch.get_num_threads(),
            load_start=load_start,
            load_end=load_end,
            argv=[__file__, *(sys.argv[1:] if argv is None else argv)],
            path=args.json,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
