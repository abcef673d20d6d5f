"""The `probekit` command: list and run studies, report, capture, patch, steer, lens, score
prompt files, prepare a model, plan its memory.

`main` dispatches on the command's name; each command reads its options from the dataclasses
that declare them (`probekit.core.options.Command`), so a flag is checked by the same rule as
the keyword of the command's function."""

from __future__ import annotations

import difflib
import functools
import importlib
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.kinds import path
from probekit.core.options import (
    REQUIRED,
    Command,
    CommandParser,
    as_flags,
    check_out_dir,
    option,
    option_values,
)
from probekit.engines.options import ModelOptions, ScoreOptions, check_models
from probekit.run.report import ReportOptions

STUDY_COMMANDS = {
    "run": "run a study: exact scores or generation, resumable, then its report",
    "patch": "activation patching of a study's counterfactual pairs, and its direction",
    "capture": "activations at the spans of a study's prompts, to safetensors + parquet",
    "steer": "a study's headline with α x a vector added while scoring, beside a random control",
    "lens": "a study's headlines read after each layer (the logit lens on the exact readout)",
}
COMMANDS = {
    "studies": "list the registered studies, one line each",
    **STUDY_COMMANDS,
    "report": "re-write a run's summary and figures from its results; several folders (e.g. one "
    "per model) are summarised together",
    "score": "score prompts against a finite answer set from the logits (no sampling)",
    "setup": "convert the default model once and cache it (later loads take seconds)",
    "plan": "the memory plan of a model on some devices (weights, KV cache, batch, placement)",
}


@dataclass(frozen=True)
class ScoreFiles:
    """Files: the prompts read and the table written."""

    prompts: Path = option(REQUIRED, help='JSONL: {"id", "messages"} or {"id", "text"}', kind=path)
    scores: Path = option(REQUIRED, help="the Parquet file written (atomically)", kind=path)


def _check_scores_file(parsed: tuple) -> None:
    check_out_dir(parsed[1].scores.parent, "scores")


def _not_score_options(name: str) -> str | None:
    """One line for `--out` (score's file until it was named `--scores`): `--out` is a run
    folder in every other command."""
    if name == "out":
        return "--out names a run folder; probekit score writes one Parquet file: --scores FILE"
    return None


SCORE = Command(
    "score",
    (ModelOptions, ScoreFiles, ScoreOptions),
    checks=(check_models, _check_scores_file),
    elsewhere=_not_score_options,
)
REPORT = Command("report", (ReportOptions,))
SETUP = Command("setup", (ModelOptions,), checks=(check_models,))
STUDIES = Command("studies", ())


