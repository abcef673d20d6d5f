"""Benchmark: wall time of the generic statistics in `probekit.stats`.

Prints the time of

  (a) a structured permutation test (10,000 permutations) on a nationality-sized 21x21 matrix,
  (b) a bootstrap interval (1,000 resamples) over 300 units of 36 prompts each, the statistic
      being the in-group minus out-group mean of a score column (`grouped_means`).

This is a benchmark, not a test: it asserts nothing about time and exits 0. Timings on a shared
machine are distorted by other processes; the load average is printed at start and end.

    python benchmarks/stats.py
    python benchmarks/stats.py --permutations 2000 --resamples 200 --units 100

The figures go to benchmarks/results/stats.json (`--json PATH`: elsewhere), from which
`python benchmarks/report.py` writes docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from common import RESULTS, load_line, shared_options, write_results

from probekit.stats import bootstrap_ci, grouped_means, permutation_test

GROUPS_PER_UNIT = 6  # 6 x 6 perceiver-experiencer pairs per unit, as religion with `a person`


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--groups", type=int, default=21, help="matrix size of the test (a)")
    parser.add_argument("--permutations", type=int, default=10000, help="permutations in (a)")
    parser.add_argument("--units", type=int, default=300, help="units resampled in (b)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples in (b)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each; best is shown")
    shared_options(parser, "seed")
    parser.add_argument(
        "--json",
        type=Path,
        default=RESULTS / "stats.json",
        metavar="PATH",
        help="where the figures go (default: benchmarks/results/stats.json)",
    )
    return parser.parse_args(argv)


def best_time(run: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` wall times of `run()`, in seconds (least disturbed by others)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def unit_table(n_units: int, seed: int) -> pd.DataFrame:
    """One row per (unit, perceiver, experiencer) with a random score and the in-group flag."""
    rng = np.random.default_rng(seed)
    k = GROUPS_PER_UNIT
    unit, perceiver, experiencer = np.meshgrid(
        np.arange(n_units), np.arange(k), np.arange(k), indexing="ij"
    )
    return pd.DataFrame(
        {
            "event_id": [f"e{u}" for u in unit.ravel()],
            "in_group": (perceiver == experiencer).ravel(),
            "expected": rng.uniform(0, 100, size=unit.size),
        }
    )


def in_group_gap(df: pd.DataFrame) -> float:
    """Mean score of in-group rows minus that of out-group rows."""
    means = grouped_means(df, ["in_group"], "expected").set_index("in_group")["expected"]
    return float(means[True] - means[False])


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = load_line("at start")
    Z = np.random.default_rng(args.seed).normal(size=(args.groups, args.groups))
    labels = [str(i) for i in range(args.groups)]
    seconds = best_time(
        lambda: permutation_test(Z, labels, n=args.permutations, seed=args.seed), args.repeats
    )
    what = f"permutation test, {args.groups}x{args.groups} matrix, {args.permutations} permutations"
    print(f"(a) {what}: {seconds:.3f} s")
    figures = [{"figure": what, "value": round(seconds, 4), "unit": "s (best of repeats)"}]
    table = unit_table(args.units, args.seed)
    seconds = best_time(
        lambda: bootstrap_ci(table, "event_id", in_group_gap, n=args.resamples, seed=args.seed),
        args.repeats,
    )
    what = f"bootstrap, {args.units} units x {GROUPS_PER_UNIT**2} rows, {args.resamples} resamples"
    print(f"(b) {what}: {seconds:.3f} s")
    figures.append({"figure": what, "value": round(seconds, 4), "unit": "s (best of repeats)"})
    end = load_line("at end")
    write_results(
        "stats",
        figures,
        device="cpu",
        threads=None,
        load_start=start,
        load_end=end,
        argv=[__file__, *(sys.argv[1:] if argv is None else argv)],
        path=args.json,
    )


if __name__ == "__main__":
    main()
