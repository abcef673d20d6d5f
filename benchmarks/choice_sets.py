"""Benchmark: exact scoring of each study's answer set vs generate + parse and the shared-prefix
peer.

For every answer set below, on the first N prompts of the study that asks it, one run prints

  (a)  probekit exact scoring (`Scorer.score`, default epsilon) of the study's exact-view prompts:
       prompts/s, trie positions per prompt, the largest error bound, and the trie pass's
       positions/s against the prompt pass's tokens/s (`Scorer.stats`);
  (b)  generate + parse as the authors ran it: `transformers` greedy `generate()` of the study's
       generate-mode prompts up to the study's decoding budget (end of sequence stops a row), then
       the study's parse rule;
  (b') the same greedy decoding by probekit's decoder, each row stopped as soon as the study's
       `settled` rule says its parse can no longer change (the strongest generate peer);
  (e)  the shared-prefix peer on the first few prompts (`testing.reference.shared_prefix`:
       the prompt once, every candidate batched on its KV cache) and the largest |p(a) - p(e)|.

The answer sets: 0-10 (intergroup, P0S1T0), the 12 ISEAR emotion words with their surface forms,
A-D after the `[[` prefill (GIEBench; on probekit's own two sample records, NOT GIEBench's items,
in four answer orders) and A-E (JaEm-ST). The 0-100 scale has its own, fuller benchmark
(`benchmarks/scoring.py`). Target: (a) >= 1.3x the faster of (b) and (b') for every answer set.

This is a benchmark, not a test: it exits 0 whatever the numbers are and prints PASS/FAIL.

    python benchmarks/choice_sets.py                      # all four sets, 32 prompts each
    python benchmarks/choice_sets.py --sets isear,a-e --prompts 8
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import common
import numpy as np
import torch
from common import Target, Timing, print_targets, timed, trie_rates, trie_rates_line

from probekit.core.kinds import comma_list
from probekit.engines import load_engine
from probekit.engines.hf.model import LoadedModel
from probekit.run import runner
from probekit.studies.base import Probe, get_study
from probekit.testing.reference import generate_greedy, shared_prefix

MIN_SPEEDUP_VS_GENERATE = 1.3


@dataclass(frozen=True)
class ChoiceSet:
    """An answer set and the study run (`probekit run STUDY ARGS`) whose prompts ask it."""

    name: str
    study: str
    args: tuple[str, ...]
    data: bool  # the study reads --data


CHOICE_SETS = {
    "0-10": ChoiceSet(
        "0-10 (intergroup P0S1T0)",
        "intergroup",
        ("--category", "religion", "--setting", "P0S1T0", "--events", "2"),
        True,
    ),
    "isear": ChoiceSet("ISEAR emotions", "isear", ("--events", "{n}"), True),
    "a-d": ChoiceSet(
        "A-D after [[ (GIEBench sample)", "giebench", ("--items", "sample", "--orders", "4"), False
    ),
    "a-e": ChoiceSet("A-E (JaEm-ST)", "jaem-st", ("--samples", "{n}"), True),
}


DESCRIPTION = (
    "Prompts/s of (a) exact scoring, (b) transformers generate + parse with the study's budget, "
    "(b') probekit's decoder with early stop and (e) the shared-prefix peer, for the answer sets "
    f"{', '.join(CHOICE_SETS)}. Target: (a) >= {MIN_SPEEDUP_VS_GENERATE:g}x the faster of (b) "
    "and (b')."
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.argument_parser("benchmarks/choice_sets.py", DESCRIPTION)
    parser.add_argument(
        "--sets",
        type=comma_list,
        default=list(CHOICE_SETS),
        help=f"comma-separated subset of {','.join(CHOICE_SETS)} (default: all)",
    )
    parser.add_argument(
        "--prompts", type=int, default=32, metavar="N", help="prompts per set (default: 32)"
    )
    parser.add_argument(
        "--shared-prompts",
        type=int,
        default=4,
        metavar="N",
        help="prompts timed in (e) and compared with (a) (default: 4; 0 skips it)",
    )
    common.shared_options(parser, "epsilon", "batch_size")  # (a)'s pruning bound
    args = parser.parse_args(argv)
    unknown = [name for name in args.sets if name not in CHOICE_SETS]
    if unknown:
        parser.error(f"unknown set(s) {', '.join(unknown)}; choose from {', '.join(CHOICE_SETS)}")
    if args.prompts < 1 or args.shared_prompts < 0:
        parser.error("--prompts must be >= 1 and --shared-prompts >= 0")
    args.data = common.data_root(args.data)
    return args


def study_probe(choice: ChoiceSet, mode: str, n: int, data: str | None) -> Probe:
    """The study's probe for `mode`, built from its own command-line options."""
    study = get_study(choice.study)
    argv = [a.format(n=n) for a in choice.args] + ["--view", mode]
    if choice.data and data:
        argv += ["--data", data]
    options = runner("run").parse(argv, "choice_sets.py", study)
    return study.probes(options.study, runner("run").context(options, lambda *a, **k: None))[0]


