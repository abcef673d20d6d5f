"""The `probekit` command: list and run studies, report, capture, patch, score prompt files,
prepare the default model."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from probekit.core.errors import ProbekitError
from probekit.core.options import CommandParser, check_out_dir, non_negative_float, positive_int
from probekit.engines.options import add_model_options, load_options

STUDY_COMMANDS = {
    "run": "run a study: exact scores (ev) or generation, resumable, then its report",
    "patch": "activation patching of a study's counterfactual pairs, and its direction",
    "capture": "activations at the spans of a study's prompts, to safetensors + parquet",
    "steer": "a study's headline with α x a vector added while scoring, beside a random control",
}


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

    def body() -> None:
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
        else:
            args.func(args)

    return run_script("probekit", body)


class _StudyCommandHelp(argparse.Action):
    """`probekit run --help` (no study named yet): the command's usage and the studies."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show this help and the studies")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> NoReturn:
        command = parser.prog.split()[-1]
        print(f"usage: {parser.prog} STUDY [options]\n\n{STUDY_COMMANDS[command]}.\n")
        print(f"Each study's options: {parser.prog} STUDY --help. Studies:")
        _studies(argparse.Namespace())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="probekit",
        description="Exact logit-based bias probes for language models.",
        epilog="Each study's options: probekit run STUDY --help (likewise patch, capture).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    studies = sub.add_parser("studies", help="list the registered studies, one line each")
    studies.set_defaults(func=_studies)
    for name, help_text in STUDY_COMMANDS.items():
        command = sub.add_parser(name, help=help_text, add_help=False)
        command.add_argument("-h", "--help", action=_StudyCommandHelp)
        command.add_argument("study", nargs="?", help="a study name (probekit studies)")
        command.add_argument("rest", nargs=argparse.REMAINDER, help="the study's options")
        command.set_defaults(func=_study_command)
    report = sub.add_parser(
        "report",
        help="re-write a run's summary and figures from its results; several folders (e.g. one "
        "per model) are summarised together",
    )
    report.add_argument("dir", nargs="+", help="the --out folder of a finished run (or several)")
    report.add_argument(
        "--out", default=None, help="where the combined summary goes (default: the first folder)"
    )
    report.set_defaults(func=_report)

    score = sub.add_parser(
        "score",
        help="score prompts against a finite answer set from the logits (no sampling)",
        description="Write, for every prompt, the exact probability of each answer, the valid "
        "mass, argmax, and for numbers the expected value and std.",
    )
    add_model_options(score)
    score.add_argument(
        "--prompts", required=True, help='JSONL: {"id", "messages"} or {"id", "text"}'
    )
    score.add_argument(
        "--answers", required=True, help="lo-hi (0-100), a list (A,B,C,D) or @file (one a line)"
    )
    score.add_argument("--out", required=True, help="output .parquet (written atomically)")
    score.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="default: 16 on CPU, the plan's on GPU",
    )
    score.add_argument("--prefill", default="", help="text forced at the start of the response")
    score.add_argument(
        "--epsilon",
        type=non_negative_float,
        default=None,
        help="pruning bound: every row's error_bound (pruned mass / valid mass) is at most "
        "epsilon (default 1e-4; 0 = exact)",
    )
    score.set_defaults(func=_score)

    setup = sub.add_parser(
        "setup", help="convert the default model once and cache it (later loads take seconds)"
    )
    add_model_options(setup)
    setup.set_defaults(func=_setup)

    import probekit.cli.plan as plan

    planner = sub.add_parser("plan", help=plan.HELP, description=plan.HELP)
    plan.add_arguments(planner)
    planner.set_defaults(func=plan.execute)
    return parser


def _studies(args: argparse.Namespace) -> None:
    from probekit.studies import list_studies

    studies = list_studies()
    width = max(len(study.name) for study in studies)
    for study in studies:
        print(f"{study.name:<{width}}  {study.title}")


def study_parser(command: str, study_name: str) -> tuple[argparse.ArgumentParser, Any]:
    """The parser of `probekit COMMAND STUDY` with the command's and the study's options."""
    from probekit.studies import get_study

    study = get_study(study_name)
    parser = CommandParser(prog=f"probekit {command} {study.name}", description=study.title)
    _command_module(command).add_arguments(parser, study)
    return parser, study


def study_script(
    command: str, study_name: str, prog: str, argv: Sequence[str] | None, **defaults: Any
) -> int:
    """Entry point of a script that is `probekit COMMAND STUDY` under another name (e.g.
    `experiments/intergroup_gap.py`): the same options, `prog` in messages, its own defaults."""

    def body() -> None:
        parser, study = study_parser(command, study_name)
        parser.prog = prog
        parser.set_defaults(**defaults)
        _command_module(command).execute(study, parser.parse_args(argv))

    return run_script(prog.removesuffix(".py"), body)


def _study_command(args: argparse.Namespace) -> None:
    if args.study is None or args.study.startswith("-"):
        from probekit.studies import list_studies

        names = ", ".join(study.name for study in list_studies())
        raise ProbekitError(f"name a study: probekit {args.command} STUDY (one of {names})")
    parser, study = study_parser(args.command, args.study)
    _command_module(args.command).execute(study, parser.parse_args(args.rest))


def _command_module(command: str) -> Any:
    """`probekit.cli.<command>`, imported on use: its `add_arguments` and `execute`."""
    return importlib.import_module(f"probekit.cli.{command}")


def _report(args: argparse.Namespace) -> None:
    from probekit.cli.report import report_runs

    print(report_runs(args.dir, args.out))


def _score(args: argparse.Namespace) -> None:
    from tqdm.auto import tqdm

    from probekit.core.answers import as_answer_set
    from probekit.core.io import ParquetStream
    from probekit.core.prompts import read_prompts
    from probekit.core.signal import prefill_trap, weak_signal
    from probekit.engines import load_engine
    from probekit.engines.base import DEFAULT_EPSILON
    from probekit.engines.score import score_frames

    answers = as_answer_set(args.answers)
    epsilon = DEFAULT_EPSILON if args.epsilon is None else args.epsilon
    if trap := prefill_trap(args.prefill):
        print(f"probekit: warning: {trap}", file=sys.stderr)
    check_out_dir(Path(args.out).parent, "--out")
    total = sum(1 for _ in read_prompts(args.prompts))  # validates every line before any work
    if total == 0:
        raise ProbekitError(f"prompt file '{args.prompts}' has no prompts")
    model = load_engine(args.model, **load_options(args))
    items = read_prompts(args.prompts, args.prefill)
    masses: list[float] = []
    with ParquetStream(args.out) as out, tqdm(total=total, unit="prompt", disable=None) as bar:
        for frame in score_frames(
            model, items, answers, epsilon=epsilon, batch_size=args.batch_size, progress=bar
        ):
            out.write(frame)
            masses += frame["valid_mass"].tolist()
    print(f"wrote {total} rows to {args.out}")
    if masses and (weak := weak_signal(sum(masses) / len(masses))):
        print(f"probekit: warning: {weak}", file=sys.stderr)


def _setup(args: argparse.Namespace) -> None:
    from probekit.engines import load_engine

    model = load_engine(args.model, **load_options(args))
    print(f"model '{args.model}' ready: {model.describe()['model_source']}")


if __name__ == "__main__":
    raise SystemExit(main())
