"""Typed options, one declaration each: the Python API takes Python values (a `torch.dtype`, a
device-map dict, ranges, Paths, `Study` objects) and names the keyword in a refusal; every
command line reads the same declarations and names the flag; every option is declared once."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import minimal_study
import pandas as pd
import pytest
import torch
from test_public import OPTIONED, target

import probekit
from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.core.options import REQUIRED, Command, declaration, options_of
from probekit.datasets.crowd_envent import SAMPLE_ROOT
from probekit.run import runner
from probekit.studies import get_study
from probekit.studies.intergroup.study import IntergroupStudy

PACKAGE = Path(probekit.__file__).parent


class Elsewhere(IntergroupStudy):
    """An unregistered copy of intergroup under a registered study's name: the object given must
    be the one used, not the registered `isear`."""

    name = "isear"

    def mechanism_items(self, options, context):
        raise ProbekitError(f"the object was used for {context.command}")


def no_load(*args, **kwargs):
    raise AssertionError("a model was loaded")


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr("probekit.engines.load_engine", no_load)


def test_python_values_are_taken_as_they_are():
    """A torch.dtype and a device-map dict, as `load_engine` takes them, held as the command
    line's options hold them."""
    built = runner("run").build(
        {
            "dtype": torch.bfloat16,
            "device_map": {"": "cpu"},
            "shard": (1, 2),
            "out": Path("runs/x"),
            "days": 3,
        },
        "run_study",
        minimal_study.STUDY,
    )
    (model,) = built.models
    assert (model.dtype, model.device_map) == ("bfloat16", {"": "cpu"})
    assert (built.own.shard, built.own.out, built.study.days) == ((1, 2), Path("runs/x"), 3)
    argv = ["--dtype", "bf16", "--device-map", '{"": "cpu"}', "--shard", "1/2"]
    parsed = runner("run").parse(
        [*argv, "--out", "runs/x", "--days", "3"], "probekit run minimal", minimal_study.STUDY
    )
    assert parsed == built
    cpu = runner("run").build({"device": torch.device("cpu")}, "run_study", minimal_study.STUDY)
    assert cpu.model.device == "cpu"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: probekit.run_study(
                minimal_study.STUDY, probekit.ModelOptions(dtype=torch.bfloat16), days=0
            ),
            "days must be at least 1 (got 0)",
        ),
        (
            lambda: probekit.run_study(
                minimal_study.STUDY, probekit.ModelOptions(device_map={"": "gpu0"})
            ),
            "device_map: unknown device 'gpu0'",
        ),
        (
            lambda: probekit.patch_study(Elsewhere(), probekit.ModelOptions(dtype=torch.int8)),
            "dtype: 'int8' is not a dtype",
        ),
        (
            lambda: probekit.capture_study(
                Elsewhere(), probekit.ModelOptions(device_map={"": "cpu"}), batch_size=-1
            ),
            "batch_size must be at least 1 (got -1)",
        ),
        (
            lambda: probekit.steer_study(Elsewhere(), layer=[3]),
            "unknown keyword layer for steer_study('isear'); did you mean layers?",
        ),
        (
            lambda: probekit.patch_study(Elsewhere(), layers=range(2)),
            "the object was used for patch",
        ),
        (
            lambda: probekit.capture_study(
                Elsewhere(), probekit.ModelOptions(dtype=torch.float32), events=1
            ),
            "the object was used for capture",
        ),
        (lambda: probekit.steer_study(Elsewhere(), alphas=[1]), "the object was used for steer"),
    ],
)
def test_the_api_names_the_keyword_and_uses_the_study_object(no_model, tmp_path, call, message):
    with pytest.raises(ProbekitError) as refused:
        call()
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_an_unregistered_study_runs_where_a_registered_one_of_its_name_would_not(no_model):
    """The registered isear has no `--days`: the object's own options are read."""
    with pytest.raises(ProbekitError, match="days must be at least 1"):
        probekit.run_study(type("Days", (minimal_study.MinimalStudy,), {"name": "isear"})(), days=0)