def bench_set(model: LoadedModel, choice: ChoiceSet, args: argparse.Namespace) -> dict[str, Any]:
    """Time (a), (b), (b') and (e) on one answer set; return its row of figures."""
    exact_probe = study_probe(choice, "exact", args.prompts, args.data)
    gen_probe = study_probe(choice, "generate", args.prompts, args.data)
    answers, device = exact_probe.answers, model.device
    exact_ids = common.first_prompts(model, exact_probe, args.prompts)
    gen_ids = common.first_prompts(model, gen_probe, args.prompts)
    n, budget = len(exact_ids), gen_probe.max_new_tokens

    scorer = model.scorer(answers, epsilon=args.epsilon, batch_size=args.batch_size)
    results, sec, cpu = timed(device, lambda: list(scorer.score(exact_ids)))
    timings = [Timing("(a) exact", n, sec, cpu)]
    stats, batch = scorer.stats, scorer.batch_size

    def hf_generate() -> list[str]:
        texts: list[str] = []
        for start in range(0, len(gen_ids), batch):
            texts += generate_greedy(model, gen_ids[start : start + batch], budget)
        return texts

    texts, sec, cpu = timed(device, hf_generate)
    timings.append(Timing(f"(b) generate {budget} + parse", len(gen_ids), sec, cpu))
    decoder = model.scorer(
        answers, batch_size=batch, max_new_tokens=budget, settled=gen_probe.settled
    )
    tokens, sec, cpu = timed(device, lambda: decoder.generate(gen_ids))
    timings.append(Timing("(b') decode + early stop", len(gen_ids), sec, cpu))
    early = model.decode(tokens)
    parsed = [gen_probe.parse(text) for text in texts]
    parse_differs = sum(gen_probe.parse(t) != p for t, p in zip(early, parsed, strict=True))

    peer_diff = None
    if args.shared_prompts:
        subset = exact_ids[: args.shared_prompts]
        peer, sec, cpu = timed(device, lambda: [shared_prefix(model, p, answers) for p in subset])
        timings.append(Timing("(e) shared-prefix peer", len(subset), sec, cpu))
        peer_diff = max(
            float(np.max(np.abs(r.probs * r.valid_mass - p)))
            for r, p in zip(results, peer, strict=False)
        )

    named = [(r, p) for r, p in zip(results, parsed, strict=False) if str(p) in answers.answers]
    fastest_generate = max(timings[1].rate, timings[2].rate)
    return {
        "set": choice.name,
        "prompts": n,
        "prompt_tokens_mean": float(np.mean([len(p) for p in exact_ids])),
        "budget": budget,
        "timings": timings,
        "speedup": timings[0].rate / fastest_generate,
        # The rate (a) would reach if its trie pass cost nothing: the prompt pass alone, which
        # generation needs as well.
        "free_trie_speedup": n / stats.prompt_seconds / fastest_generate,
        "trie_positions_per_prompt": stats.trie_positions / max(stats.prompts, 1),
        "trie_nodes": len(scorer.trie.nodes) - 1,  # below the root: what the trie could feed
        "trie_rates": trie_rates(stats, model),
        "max_error_bound": max(r.error_bound for r in results),
        "mean_valid_mass": float(np.mean([r.valid_mass for r in results])),
        "max_diff_vs_peer": peer_diff,
        "parsed": len(named),
        "agree": sum(r.greedy == str(p) for r, p in named),
        "early_stop_parse_differs": parse_differs,
    }


