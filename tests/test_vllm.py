"""The vllm engine: its greedy generation with the study's budget and stop rule gives the responses
and parsed answers of the transformers engine on a small intergroup slice, while every exact
column stays the transformers engine's.

vLLM is not installed in the environment the rest of the suite uses (its CPU build pins
transformers<5.20 and pulls CUDA builds of torchvision): the tests that need it run in the
environment that `./setup.sh --vllm` makes. From the main environment,
`test_vllm_tests_pass_in_the_vllm_environment` runs this file there (the README's test command
makes that environment, so CI runs them); the tests that check what a user without vLLM sees run
here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from conftest import DATA_ROOT, REPO, answering_prompts, religion_probe

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.engines import load_engine
from probekit.engines.vllm import VllmEngine, cross_check, vllm_answer_mass, vllm_env

HAS_VLLM = importlib.util.find_spec("vllm") is not None
VLLM_REASON = "vLLM is not installed here (it is in the ./setup.sh --vllm environment)"
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason=VLLM_REASON)
PROMPTS = 16
VLLM_PYTHON = vllm_env() / "bin" / "python"


def vllm_env_ready() -> bool:
    """Whether `./setup.sh --vllm` made the second environment (vLLM importable there)."""
    if not VLLM_PYTHON.is_file():
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([VLLM_PYTHON, "-c", probe]).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(HAS_VLLM, reason="this is the vLLM environment: its tests run directly")
def test_vllm_tests_pass_in_the_vllm_environment(tmp_path):
    """This file's vLLM tests, run by the vLLM environment's Python: every one passes (none
    skipped), and the agreement figure they print is shown here."""
    if not vllm_env_ready():
        pytest.skip(f"no vLLM environment at {vllm_env()} (./setup.sh --vllm makes it)")
    report = tmp_path / "junit.xml"
    done = subprocess.run(
        [
            VLLM_PYTHON,
            "-m",
            "pytest",
            __file__,
            "-q",
            "-s",
            "-n",
            "0",  # one process: vLLM engines side by side would share the same cores
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcomes = {
        case.get("name"): {child.tag for child in case} & {"skipped", "failure", "error"}
        for case in ET.parse(report).getroot().iter("testcase")
    }
    needing = [
        name
        for name, fn in globals().items()
        if any(mark.kwargs.get("reason") == VLLM_REASON for mark in getattr(fn, "pytestmark", []))
    ]
    assert len(needing) >= 3 and all(outcomes.get(name) == set() for name in needing), outcomes


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed, so its absence cannot be shown here")
def test_missing_vllm_names_the_setup_command():
    with pytest.raises(ProbekitError, match=r"\./setup\.sh --vllm"):
        load_engine("default", engine="vllm")


@pytest.mark.slow
@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed, so nothing is re-run elsewhere")
def test_without_vllm_the_command_runs_in_the_vllm_environment(tmp_path):
    """`probekit run ... --engine vllm` from an environment without vLLM re-runs the same command
    with the vLLM environment's Python (a stand-in here that prints what it was given), on this
    checkout's probekit."""
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "ran: $*"\necho "path: $PYTHONPATH"\n')
    fake.chmod(0o755)
    code = (
        "import sys; from probekit.engines.vllm import run_in_vllm_env; "
        "run_in_vllm_env(['/usr/bin/probekit', 'run', 'intergroup', '--engine', 'vllm']); "
        "print('not replaced')"
    )
    env = {**os.environ, "PROBEKIT_VLLM_ENV": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    ran, path = done.stdout.strip().splitlines()
    assert ran == "ran: -m probekit.cli run intergroup --engine vllm"
    assert path.removeprefix("path: ").split(os.pathsep)[0] == str(REPO)  # this checkout's code
    assert str(tmp_path) in done.stderr


@pytest.mark.parametrize("command", ["patch", "capture"])
def test_mechanism_commands_refuse_vllm_in_one_line(capsys, command):
    from probekit import cli

    assert cli.main([command, "intergroup", "--engine", "vllm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no hookable model" in err[0]


@pytest.fixture(scope="module")
def engine():
    """The default model on vLLM (its tests are `default_model`)."""
    return load_engine("default", engine="vllm")


@pytest.fixture(scope="module")
def probe():
    return religion_probe(2)


@pytest.fixture(scope="module")
def prompts(engine, probe):
    """16 study prompts, every other one ending with a phrase after which the model writes a
    number (so that the stop rule cuts those rows early)."""
    return answering_prompts(engine, probe, PROMPTS)


@needs_vllm
@pytest.mark.default_model
def test_vllm_generate_matches_transformers(engine, probe, prompts):
    budget = dict(max_new_tokens=probe.max_new_tokens, settled=probe.settled)
    ours = list(engine.scorer(probe.answers, **budget).score(prompts))
    theirs = list(engine.exact.scorer(probe.answers, **budget).score(prompts))
    responses = [engine.decode([r.generated for r in rs]) for rs in (ours, theirs)]
    parsed = [[probe.parse(text) for text in texts] for texts in responses]
    same_text = sum(a == b for a, b in zip(*responses, strict=True)) / len(prompts)
    same_parse = sum(a == b for a, b in zip(*parsed, strict=True)) / len(prompts)
    print(
        f"vLLM vs transformers on {len(prompts)} prompts: identical responses {same_text:.0%}, "
        f"identical parsed answers {same_parse:.0%}"
    )
    assert same_parse >= 0.9  # fp32 near-ties may flip a token on a few rows
    assert any(p is not None for p in parsed[0])  # the lead phrase made some rows answer
    for a, b in zip(ours, theirs, strict=True):  # the exact view is the transformers engine's
        assert a.greedy == b.greedy and abs(a.valid_mass - b.valid_mass) <= 1e-9


@needs_vllm
@pytest.mark.default_model
def test_vllm_engine_describes_its_columns_and_has_no_hooks(engine):
    described = engine.describe()
    assert described["engine"] == "vllm" and "response" in described["columns"]["vllm"]
    with pytest.raises(ProbekitError, match="no hookable model"):
        engine.hookable()


@needs_vllm
@pytest.mark.default_model
def test_vllm_log_probabilities_give_the_exact_number_scores(engine, prompts):
    """The optional cross-check: 0-10 read node by node from vLLM's log-probabilities equals the
    transformers engine's exact scores of the same token ids."""
    table = cross_check(engine, AnswerSet.parse("0-10"), prompts[:2])
    print(f"vLLM's exact 0-10 against the hf engine's: {table.to_dict('list')} {table.attrs}")
    relative = (table["valid_mass_vllm"] / table["valid_mass_hf"] - 1).abs()
    assert relative.max() <= 1e-4 and table["max_abs_dp"].max() <= 1e-4
    assert table["abs_d_expected"].max() <= 1e-3 and table.attrs["vllm_requests"] == 2 * 24


@pytest.mark.slow
def test_vllm_cross_check_refuses_words_in_one_line(smol):
    """Letters and words cannot be read through vLLM's 128 log-probabilities (checked before vLLM
    is needed, so this runs where vLLM is not installed)."""
    with pytest.raises(ProbekitError, match="number answers only"):
        vllm_answer_mass(VllmEngine(smol), AnswerSet.parse("A-E"), [[1, 2, 3]])


def run_isear(out: Path, *extra: str) -> pd.DataFrame:
    """`probekit run isear --mode generate --engine vllm` on 4 prompts (ISEAR: the smallest real
    slice of a study) into `out`, with ISEAR's parse on NLTK's punkt tables (`NEEDS_PUNKT`);
    its rows."""
    data = DATA_ROOT
    options = ["--view", "generate", "--engine", "vllm", "--events", "2", *extra]
    options += ["--genders", "a man,a woman", "--data", str(data), "--out", str(out)]
    command = [sys.executable, "-m", "probekit.cli", "run", "isear", *options]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return pd.read_parquet(out / "scores.parquet")


NEEDS_PUNKT = pytest.mark.reference_data("nltk/tokenizers/punkt_tab/english")


@pytest.fixture(scope="module")
def isear_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("isear") / "run"
    run_isear(out)
    return out


@needs_vllm
@NEEDS_PUNKT
def test_generate_run_on_vllm_says_which_engine_wrote_which_column(isear_run):
    """End to end on `--engine vllm`: every row has vLLM's response and its parse beside the
    exact columns, and the manifest names the engine of each column and vLLM's version."""
    manifest = json.loads((isear_run / "manifest.json").read_text())
    assert manifest["engine"] == "vllm" and "response" in manifest["columns"]["vllm"]
    assert manifest["columns"]["vllm_version"].startswith("vllm")
    rows = pd.read_parquet(isear_run / "scores.parquet")
    assert len(rows) == 4 and rows["response"].str.len().gt(0).all()
    assert {"parsed", "valid_mass", "p::joy"} <= set(rows.columns)
    assert (isear_run / "report.html").is_file()


@pytest.mark.skipif(
    not HAS_VLLM or importlib.util.find_spec("ray") is None,
    reason="needs vLLM and Ray in one environment (./setup.sh --vllm --ray)",
)
@NEEDS_PUNKT
def test_vllm_engines_in_ray_actors_write_the_same_rows(isear_run, tmp_path):
    """`--ray --engine vllm`: a vLLM engine in a Ray actor gives the same responses, parses and
    exact probabilities as the run in one process."""
    ours = run_isear(tmp_path / "ray", "--ray", "--ray-actors", "1")
    theirs = pd.read_parquet(isear_run / "scores.parquet")
    assert ours["response"].tolist() == theirs["response"].tolist()
    assert ours["parsed"].fillna("").tolist() == theirs["parsed"].fillna("").tolist()
    columns = [c for c in theirs.columns if c.startswith("p::")]
    assert (ours[columns] - theirs[columns]).abs().to_numpy().max() <= 1e-6