BAD_BATCH = [
    ["run", "minimal"],
    ["patch", "intergroup"],
    ["capture", "intergroup"],
    ["steer", "intergroup"],
    ["score", "--prompts", "p.jsonl", "--answers", "0-10", "--scores", "o.parquet"],
    ["plan", "--model", "default", "--devices", "cpu=1GiB"],
]


@pytest.mark.parametrize("argv", BAD_BATCH, ids=lambda argv: argv[0])
def test_every_command_refuses_a_bad_value_in_the_same_words(argv, capsys, monkeypatch):
    monkeypatch.setitem(probekit.studies.base._REGISTRY, "minimal", minimal_study.STUDY)
    assert cli.main([*argv, "--batch-size", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "probekit: error: --batch-size must be at least 1 (got 0)"
    assert cli.main([*argv, "--batch-size", "x"]) == 2
    assert capsys.readouterr().err.strip() == "probekit: error: --batch-size: 'x' is not an integer"


@pytest.mark.parametrize(
    "call",
    [
        lambda: probekit.run_study(minimal_study.STUDY, batch_size=0),
        lambda: probekit.patch_study("intergroup", batch_size=0),
        lambda: probekit.capture_study("intergroup", batch_size=0),
        lambda: probekit.steer_study("intergroup", batch_size=0),
        lambda: probekit.score("no-such-model", ["x"], "0-10", batch_size=0),
        lambda: probekit.plan("default", "cpu=1GiB", batch_size=0),
        lambda: probekit.patch("no-such-model", [], spans=["x"], answers="0-10", batch_size=0),
        lambda: probekit.capture("no-such-model", ["x"], batch_size=0),
        lambda: probekit.steer(
            "no-such-model", ["x"], [0.0], layers=[0], alphas=[1], answers="0-10", batch_size=0
        ),
    ],
)
def test_every_function_refuses_it_in_the_same_words_with_the_keyword(no_model, call):
    with pytest.raises(ProbekitError) as refused:
        call()
    assert str(refused.value) == "batch_size must be at least 1 (got 0)"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: probekit.score("m", ["x"], answer="0-10"),
            "unknown keyword answer for score(); did you mean answers?",
        ),
        (lambda: probekit.load_engine("default", dtpye="bf16"), "did you mean dtype?"),
        (lambda: probekit.load_engine("default", dtype="int8"), "dtype: 'int8' is not a dtype"),
        (
            lambda: probekit.plan("default", "cpu=1GiB", prompt_token=8),
            "did you mean prompt_tokens",
        ),
        (lambda: probekit.capture("m", ["x"], layer=[0]), "did you mean layers?"),
        (
            lambda: probekit.steer("m", ["x"], [0.0], layers=[0], alpha=[1], answers="0-10"),
            "did you mean alphas?",
        ),
        (lambda: probekit.patch("m", [], spans="x", answers="0-10"), "spans must be a list"),
        (lambda: probekit.score("m", ["x"]), "score(): missing a required argument: 'answers'"),
        (lambda: probekit.score("m", ["x"], "0-10", epsilon="0"), "epsilon: '0' is not a number"),
    ],
)
def test_public_functions_check_their_keywords(call, message):
    with pytest.raises(ProbekitError) as refused:
        call()
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_seed_batch_size_and_out_are_declared_once():
    """Every command's seed, batch size and out folder come from one declaration each."""
    from probekit.core.shared_options import BatchSizeOption, OutOption, SeedOption

    intergroup = get_study("intergroup")
    commands = [runner(name).options(intergroup) for name in ("run", "patch", "capture", "steer")]
    for command in commands:
        fields = {name: field for name, (_, field) in command.taken().items()}
        assert fields["seed"] is options_of(SeedOption)[0]
        assert fields["batch_size"] is options_of(BatchSizeOption)[0]
        assert fields["out"] is options_of(OutOption)[0]


