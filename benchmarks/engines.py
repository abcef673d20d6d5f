"""Benchmark: the engines and Ray on the same intergroup prompts and the same threads.

One run prints the prompts/s of

  (a) probekit's exact scores of the answers 0-100 (the hf engine's `Scorer.score`),
  (b) vLLM greedy generation with the study's budget (128 new tokens) + the authors' parse
      (`--engine vllm --mode generate`'s generation: the authors' pipeline), vLLM's load apart,
  (c) transformers' `generate` with the same budget + the parse (no early stop: the loop the
      authors' pipeline would run without vLLM),
  (d) probekit's generate mode on the hf engine (exact scores + decoding from the same cache,
      each row stopped once its parse is fixed),

with their ratios to (a); the optional cross-check of the exact scores through vLLM (0-10 and
0-100 read node by node from vLLM's log-probabilities, `probekit.engines.vllm.cross_check`): its
agreement with (a) at epsilon 0 and its cost; then the Ray overhead: the same study run (ev
mode) in one process, on Ray with one actor holding all the threads, and with two actors of half
the threads each (Ray's start and the actors' model loads included, and apart); and the projected
time of the paper's grid, 37.3 M prompts per model ((19² + 22² + 6²) pairs x 6,050 events x 7
settings), at the measured rates and, given `--gpu-rate` (prompts/s of one GPU, measured by this
script on a GPU machine), on N GPUs.

vLLM and Ray come from the environment `./setup.sh --ray --vllm` makes; run it there:

    ~/.cache/probekit/vllm-env/bin/python benchmarks/engines.py --prompts 24 --threads 2
    python benchmarks/engines.py --skip-vllm            # the hf engine and Ray only

`--json PATH` also writes Tables 1 and 2 as figures (`common.write_results`), for the
performance page (`benchmarks/results/engines.json`).

A benchmark, not a test: it exits 0 whatever the numbers; the load average is printed at start
and end because timings on a shared machine are distorted by other processes.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

GRID = (19**2 + 22**2 + 6**2) * 6050 * 7  # the paper's prompts per model: 37,311,350


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=24, help="prompts for (a)-(d)")
    parser.add_argument("--threads", type=int, default=2, help="torch / vLLM CPU threads")
    parser.add_argument("--ray-events", type=int, default=1, help="events (x36 prompts) for Ray")
    parser.add_argument("--data", default=None, help="data root with crowd-enVent (else sample)")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument(
        "--vllm-check", type=int, default=2, help="prompts for vLLM's exact cross-check (0: skip)"
    )
    parser.add_argument("--gpus", default="1,8,64", help="GPU counts for the projection")
    parser.add_argument("--gpu-rate", type=float, default=None, help="measured prompts/s per GPU")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    # vLLM's CPU build binds its OpenMP threads to these cores (same count as torch's threads).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    import torch

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in load_start)}")
    figures: list[dict] = []
    if not args.skip_ray:  # first: vLLM's engine core, once started, stays alive
        figures += ray_overhead(args)
    rates = engine_rates(args)
    projection(rates, args)
    load_end = os.getloadavg()
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in load_end)}")
    if args.json is not None:
        from common import write_results

        figures = [
            {"figure": label, "value": rate, "unit": "prompts/s", "series": "Table 1"}
            for label, rate in rates.items()
        ] + figures
        write_results(
            "engines",
            figures,
            device="cpu",
            threads=args.threads,
            load_start=load_start,
            load_end=load_end,
            path=args.json,
        )


def intergroup_probe(data: str | None, events: int):
    from probekit.datasets.crowd_envent import SAMPLE_ROOT, first_events
    from probekit.studies.intergroup import IntergroupProbe, get_category, get_setting

    chosen = first_events(data or SAMPLE_ROOT, events, seed=0)
    return IntergroupProbe(get_category("religion"), get_setting("P0S0T0"), chosen)


def engine_rates(args: argparse.Namespace) -> dict[str, float]:
    """Table 1: (a)-(d) on the same prompts; returns prompts/s by method."""
    from probekit.engines import load_engine
    from probekit.testing.reference import generate_greedy

    use_vllm = not args.skip_vllm and importlib.util.find_spec("vllm") is not None
    probe = intergroup_probe(args.data, 12)
    items = list(probe.items())
    items = items[:: max(1, len(items) // args.prompts)][: args.prompts]
    engine = load_engine("default", engine="vllm" if use_vllm else "hf")
    hf = engine.exact if use_vllm else engine
    ids = [hf.encode(item).input_ids for item in items]
    budget = probe.max_new_tokens
    rows: list[tuple[str, float, str]] = []

    def timed(label: str, fn, note: str = "") -> list:
        start = time.perf_counter()
        out = fn()
        rows.append((label, time.perf_counter() - start, note))
        return out

    timed("(a) exact scores, hf engine", lambda: list(hf.scorer(probe.answers).score(ids)))
    parsed: dict[str, list] = {}
    parsed["transformers"] = timed(
        "(c) transformers generate + parse",
        lambda: [
            probe.parse(text)
            for start in range(0, len(ids), 16)
            for text in generate_greedy(hf, ids[start : start + 16], max_new_tokens=budget)
        ],
        "full budget, no early stop",
    )
    results = timed(
        "(d) probekit generate mode, hf engine",
        lambda: list(
            hf.scorer(probe.answers, max_new_tokens=budget, settled=probe.settled).score(ids)
        ),
        "exact + decode, early stop",
    )
    parsed["probekit"] = [probe.parse(t) for t in hf.decode([r.generated for r in results])]
    # last: vLLM's engine core stays alive once started (it would share the cores)
    if use_vllm:
        start = time.perf_counter()
        engine.llm()
        load = time.perf_counter() - start
        writer = engine.scorer(probe.answers, max_new_tokens=budget, settled=probe.settled)
        writer.generate(ids[:1])  # the first request's one-off costs
        texts = timed(
            "(b) vLLM generate + parse",
            lambda: [probe.parse(t) for t in engine.decode(writer.generate(ids))],
            f"vLLM load {load:.0f} s apart",
        )
        parsed["vllm"] = texts
    else:
        print("(b) skipped: vLLM is not installed in this Python (./setup.sh --vllm)")

    base = len(ids) / rows[0][1]
    print(
        f"\nTable 1: {len(ids)} intergroup prompts (religion, P0S0T0), default model, "
        f"{args.threads} threads, budget {budget} new tokens"
    )
    print("| method | seconds | prompts/s | ratio to (a) | note |")
    print("|---|---|---|---|---|")
    rates = {}
    for label, seconds, note in rows:
        rate = len(ids) / seconds
        rates[label] = rate
        print(f"| {label} | {seconds:.1f} | {rate:.2f} | {rate / base:.2f} | {note} |")
    for name, answers in parsed.items():
        if name != "transformers":
            same = sum(a == b for a, b in zip(answers, parsed["transformers"], strict=True))
            print(f"parsed answers equal to transformers': {name} {same}/{len(ids)}")
    if use_vllm and args.vllm_check:
        vllm_cross_check(engine, ids[: args.vllm_check])
    return rates


def vllm_cross_check(engine, ids: list) -> None:
    """Table 1b: number answers scored exactly through vLLM against the hf engine (epsilon 0)."""
    from probekit.core.answers import AnswerSet
    from probekit.engines.vllm import cross_check

    print(f"\nTable 1b: exact scores through vLLM's log-probabilities, {len(ids)} prompts")
    print("| answers | requests | vLLM s/prompt | hf s/prompt | max |dp| | max |dE| | valid mass |")
    print("|---|---|---|---|---|---|---|")
    for spec in ("0-10", "0-100"):
        table = cross_check(engine, AnswerSet.parse(spec), ids)
        relative = (table["valid_mass_vllm"] / table["valid_mass_hf"] - 1).abs().max()
        print(
            f"| {spec} | {table.attrs['vllm_requests']} | "
            f"{table.attrs['vllm_seconds'] / len(ids):.1f} | "
            f"{table.attrs['hf_seconds'] / len(ids):.1f} | {table['max_abs_dp'].max():.1e} | "
            f"{table['abs_d_expected'].max():.1e} | relative {relative:.1e} |"
        )


def ray_overhead(args: argparse.Namespace) -> list[dict]:
    """Table 2: one process against Ray with one and with two actors, same probe, ev mode; its
    rows as figures."""
    if importlib.util.find_spec("ray") is None:
        print("\nTable 2 skipped: Ray is not installed in this Python (./setup.sh --ray)")
        return []
    import pandas as pd
    import ray

    from probekit.core.progress import silenced
    from probekit.engines import load_engine
    from probekit.run.loop import run_probe
    from probekit.run.ray import RayPool, connect

    probe = intergroup_probe(args.data, args.ray_events)
    manifest = {"model": "default", "probe": probe.config(), "view": "exact", "epsilon": 1e-4}
    root = Path(tempfile.mkdtemp(prefix="probekit-engines-"))
    chunk = 16
    rows = []
    try:
        start = time.perf_counter()
        engine = load_engine("default")
        loaded = time.perf_counter()
        with silenced():  # no pace sample before it: the Ray runs below take none either
            single = run_probe(probe, engine, root / "single", manifest, chunk_size=chunk)
        rows.append(("one process", time.perf_counter() - start, loaded - start))
        start = time.perf_counter()
        connect(num_cpus=args.threads)
        print(
            f"\nRay local instance ({args.threads} CPUs) started in "
            f"{time.perf_counter() - start:.1f} s"
        )
        load = functools.partial(load_engine, "default")
        outputs = {}
        for actors in (1, 2):
            start = time.perf_counter()
            pool = RayPool(load, actors)
            outputs[actors] = run_probe(
                probe, pool, root / f"ray{actors}", manifest, chunk_size=chunk
            )
            rows.append((f"Ray, {actors} actor(s)", time.perf_counter() - start, None))
        ray.shutdown()
        a = pd.read_parquet(single)
        diff = max(
            float((a["expected"] - pd.read_parquet(path)["expected"]).abs().max())
            for path in outputs.values()
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = len(probe)
    print(
        f"Table 2: {total} prompts, ev mode, chunks of {chunk}, {args.threads} threads in all "
        f"(2 actors: {max(1, args.threads // 2)} each); model loads included"
    )
    print("| run | seconds | prompts/s | vs one process | note |")
    print("|---|---|---|---|---|")
    for label, seconds, load_s in rows:
        note = f"model load {load_s:.1f} s" if load_s is not None else "actors start and load"
        print(
            f"| {label} | {seconds:.1f} | {total / seconds:.2f} | "
            f"{rows[0][1] / seconds:.2f}x | {note} |"
        )
    print(f"largest |expected| difference from one process: {diff:.1e}")
    series = f"Table 2: {total} prompts, {args.threads} threads in all, model loads included"
    figures = [
        {"figure": label, "value": total / seconds, "unit": "prompts/s", "series": series}
        for label, seconds, _ in rows
    ]
    return figures + [
        {
            "figure": "largest |expected| difference of Ray's rows from one process's",
            "value": diff,
            "unit": "0-100 scale",
            "series": series,
        }
    ]


def projection(rates: dict[str, float], args: argparse.Namespace) -> None:
    """Table 3: days for the paper's grid per model."""
    print(f"\nTable 3: the paper's grid, {GRID:,} prompts per model")
    print("| where | rate source | prompts/s | days |")
    print("|---|---|---|---|")
    for label, rate in rates.items():
        print(
            f"| this CPU, {args.threads} threads | {label} (measured) | {rate:.2f} | "
            f"{GRID / rate / 86400:,.0f} |"
        )
    if args.gpu_rate:
        for n in (int(x) for x in args.gpus.split(",")):
            rate = args.gpu_rate * n
            print(
                f"| {n} GPU(s) | --gpu-rate {args.gpu_rate:g} per GPU, linear | {rate:,.0f} | "
                f"{GRID / rate / 86400:,.2f} |"
            )
    else:
        print(
            "| N GPUs | not measured: no GPU on this machine; run this script on one and pass "
            "its rate as --gpu-rate | - | - |"
        )


if __name__ == "__main__":
    main()
