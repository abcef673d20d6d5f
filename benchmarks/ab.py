"""Benchmark: this commit against an earlier one (A/B), scoring, patching and the lens, one run.

Each commit is checked out in a temporary `git worktree` and timed by its own benchmark helpers
(`benchmarks/scoring.py`, `patching.py`, `lens.py`, whose timed functions both commits share), in a
fresh process per measurement, the model's load untimed, one torch thread. The rounds alternate the
commits (A B, then B A, ...) so that a change in the machine's load falls on both alike. What is
timed, on the default model:

  scoring    `Scorer.score` of the first `--prompts` intergroup prompts (religion, P0S0T0, the
             answers 0-100 at the default epsilon), the `benchmarks/scoring.py` (a) run;
  patching   `probekit.mechanism.patching.sweep` of every layer at `hook_resid_pre` and at
             `hook_mlp_out` on the README's persona pair (0-10), the `benchmarks/patching.py` run;
  lens       `probekit.mechanism.lens.logit_lens` at every layer on the first `--prompts` prompts
             of P0S1T0 (0-10), and the scoring run it rides on (`benchmarks/lens.py`).

It prints each method's wall and CPU seconds at both commits, and the ratio of their CPU seconds,
this commit's over the base's (target: at most `TARGET`, the timing noise of one run on a shared
machine): the process's CPU time, one thread, is what the code costs, which the machine's other
work changes far less than the wall time; the rounds keep each method's least CPU time. `--json`
writes them for docs/performance.md (`benchmarks/report.py`). A benchmark, not a test: it exits 0
whatever the numbers are.

    python benchmarks/ab.py --base 2553d76 --json benchmarks/results/ab.json
    python benchmarks/ab.py --base 2553d76 --rounds 1 --prompts 8      # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import load_line, write_results

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.05
TASKS = ("scoring", "patching", "lens")

# Run in each commit's tree, with its benchmarks/ on the path: the same text for both commits.
DRIVER = """
import json, sys, torch
torch.set_num_threads(1)
task, n = sys.argv[1], int(sys.argv[2])
from common import timed, warm_up, first_prompts
from probekit.engines import load_engine
model = load_engine("default")
out = {}
if task == "scoring":
    import scoring
    from probekit.core.answers import AnswerSet
    events, _ = scoring.load_events(None)
    ids = scoring.build_prompts(model, scoring.sample_events(events, 2, 0), n, "P0S0T0")
    scorer = model.scorer(AnswerSet.range(0, 100))
    warm_up(model, ids[0][:8])
    _, *out["score 0-100"] = timed(model.device, lambda: list(scorer.score(ids)))
elif task == "patching":
    import patching
    peer = patching.Peer.of(model)
    layers = list(range(model.n_layers))
    warm_up(model, peer.clean_ids)
    for name in ("hook_resid_pre", "hook_mlp_out"):
        run = lambda name=name: patching.run_probekit(peer, name, layers, None)
        _, *out[f"sweep {name}"] = timed(model.device, run)
elif task == "lens":
    import lens
    root = lens.data_root(None) or str(lens.SAMPLE_ROOT)
    events = lens.first_events(root, n // 36 + 1, seed=0)
    setting = lens.get_setting("P0S1T0")
    probe = lens.IntergroupProbe(lens.get_category("religion"), setting, events)
    prompts = first_prompts(model, probe, n)
    scorer = model.scorer(probe.answers, epsilon=0.0, batch_size=8)
    layers = list(range(model.n_layers))
    warm_up(model, prompts[0])
    _, *out["score 0-10"] = timed(model.device, lambda: list(scorer.score(prompts)))
    run = lambda: lens.logit_lens(scorer, prompts, layers, 8)
    _, *out["logit lens, every layer"] = timed(model.device, run)
print("AB " + json.dumps(out))
"""


def resolve(commit: str) -> str:
    """`commit`'s short hash."""
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def checkout(commit: str, where: Path) -> Path:
    """`commit` in a detached worktree at `where`."""
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), commit],
        check=True,
        capture_output=True,
    )
    return where


def measure(tree: Path, task: str, prompts: int) -> dict[str, list[float]]:
    """One fresh process in `tree` timing `task`: {method: [wall seconds, CPU seconds]}."""
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, task, str(prompts)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": f"{tree}:{tree / 'benchmarks'}"},
        capture_output=True,
        text=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("AB ")]
    if done.returncode or not lines:
        raise SystemExit(f"{task} at {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][3:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the earlier commit (A)")
    parser.add_argument("--head", default="HEAD", help="the commit measured against it (B)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--prompts", type=int, default=16, help="scoring and lens prompts")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default all)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    args.base, args.head = (resolve(args.base), resolve(args.head))
    tasks = args.tasks.split(",")
    if unknown := set(tasks) - set(TASKS):
        parser.error(f"unknown task(s) {sorted(unknown)}; choose from {', '.join(TASKS)}")
    start = load_line("at start")
    best: dict[str, dict[str, list[float]]] = {"base": {}, "head": {}}  # [wall, cpu], best cpu
    with tempfile.TemporaryDirectory() as tmp:
        trees = {side: checkout(getattr(args, side), Path(tmp) / side) for side in best}
        try:
            for round_ in range(args.rounds):
                order = ("base", "head") if round_ % 2 == 0 else ("head", "base")
                for task in tasks:
                    for side in order:
                        for method, took in measure(trees[side], task, args.prompts).items():
                            kept = best[side].setdefault(method, took)
                            best[side][method] = min(kept, took, key=lambda t: t[1])
                            wall, cpu = took
                            print(
                                f"round {round_ + 1} {side:<4} {method:<24} {wall:7.2f} s, "
                                f"CPU {cpu:7.2f} s"
                            )
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)])
    end = load_line("at end")
    figures = []
    print(f"\n{'method':<24} {'base CPU s':>10} {'head CPU s':>10} {'head/base':>9}")
    for method, (_, base) in best["base"].items():
        head = best["head"][method][1]
        ratio = head / base
        verdict = "PASS" if ratio <= TARGET else "FAIL"
        print(f"{method:<24} {base:10.2f} {head:10.2f} {ratio:9.2f}  {verdict}")
        figures.append(
            {
                "figure": f"{method}: head / base CPU time",
                "value": round(ratio, 3),
                "unit": "ratio",
                "verdict": f"{verdict} (<= {TARGET})",
            }
        )
    if args.json:
        write_results(
            "ab",
            figures,
            device="cpu",
            threads=1,
            load_start=start,
            load_end=end,
            path=Path(args.json),
            note=f"Commit {args.head} (head) against {args.base} (base), {args.rounds} rounds "
            "alternating the commits, each measurement a fresh process, one thread; the ratio "
            "of the least CPU seconds of each (wall seconds in the file's details).",
            details={
                "base": args.base,
                "head": args.head,
                "rounds": args.rounds,
                "prompts": args.prompts,
                "seconds": best,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