def test_an_unwritable_out_is_refused_by_every_command_before_any_work(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    out = str(tmp_path / "file" / "x")
    for argv in (
        ["run", "intergroup"],
        ["patch", "intergroup"],
        ["capture", "intergroup"],
        ["steer", "intergroup"],
    ):
        assert cli.main([*argv, "--out", out]) == 2
        assert "--out " + out + ": " in capsys.readouterr().err
    with pytest.raises(ProbekitError, match=r"^out .*is a file, not a folder"):
        probekit.patch_study("intergroup", out=tmp_path / "file")


def test_no_option_is_declared_outside_the_dataclasses():
    """The package adds no argparse argument by hand: only the top-level dispatch of
    `probekit COMMAND` (cli/main.py) and the generator (core/options.py) call add_argument or
    add_parser."""
    calls = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("add_argument", "add_parser"):
                calls.append(path.relative_to(PACKAGE).as_posix())
    assert set(calls) <= {"core/options.py", "cli/main.py"}, calls
    assert calls.count("cli/main.py") == 1  # the commands' names, for `probekit --help`


def test_per_command_defaults_and_commands():
    """An option declared for some commands only; another with a default per command."""
    isear = get_study("isear")
    run = runner("run").options(isear)
    patch = runner("patch").options(isear)
    assert "temperature" in run.taken() and "temperature" not in patch.taken()
    giebench = get_study("giebench")
    assert runner("run").build({}, "f", giebench).study.prompt == ["raw", "id", "cot"]
    assert runner("patch").build({}, "f", giebench).study.prompt == ["cot"]
    with pytest.raises(ProbekitError, match=r"^f: temperature is an option of run only"):
        patch.build({"temperature": 1.0}, "f")
    with pytest.raises(ProbekitError, match="--genders: needs at least two genders"):
        run.parse(["--genders", "a man"], "probekit run isear")
    capture = runner("capture")
    assert capture.build({}, "f", isear).own.batch_size == 8  # the capture command's own default


@dataclass(frozen=True)
class Group:
    """Group."""


def test_a_command_without_options_refuses_any():
    with pytest.raises(ProbekitError, match="unrecognized arguments: --x"):
        Command("studies", (Group,)).parse(["--x"], "probekit studies")
    assert cli.main(["studies"]) == 0


@pytest.mark.slow
def test_a_script_runs_an_unregistered_study_with_a_torch_dtype_and_a_device_map(tmp_path):
    """The issue's script: a `torch.dtype`, a device-map dict and a `Study` object."""
    run = probekit.run_study(
        minimal_study.STUDY,
        probekit.ModelOptions("default", dtype=torch.float32, device_map={"": "cpu"}),
        days=2,
        out=tmp_path / "run",
        numerics=0,
    )
    assert run.manifest["dtype"] == "float32" and run.manifest["study"] == "minimal"
    assert "minimal" not in probekit.studies.base._REGISTRY and len(run.scores) == 4


@pytest.mark.slow
def test_capture_and_patch_take_an_unregistered_study_object(smol, tmp_path):
    class Copy(IntergroupStudy):
        name = "intergroup-copy"

    study = Copy()
    acts = probekit.capture_study(
        study,
        smol,
        out=tmp_path / "capture",
        limit=36,  # one event
        layers=[0],
        sites=["resid_pre"],
        spans=["experiencer"],
        data=SAMPLE_ROOT,
    )
    assert set(acts.index["span"]) == {"experiencer"} and len(acts.index) > 0
    result = probekit.patch_study(
        study,
        smol,
        out=tmp_path / "patch",
        limit=25,  # one event: its 5 x 5 named pairs
        layers=range(1),
        sites=["resid_pre"],
        spans=["experiencer"],
        skip_direction=True,
        bootstrap=10,
        data=SAMPLE_ROOT,
    )
    assert isinstance(result.table, pd.DataFrame) and set(result.table["layer"]) == {0}


def test_checks_that_need_the_items_name_the_keyword_too(no_model, capsys):
    """The patch's own checks, after the study's items and before the model, in the words of
    the front end that was used."""
    options = {"method": "attribution", "mediation": True, "events": 1, "data": SAMPLE_ROOT}
    with pytest.raises(ProbekitError, match="^mediation needs exactly measured components: use "):
        probekit.patch_study("intergroup", **options)
    argv = ["--method", "attribution", "--mediation", "--events", "1", "--data", str(SAMPLE_ROOT)]
    assert cli.main(["patch", "intergroup", *argv]) == 2
    assert "error: --mediation needs exactly measured components: use --method exact" in (
        capsys.readouterr().err
    )


# One home per default: each public signature's option defaults are their declarations'


@pytest.mark.parametrize("name", OPTIONED)
def test_each_public_default_is_its_declarations(name):
    """A public signature's option defaults, written in its source, are their declarations'
    (as the function's command has them): an IDE shows the default the command line uses."""
    function = target(name)
    facts = function.__public__
    shown = inspect.signature(function).parameters
    for option, field in facts.fields.items():
        wanted = declaration(field).default_for(facts.command)
        wanted = inspect.Parameter.empty if wanted is REQUIRED else wanted
        assert shown[option].default == wanted, (name, option, shown[option].default, wanted)


# One meaning per option name, and the spelling of options of earlier versions


def _option_help(argv: list[str], name: str, capsys) -> str:
    """The help text of the option `name` in `probekit ARGV --help`, on one line."""
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    block = re.search(rf"\n  {name}\b[^\n]*\n((?:\s{{20,}}[^\n]*\n)*)", text)
    assert block is not None, (argv, name)
    return " ".join(block.group(0).split())


def test_each_command_states_only_its_own_meaning_of_events_and_limit(capsys):
    """`--events` is intergroup's events per emotion on every command; `--limit` the smallest
    balanced slice everywhere, each command's help giving its own default only."""
    run, patch = ["run", "intergroup"], ["patch", "intergroup"]
    events = {tuple(argv): _option_help(argv, "--events", capsys) for argv in (run, patch)}
    assert len(set(events.values())) == 1 and "events per emotion" in events[tuple(run)]
    assert not re.search(r"\b(run|patch|capture|steer|lens)\b", events[tuple(run)])
    run_limit, patch_limit = (_option_help(argv, "--limit N", capsys) for argv in (run, patch))
    for text in (run_limit, patch_limit):
        assert "smallest balanced slice" in text
        assert not re.search(r"\b(run|patch|capture|steer|lens)\b", text)
    assert "every prompt" in run_limit and "first 2 units" not in run_limit
    assert "first 2 units" in patch_limit and "every prompt" not in patch_limit


def test_tolerance_help_lists_every_precision_tier(capsys):
    """`--tolerance` lists the tiers that exist (the float16 and +head tiers too), in order."""
    from probekit.engines.hf.precision import TIERS

    text = _option_help(["score"], "--tolerance T", capsys)
    assert ", ".join(TIERS) in text


def test_scorer_options_made_in_code_are_checked_by_their_kinds():
    """`ScorerOptions` (what `VllmEngine.scorer` makes from its keywords) refuses as it is made,
    one line naming the keyword, by the option's kind."""
    from probekit.engines.options import ScorerOptions

    assert ScorerOptions(batch_size=2, temperature=1).temperature == 1.0
    for keywords, line in [
        ({"batch_size": 0}, "batch_size must be at least 1 (got 0)"),
        ({"settled": 3}, "settled must be a function (got 3)"),
        ({"bogus": 1}, "unknown keyword bogus for ScorerOptions()"),
    ]:
        with pytest.raises(ProbekitError, match=f"^{re.escape(line)}"):
            ScorerOptions(**keywords)