def report(row: dict[str, Any]) -> None:
    print(
        f"\n{row['set']}: {row['prompts']} prompts of {row['prompt_tokens_mean']:.0f} tokens on "
        f"average; generate budget {row['budget']} new tokens"
    )
    exact = row["timings"][0]
    for t in row["timings"]:
        print(
            f"  {t.method:<28} {t.prompts:>4} prompts {t.seconds:>8.2f} s {t.rate:>8.2f} prompts/s"
            f"  (a) is {exact.rate / t.rate:.2f}x"
        )
    peer = row["max_diff_vs_peer"]
    print(
        f"  trie positions/prompt {row['trie_positions_per_prompt']:.1f} (of "
        f"{row['trie_nodes']} trie nodes); max error bound "
        f"{row['max_error_bound']:.3g}; mean valid mass {row['mean_valid_mass']:.3f}"
        + ("" if peer is None else f"; max |p(a) - p(e)| {peer:.3g}")
    )
    print(f"  {trie_rates_line(row['trie_rates'])}")
    print(
        f"  (a) with a free trie pass (its prompt pass alone) would be "
        f"{row['free_trie_speedup']:.2f}x the faster of (b), (b')"
    )
    print(
        f"  (b) parsed an answer of the set in {row['parsed']}/{row['prompts']}; (a)'s greedy-"
        f"equivalent answer matches it in {row['agree']}; (b') parses differently from (b) on "
        f"{row['early_stop_parse_differs']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start_load = common.set_up(args.threads)
    model = load_engine(args.model, device=args.device)
    common.warm_up(model, [model.tokenizer.eos_token_id] * 8)
    print(
        f"model: {model.name} ({model.source}), {model.device}, {model.dtype}; "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}; epsilon "
        f"{args.epsilon:g}; data {args.data or 'the studies defaults'}"
    )
    rows = []
    for name in args.sets:
        rows.append(bench_set(model, CHOICE_SETS[name], args))
        report(rows[-1])
    targets = [
        Target(
            f"{row['set']}: (a) >= {MIN_SPEEDUP_VS_GENERATE:g}x (b)/(b')",
            row["speedup"],
            MIN_SPEEDUP_VS_GENERATE,
            True,
        )
        for row in rows
    ]
    print_targets(targets, "targets (against the faster of (b) and (b')):")
    end_load = common.tear_down(model.device)
    if args.json:
        for row in rows:
            row["timings"] = [asdict(t) | {"prompts_per_s": t.rate} for t in row["timings"]]
        payload = {
            "rows": rows,
            "targets": [asdict(t) | {"verdict": t.verdict} for t in targets],
            "load_start": start_load,
            "load_end": end_load,
        }
        figures = [
            {
                "figure": f"{row['set']}: {t['method']}",
                "value": t["prompts_per_s"],
                "unit": "prompts/s",
            }
            for row in rows
            for t in row["timings"]
        ]
        figures += [
            {"figure": t.name, "value": t.value, "unit": "x", "verdict": t.verdict} for t in targets
        ]
        common.write_results(
            "choice_sets",
            figures,
            device=model.device,
            threads=args.threads,
            load_start=start_load,
            load_end=end_load,
            argv=[__file__, *(sys.argv[1:] if argv is None else argv)],
            path=args.json,
            details=payload,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
