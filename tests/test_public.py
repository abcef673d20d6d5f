"""Every public name checks its arguments before any work, in one line naming the keyword
(`probekit.core.public`): the walk of `probekit.__all__` with a wrong type, a missing argument
and a misspelled keyword; a bad value of every option of every public function; no flag named in
an error a Python caller can reach, and the same raise site naming the flag on the command
line."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import probekit
from probekit.core.errors import ProbekitError
from probekit.core.options import as_flags, given, named, option_error
from probekit.studies import list_studies

PACKAGE = Path(probekit.__file__).parent
NOT_CALLED = {
    "__version__": "a string",
    "ProbekitError": "the error itself, raised not called",
    "Probe": "abstract: a study subclasses it",
    "Study": "abstract: a study subclasses it",
    "ModelOptions": "options: each value checked where the options are given (run_study, ...)",
}
NAMES = [name for name in probekit.__all__ if name not in NOT_CALLED]
MORE = [  # public functions outside `__all__` whose options are declared
    "probekit.run.loop:run_probe",
    "probekit.run.ray:RayPool",
    "probekit.engines.hf.precision:noise_figure",
    "probekit.mechanism.capture:capture",
    "probekit.mechanism.capture:read_spans",
    "probekit.mechanism.steering:span_means",
]


class Wrong:
    """A value no public name takes anywhere."""

    def __repr__(self) -> str:
        return "Wrong()"


def target(name: str):
    if ":" in name:
        module, attribute = name.split(":")
        return getattr(__import__(module, fromlist=[attribute]), attribute)
    return getattr(probekit, name)


def parameters(name: str) -> list[inspect.Parameter]:
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p for p in inspect.signature(target(name)).parameters.values() if p.kind not in kinds]


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text and not re.search(r"(?<![\w-])--[a-z]", text), text
    return text


def call(function, arguments: dict):
    positional = [v for k, v in arguments.items() if k.startswith("#")]
    keywords = {k: v for k, v in arguments.items() if not k.startswith("#")}
    return function(*positional, **keywords)


def test_every_public_name_is_checked():
    """The whole of `__all__` (and the public functions beside it) carries the checks."""
    unchecked = [name for name in NAMES + MORE if not _checked(target(name))]
    assert not unchecked, f"not decorated with probekit.core.public.public: {unchecked}"


def _checked(found) -> bool:
    if isinstance(found, type):
        init = found.__dict__.get("__init__") or found.__dict__.get("__new__")
        init = getattr(init, "__func__", init)
        return hasattr(init, "__public__")
    return hasattr(found, "__public__")


@pytest.mark.parametrize("name", NAMES + MORE)
def test_a_wrong_type_is_one_line_naming_the_argument(name):
    """Every argument a Wrong(): the first one checked is named."""
    function, listed = target(name), parameters(name)
    if not listed:  # nothing to give: a surplus argument is one line
        with pytest.raises(ProbekitError) as error:
            function(Wrong())
        assert "too many positional arguments" in one_line(error)
        return
    required = [p for p in listed if p.default is p.empty] or listed[:1]
    arguments = {
        (f"#{p.name}" if p.kind is p.POSITIONAL_OR_KEYWORD else p.name): Wrong() for p in required
    }
    with pytest.raises(ProbekitError) as error:
        call(function, arguments)
    text = one_line(error)
    assert any(re.search(rf"\b{p.name}\b", text) for p in required), text


@pytest.mark.parametrize(
    "name", [n for n in NAMES + MORE if any(p.default is p.empty for p in parameters(n))]
)
def test_a_missing_argument_is_one_line_naming_it(name):
    first = next(p.name for p in parameters(name) if p.default is p.empty)
    if first in ("self", "_cls"):
        first = next(p.name for p in parameters(name)[1:] if p.default is p.empty)
    with pytest.raises(ProbekitError) as error:
        target(name)()
    assert f"'{first}'" in one_line(error)


@pytest.mark.parametrize("name", [n for n in NAMES + MORE if parameters(n)])
def test_a_misspelled_keyword_gets_a_did_you_mean(name):
    wanted = parameters(name)[0].name
    with pytest.raises(ProbekitError) as error:
        target(name)(**{wanted + wanted[-1]: Wrong()})
    assert f"did you mean {wanted}" in one_line(error)


OPTIONED = [
    name
    for name in NAMES + MORE
    if getattr(getattr(target(name), "__public__", None), "fields", None)
]


@pytest.mark.parametrize("name", OPTIONED)
def test_a_bad_value_of_each_option_names_the_keyword_not_a_flag(name):
    """Each option of each public function given a value of no kind: one line naming it."""
    for option in target(name).__public__.fields:
        with pytest.raises(ProbekitError) as error:
            target(name)(**{option: Wrong()})
        assert re.match(rf"^{option}\b", one_line(error)), (name, option)


@pytest.mark.parametrize("study", [s.name for s in list_studies()])
@pytest.mark.parametrize("function", ["run_study", "patch_study", "capture_study", "steer_study"])
def test_a_bad_value_of_each_study_option_names_the_keyword(study, function, tmp_path):
    """A study's own options, through the study functions, before any data or model."""
    from probekit.core.options import options_of
    from probekit.run import runner

    command = runner(function.removesuffix("_study")).options(probekit.get_study(study))
    taken = command.taken()
    own = [f.name for f in options_of(command.groups[-1]) if f.name in taken]
    for option in own:
        with pytest.raises(ProbekitError) as error:
            getattr(probekit, function)(study, out=tmp_path / "x", **{option: Wrong()})
        assert re.match(rf"^{option}\b", one_line(error)), (function, option)
    assert not (tmp_path / "x").exists()


