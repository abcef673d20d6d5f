"""The `probekit` command: `probekit COMMAND [STUDY] [options]` parses the command's options
(`probekit.run.COMMANDS` names each command's runner) and calls it; the command line's edge
(`run_script`) writes the options a line names as flags and an error as one line."""

from __future__ import annotations

import difflib
import functools
import sys
import warnings
from collections.abc import Callable, Sequence
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.options import Command, CommandParser, as_flags
from probekit.run import COMMANDS, runner


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


def main(argv: Sequence[str] | None = None) -> int:
    """`probekit COMMAND [options]`: 0 when done, 2 after a one-line error."""
    args = list(sys.argv[1:] if argv is None else argv)

    def body() -> None:
        if args and args[0] in COMMANDS:
            _command(args[0], args[1:])
            return
        if args and not args[0].startswith("-"):  # one line, with the nearest command
            near = difflib.get_close_matches(args[0], list(COMMANDS), n=1, cutoff=0.6)
            hint = f"did you mean probekit {near[0]}?" if near else ""
            hint = hint or f"the commands are {', '.join(COMMANDS)}"
            raise ProbekitError(f"unknown command '{args[0]}'; {hint} (probekit --help)")
        parser = CommandParser(  # the commands, for --help
            prog="probekit",
            description="Exact logit-based bias probes for language models.",
            epilog="Each command's options: probekit COMMAND --help (a study command: probekit "
            "run STUDY --help, likewise patch, capture, steer, lens).",
        )
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        for name, entry in COMMANDS.items():
            sub.add_parser(name, help=entry.help, add_help=False)
        parser.parse_args(args)  # --help, or one line naming the commands
        parser.print_help()

    return run_script("probekit", body)


def _command(name: str, argv: list[str]) -> None:
    entry = COMMANDS[name]
    if not entry.study:
        command = runner(name)
        command.main(command.parse(argv, f"probekit {name}", help=entry.help))
        return
    from probekit.studies import list_studies

    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: probekit {name} STUDY [options]\n\n{entry.help}.\n")
        print(f"Each study's options: probekit {name} STUDY --help. Studies:")
        runner("studies").main(None)
        raise SystemExit(0)
    if not argv or argv[0].startswith("-"):
        names = ", ".join(study.name for study in list_studies())
        raise ProbekitError(f"name a study: probekit {name} STUDY (one of {names})")
    _study_command(name, argv[0], argv[1:], f"probekit {name} {argv[0]}")


def _study_command(
    command: str, name: str, argv: Sequence[str] | None, prog: str, **defaults: Any
) -> None:
    """`probekit COMMAND STUDY argv` (`prog` in messages, with other `defaults`)."""
    from probekit.studies import get_study
    from probekit.studies.base import other_study_option

    study = get_study(name)
    # one line, before the command's module (and the model library) is imported, for a flag
    # that is another study's option or one of this study's for other commands: what the
    # command's own parser would say after its imports (`Command.not_taken`)
    elsewhere = functools.partial(other_study_option, study, command)
    Command(command, (study.options,), elsewhere=elsewhere).refuse_not_taken(argv or ())
    found = runner(command)
    found.main(found.parse(argv, prog, study, study.title, defaults), study)


def study_script(
    command: str, study_name: str, prog: str, argv: Sequence[str] | None, **defaults: Any
) -> int:
    """Entry point of a script that is `probekit COMMAND STUDY` under another name (e.g.
    `experiments/intergroup_gap.py`): the same options, `prog` in messages, its own defaults."""
    body = functools.partial(_study_command, command, study_name, argv, prog, **defaults)
    return run_script(prog.removesuffix(".py"), body)


if __name__ == "__main__":
    raise SystemExit(main())
