"""Every combination of options that can be refused is refused while the options are read: no
data is read and no model loads first (the loaders here fail the test if they are reached), from
the command line (one line naming the flags) and from Python (naming the keywords)."""

from __future__ import annotations

import importlib

import pytest

import probekit
from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.core.options import as_keywords, options_of
from probekit.studies import list_studies

COMMANDS = importlib.import_module("probekit.cli.main")


@pytest.fixture
def nothing_loads(monkeypatch):
    """Reading a study's data or loading a model fails the test."""

    def loaded(what):
        def fail(*args, **kwargs):
            raise AssertionError(f"{what} before the options were refused")

        return fail

    from probekit.datasets.locate import Dataset

    monkeypatch.setattr(Dataset, "find", loaded("the data was read"))
    for study in list_studies():
        monkeypatch.setattr(type(study), "probes", loaded(f"{study.name}'s items were made"))
        monkeypatch.setattr(
            type(study), "mechanism_items", loaded(f"{study.name}'s items were made")
        )
    monkeypatch.setattr("probekit.engines.load_engine", loaded("a model was loaded"))
    monkeypatch.setattr("probekit.engines.hf.model.load_model", loaded("a model was loaded"))


def refused(argv, capsys) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err


CONFLICTS = [
    (["--dtype", "float32", "--tolerance", "0.01"], "give --dtype or --tolerance, not both"),
    (["--device", "cpu", "--device-map", "auto"], "give --device cpu or --device-map, not both"),
    (["--device", "cpu", "--max-memory", "cpu=1GiB"], "give --device cpu or --max-memory"),
    (["--engine", "vllm", "--tolerance", "0.01"], "--tolerance picks the hf engine's arithmetic"),
]


@pytest.mark.parametrize(("options", "message"), CONFLICTS)
@pytest.mark.parametrize("command", ["run", "steer", "patch", "capture", "score", "setup"])
def test_model_option_conflicts_are_refused_while_parsing(
    command, options, message, nothing_loads, tmp_path, capsys
):
    study = [] if command in ("score", "setup") else ["isear"]
    files = ["--prompts", "p.jsonl", "--answers", "A,B", "--scores", str(tmp_path / "o.parquet")]
    extra = files if command == "score" else []
    assert message in refused([command, *study, *options, *extra], capsys)


def test_vllm_sizes_with_the_hf_engine_are_refused_while_parsing(nothing_loads, capsys):
    err = refused(["run", "isear", "--tensor-parallel-size", "2"], capsys)
    assert "--tensor-parallel-size is vLLM's (--engine vllm)" in err


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: probekit.run_study(
                "isear", probekit.ModelOptions(dtype="bf16", tolerance=0.01)
            ),
            "give dtype or",
        ),
        (
            lambda: probekit.steer_study(
                "isear", probekit.ModelOptions(device="cpu", device_map="auto")
            ),
            "give device",
        ),
        (
            lambda: probekit.patch_study("isear", probekit.ModelOptions(tensor_parallel_size=2)),
            "patch_study",
        ),
        (lambda: probekit.lens_study("isear", dtype="bf16"), "give model=ModelOptions(..., dtype="),
    ],
)
def test_model_option_conflicts_from_python_name_the_keywords(call, message, nothing_loads):
    with pytest.raises(ProbekitError) as error:
        call()
    assert message in str(error.value) and "--" not in str(error.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["steer", "isear", "--hooks", "nnsight", "--positions", "from_span"],
            "--positions from_span steers the answer tokens, which needs --hooks transformer_lens",
        ),
        (["steer", "isear", "--sites", "hook_z"], "attn.hook_z is per attention head"),
        (
            ["patch", "isear", "--method", "attribution", "--mediation"],
            "--mediation needs exactly measured components",
        ),
        (
            ["patch", "isear", "--readout", "tv", "--method", "attribution+verify"],
            "the readout tv compares a pair's two distributions",
        ),
        (["capture", "isear", "--sites", "nowhere"], "unknown site 'nowhere'"),
        (["steer", "isear", "--engine", "vllm"], "--engine vllm"),
        (["run", "isear", "--ray", "--device-map", "auto"], "drop --device-map"),
    ],
)
def test_command_option_conflicts_are_refused_while_parsing(argv, message, nothing_loads, capsys):
    assert message in refused(argv, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["steer", "isear", "--category", "religion"],
            "--category is an option of intergroup; isear takes --events, --data, --genders\n",
        ),
        (
            ["run", "intergroup", "--genders", "a man,a woman"],
            "--genders is an option of isear; intergroup takes --category",
        ),
        (["patch", "isear", "--temperature", "1"], "--temperature is an option of run only"),
        (
            ["run", "giebench", "--data", "x"],
            "--data is an option of intergroup, isear and jaem-st;",
        ),
        (
            ["run", "jaem-st", "--clean", "he"],
            "--clean is an option of patch, capture, steer and lens only",
        ),
        (["steer", "intergroup", "--spans", "x"], "--spans is an option of patch and capture"),
    ],
)
def test_an_option_of_another_study_or_command_is_named_as_such(
    argv, message, nothing_loads, monkeypatch, capsys
):
    """Said before the command's module (and torch) is imported: `probekit steer isear` with an
    intergroup option answers at once, not after the model library loads."""
    if "--spans" not in argv:  # a command option: known once the command's options are
        monkeypatch.setattr(COMMANDS, "runner", lambda name: pytest.fail("imported"))
    err = refused(argv, capsys)
    assert message in err and "did you mean" not in err


def test_an_option_of_another_study_from_python_names_the_keyword(nothing_loads):
    with pytest.raises(ProbekitError, match=r"^steer_study\('isear'\): category is an option of "):
        probekit.steer_study("isear", category="religion")
    with pytest.raises(ProbekitError, match="isear takes events, data, genders, temperature"):
        probekit.run_study("isear", category="religion")


def test_no_study_option_shares_a_name_with_a_command_option():
    """Another study's option is named as such without the command's own options at hand (see
    the test above): so no study may declare an option a command declares."""
    from probekit.engines.options import ModelOptions, ScoreOptions
    from probekit.mechanism.pipeline import CaptureOptions, PatchOptions
    from probekit.mechanism.steering import SteerOptions
    from probekit.run.loop import RunOptions

    groups = (ModelOptions, ScoreOptions, RunOptions, PatchOptions, CaptureOptions, SteerOptions)
    commands = {f.name for group in groups for f in options_of(group)}
    for study in list_studies():
        shared = commands & {f.name for f in options_of(study.options)}
        assert not shared, (study.name, shared)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["scroe", "--model", "default"], "unknown command 'scroe'; did you mean probekit score?"),
        (["stear", "isear"], "did you mean probekit steer?"),
        (["frobnicate"], "unknown command 'frobnicate'; the commands are studies, run, patch"),
        (["run", "intergoup"], "unknown study 'intergoup'; did you mean intergroup?"),
        (["steer", "jaem_st"], "did you mean jaem-st?"),
    ],
)
def test_a_misspelled_command_or_study_is_named_with_the_nearest(argv, message, capsys):
    err = refused(argv, capsys)
    assert message in err and "--model" not in err.split(";")[0]


def test_other_study_option_names_the_owner_and_what_the_study_takes():
    from probekit.studies.base import get_study, other_study_option

    line = as_keywords(other_study_option(get_study("isear"), "steer", "category"))
    assert line == "category is an option of intergroup; isear takes events, data, genders"
    assert other_study_option(get_study("isear"), "steer", "events") is None
    assert other_study_option(get_study("isear"), "steer", "nothing_at_all") is None