SHELL = re.compile(r"(pip install|setup\.sh|ray start|python -m)[^`]*")


def test_no_library_error_names_a_flag():
    """Outside `cli/`, a ProbekitError's text names no `--flag`: an option is named with
    `named`/`given`/`option_error`, which say `--events` on the command line and `events` from
    Python (a shell command in backticks may carry its own flags)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "func", None)
            name = getattr(name, "id", getattr(name, "attr", None))
            if isinstance(node, ast.Call) and name in ("ProbekitError", "StatisticsError"):
                for part in ast.walk(node):
                    text = part.value if isinstance(part, ast.Constant) else None
                    if isinstance(text, str) and re.search(
                        r"(?<![\w`-])--[a-z]", SHELL.sub("", text)
                    ):
                        found.append(f"{path.relative_to(PACKAGE)}:{part.lineno}: {text!r}")
    assert not found, found


def test_an_option_is_named_in_the_callers_words():
    """A message names an option once; Python reads the keyword, the command line the flag."""
    message = (
        f"use {named('max_memory')} or {given('device', 'cuda:3')} ({given('limit', 'N', True)})"
    )
    assert str(ProbekitError(message)) == "use max_memory or device='cuda:3' (limit=N)"
    assert as_flags(message) == "use --max-memory or --device cuda:3 (--limit N)"
    error = option_error("events", "must be at least 1 (got 0)")
    assert (str(error), as_flags(error.marked)) == (
        "events must be at least 1 (got 0)",
        "--events must be at least 1 (got 0)",
    )


def test_a_deep_refusal_says_the_flag_on_the_command_line_and_the_keyword_from_python(capsys):
    """One raise site (the study's events per emotion, checked against the data), reached from
    each front end: the keyword from Python, the flag from the command line."""
    from probekit import cli
    from probekit.datasets.crowd_envent import SAMPLE_ROOT

    line = "events must be at most 3, the events of 'anger', or all (got 40)"
    with pytest.raises(ProbekitError) as error:
        probekit.capture_study("intergroup", "no/such-model", events=40, data=SAMPLE_ROOT)
    assert str(error.value) == line
    argv = ["capture", "intergroup", "--events", "40", "--data", str(SAMPLE_ROOT)]
    assert cli.main(argv) == 2  # before any model loads
    assert capsys.readouterr().err == f"probekit: error: --{line}\n"


@pytest.mark.parametrize(
    ("call_", "message"),
    [
        (lambda: probekit.score("m", ["x"], "0-10", quiet="no"), "quiet must be True or False"),
        (
            lambda: probekit.patch("m", [], spans=["x"], answers="0-10", distributions="no"),
            "distributions must be True or False",
        ),
        (
            lambda: probekit.make_pair("m", "a", "b", chat="no"),
            "chat must be True or False",
        ),
        (
            lambda: probekit.patch_study("intergroup", skip_direction="no"),
            "skip_direction must be True or False",
        ),
        (
            lambda: probekit.run_study("isear", quiet="yes"),
            "quiet must be True or False",
        ),
    ],
)
def test_a_switch_takes_a_boolean_only(call_, message):
    """`quiet="no"` was read as True; a switch takes True or False."""
    with pytest.raises(ProbekitError, match=message):
        call_()


def test_encode_item_names_the_real_cause():
    """`encode_item(model, 5)`: the item is not one (not "needs a fast tokenizer")."""
    with pytest.raises(ProbekitError) as error:
        probekit.encode_item(object(), 5)
    assert one_line(error) == "encode_item(): item must be an Item (got 5)"