class Flagged:
    """A stream whose lines name probekit's options as flags (`as_flags`): the command line's
    edge, where `--events` replaces the `events` a Python caller reads."""

    names_flags = True

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(as_flags(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def run_script(name: str, body: Callable[[], None]) -> int:
    """Run a command's body with its options named as flags (in errors, warnings and lines): a
    ProbekitError becomes one line on stderr and exit status 2, an interrupt exit status 130; no
    traceback for either. A warning of probekit's (a weak signal, a prefill ending in
    whitespace) is one line on stderr, `NAME: warning: ...`, each time."""

    def one_line(message: Warning | str, *args: Any, **kwargs: Any) -> None:
        print(f"{name}: warning: {message}", file=sys.stderr, flush=True)

    try:
        out, err = redirect_stdout(Flagged(sys.stdout)), redirect_stderr(Flagged(sys.stderr))
        with out, err, warnings.catch_warnings():
            warnings.filterwarnings("always", category=UserWarning, module="probekit")
            warnings.showwarning = one_line
            body()
    except ProbekitError as exc:
        print(f"{name}: error: {as_flags(exc.marked)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    return 0


def timed(execute: Callable[[Any, tuple], str]) -> Callable[[Any, tuple], None]:
    """A study command's `execute` that returns what it wrote, as the command prints it:
    `wrote ...`, then the wall time."""

    @functools.wraps(execute)
    def printed(study: Any, parsed: tuple) -> None:
        start = time.monotonic()
        print(f"wrote {execute(study, parsed)}")
        print(f"wall time {time.monotonic() - start:.0f} s")

    return printed


def main(argv: Sequence[str] | None = None) -> int:
    """`probekit COMMAND [options]`: 0 when done, 2 after a one-line error."""
    args = list(sys.argv[1:] if argv is None else argv)

    def body() -> None:
        if args and args[0] in COMMANDS:
            _command(args[0], args[1:])
            return
        if args and not args[0].startswith("-"):
            raise unknown_command(args[0])
        parser = _parser()
        parser.parse_args(args)  # --help, or one line naming the commands
        parser.print_help()

    return run_script("probekit", body)


def unknown_command(name: str) -> ProbekitError:
    """One line for a command probekit does not have, with the nearest one."""
    near = difflib.get_close_matches(name, list(COMMANDS), n=1, cutoff=0.6)
    listed = f"the commands are {', '.join(COMMANDS)}"
    hint = f"did you mean probekit {near[0]}?" if near else listed
    return ProbekitError(f"unknown command '{name}'; {hint} (probekit --help)")


def _parser() -> CommandParser:
    """The top-level dispatch: the commands, for `probekit --help` and an unknown command."""
    parser = CommandParser(
        prog="probekit",
        description="Exact logit-based bias probes for language models.",
        epilog="Each command's options: probekit COMMAND --help (a study command: probekit run "
        "STUDY --help, likewise patch, capture, steer, lens).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _command(name: str, argv: list[str]) -> None:
    prog = f"probekit {name}"
    if name in STUDY_COMMANDS:
        _study_command(name, argv)
    elif name == "studies":
        STUDIES.parse(argv, prog, COMMANDS[name])
        _studies()
    elif name == "report":
        from probekit.run.report import report

        (options,) = REPORT.parse(argv, prog, COMMANDS[name])
        print(report(options.dir, options.out))
    elif name == "score":
        _score(*SCORE.parse(argv, prog, COMMANDS[name]))
    elif name == "setup":
        _setup(*SETUP.parse(argv, prog, COMMANDS[name]))
    else:
        import probekit.cli.plan as plan

        plan.execute(plan.COMMAND.parse(argv, prog, plan.HELP))


def _studies() -> None:
    from probekit.studies import list_studies

    studies = list_studies()
    width = max(len(study.name) for study in studies)
    for study in studies:
        print(f"{study.name:<{width}}  {study.title}")


def study_command(name: str, study: Any) -> Command:
    """The options of `probekit NAME STUDY` (run, patch, capture or steer)."""
    return _command_module(name).command(study)


def study_script(
    command: str, study_name: str, prog: str, argv: Sequence[str] | None, **defaults: Any
) -> int:
    """Entry point of a script that is `probekit COMMAND STUDY` under another name (e.g.
    `experiments/intergroup_gap.py`): the same options, `prog` in messages, its own defaults."""

    def body() -> None:
        from probekit.studies import get_study

        study = get_study(study_name)
        refuse_other_options(command, study, argv or ())
        options = study_command(command, study)
        options = replace(options, defaults={**options.defaults, **defaults})
        _command_module(command).execute(study, options.parse(argv, prog, study.title))

    return run_script(prog.removesuffix(".py"), body)


def _study_command(name: str, argv: list[str]) -> None:
    from probekit.studies import get_study, list_studies

    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: probekit {name} STUDY [options]\n\n{STUDY_COMMANDS[name]}.\n")
        print(f"Each study's options: probekit {name} STUDY --help. Studies:")
        _studies()
        raise SystemExit(0)
    if not argv or argv[0].startswith("-"):
        names = ", ".join(study.name for study in list_studies())
        raise ProbekitError(f"name a study: probekit {name} STUDY (one of {names})")
    study = get_study(argv[0])
    refuse_other_options(name, study, argv[1:])
    parsed = study_command(name, study).parse(
        argv[1:], f"probekit {name} {study.name}", study.title
    )
    _command_module(name).execute(study, parsed)


def refuse_other_options(command: str, study: Any, argv: Sequence[str]) -> None:
    """One line, before the command's module (and the model library) is imported, for a flag
    that is another study's option or one of this study's for other commands: what the
    command's own parser would say after its imports (`Command.not_taken`)."""
    from probekit.studies.base import other_study_option

    elsewhere = functools.partial(other_study_option, study, command)
    Command(command, (study.options,), elsewhere=elsewhere).refuse_not_taken(argv)


def _command_module(command: str) -> Any:
    """`probekit.cli.<command>`, imported on use: its `command(study)` and `execute`."""
    return importlib.import_module(f"probekit.cli.{command}")


def _score(model: ModelOptions, files: ScoreFiles, options: ScoreOptions) -> None:
    from probekit.engines.score import score_file

    written = score_file(
        model.model,
        **option_values(files),
        **option_values(options),
        quiet=model.quiet,
        **model.load_keywords(),
    )
    print(f"wrote {written}")


def _setup(model: ModelOptions) -> None:
    from probekit.engines import load_engine

    engine = load_engine(model.model, **model.load_keywords())
    print(f"model '{model.model}' ready: {engine.describe()['model_source']}")


if __name__ == "__main__":
    raise SystemExit(main())
