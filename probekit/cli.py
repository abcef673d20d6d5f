"""The `probekit` command: score prompt files, prepare the default model."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence

import pandas as pd
from tqdm.auto import tqdm

from probekit.errors import ProbekitError


def int_list(text: str) -> list[int]:
    """argparse type for comma-separated integers such as `--layers 0,6,12`."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None


def add_study_arguments(
    parser: argparse.ArgumentParser, out: str, events: int, events_help: str
) -> None:
    """The options the intergroup hooks scripts share: output, model, prompts and their events."""
    from probekit.studies.intergroup import CATEGORIES

    parser.add_argument("--out", default=out, help=f"output folder (default {out})")
    parser.add_argument("--model", default="default", help="load_model spec (default SmolLM2)")
    parser.add_argument("--category", default="religion", choices=CATEGORIES, help="identities")
    parser.add_argument("--setting", default="P0S0T0", help="prompt setting, e.g. P0S0T0, origin")
    parser.add_argument("--events", type=int, default=events, help=events_help)
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for the events (and any random control)"
    )
    parser.add_argument("--data", help="crowd-enVent root (default $PROBEKIT_DATA, cache, sample)")


def run_script(name: str, body: Callable[[], None]) -> int:
    """Run a command's body: a ProbekitError becomes one line on stderr and exit status 2, an
    interrupt exit status 130; no traceback for either."""
    try:
        body()
    except ProbekitError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    return run_script("probekit", lambda: args.func(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="probekit",
        description="Exact logit-based bias probes for language models.",
        epilog="Studies run as scripts: python experiments/intergroup_gap.py --help",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    score = sub.add_parser(
        "score",
        help="score prompts against a finite answer set from the logits (no sampling)",
        description="Write, for every prompt, the exact probability of each answer, the valid "
        "mass, argmax, and for numbers the expected value and std.",
    )
    score.add_argument("--model", default="default", help="hub id, model dir, .gguf, or default")
    score.add_argument(
        "--prompts", required=True, help='JSONL: {"id", "messages"} or {"id", "text"}'
    )
    score.add_argument(
        "--answers", required=True, help="lo-hi (0-100), a list (A,B,C,D) or @file (one a line)"
    )
    score.add_argument("--out", required=True, help="output .parquet (written atomically)")
    score.add_argument("--batch-size", type=int, default=None, help="default: 16 on CPU, 64 on GPU")
    score.add_argument("--prefill", default="", help="text forced at the start of the response")
    score.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help="pruning bound: every row's error_bound (pruned mass / valid mass) is at most "
        "epsilon (default 1e-4; 0 = exact)",
    )
    score.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    score.add_argument("--dtype", default=None, help="float32, bfloat16 (default by device)")
    score.set_defaults(func=_score)

    setup = sub.add_parser(
        "setup", help="convert the default model once and cache it (later loads take seconds)"
    )
    setup.add_argument("--model", default="default")
    setup.set_defaults(func=_setup)
    return parser


def _score(args: argparse.Namespace) -> None:
    from probekit.answers import AnswerSet
    from probekit.io import ParquetStream
    from probekit.models import load_model
    from probekit.prompts import encode, read_prompts
    from probekit.scoring.engine import DEFAULT_EPSILON, Scorer

    answers = AnswerSet.parse(args.answers)
    if args.batch_size is not None and args.batch_size < 1:
        raise ProbekitError("--batch-size must be at least 1")
    epsilon = DEFAULT_EPSILON if args.epsilon is None else args.epsilon
    if epsilon < 0:
        raise ProbekitError("--epsilon must be >= 0")
    total = sum(1 for _ in read_prompts(args.prompts))  # validates every line before any work
    if total == 0:
        raise ProbekitError(f"prompt file '{args.prompts}' has no prompts")
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    scorer = Scorer(model, answers, epsilon=epsilon, batch_size=args.batch_size)
    window = 4096

    def chunks() -> Iterator[list]:
        chunk = []
        for prompt in read_prompts(args.prompts):
            chunk.append(prompt)
            if len(chunk) == window:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    with ParquetStream(args.out) as out, tqdm(total=total, unit="prompt", disable=None) as bar:
        for chunk in chunks():
            ids = [encode(model, p, args.prefill) for p in chunk]
            results = scorer.score(ids, window=window, progress=bar)
            rows = [{"id": p.id, **r.row(answers)} for p, r in zip(chunk, results, strict=True)]
            out.write(pd.DataFrame(rows))
    print(f"wrote {total} rows to {args.out}")


def _setup(args: argparse.Namespace) -> None:
    from probekit.models import load_model

    model = load_model(args.model)
    print(f"model '{args.model}' ready: {model.source}")


if __name__ == "__main__":
    raise SystemExit(main())
