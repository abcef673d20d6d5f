"""The engine seam: the transformers engine satisfies the protocol, engines are picked by name,
a new engine is one module and one registration (docs/extending.md's, run on a study without
the transformers engine), and bad engine names or an engine without hooks give one line."""

from __future__ import annotations

import importlib.abc
import json
import sys

import pandas as pd
import pytest
import torch
from conftest import REPO
from examples import python_blocks

import probekit
from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import Item
from probekit.engines import ENGINES, load_engine
from probekit.engines.base import Engine, Scorer, ScoreResult, hooks_unavailable
from probekit.engines.hf.scorer import run_batched


def test_hf_engine_satisfies_the_protocol(tiny):
    assert isinstance(tiny, Engine)
    assert tiny.engine == "hf"
    scorer = tiny.scorer(AnswerSet.parse("A-E"), epsilon=0.0, batch_size=2)
    assert isinstance(scorer, Scorer)
    encoded = tiny.encode(Item(id="q", text="Pick a letter from A to E. Answer:"))
    (result,) = scorer.score([encoded.input_ids])
    assert isinstance(result, ScoreResult)
    assert result.probs.sum() == pytest.approx(1.0)
    assert tiny.hookable() is tiny
    description = tiny.describe()
    assert description["engine"] == "hf"
    assert description["model"] == tiny.name
    assert description["weights"] == tiny.weights_fingerprint()
    assert description["dtype"] == "float32"


def test_scorer_generates_and_engine_decodes(tiny):
    ids = tiny.encode(Item(id="q", text="Count: one, two,")).input_ids
    scorer = tiny.scorer(AnswerSet.parse("A-E"), max_new_tokens=4)
    (tokens,) = scorer.generate([ids])
    assert 0 < len(tokens) <= 4
    assert tiny.decode([tokens]) == tiny.tokenizer.batch_decode([tokens], skip_special_tokens=True)


def test_unknown_engine_is_one_line():
    with pytest.raises(ProbekitError) as err:
        load_engine("default", engine="no-such-engine")
    message = str(err.value)
    assert "no-such-engine" in message and "hf" in message and "\n" not in message


class HooklessEngine:
    """What an engine without hooks (vLLM) answers."""

    engine = "fake"

    def hookable(self) -> None:
        raise hooks_unavailable(self.engine)


def fake_loader(spec: str, device: str | None = None, dtype: object = None) -> HooklessEngine:
    return HooklessEngine()


def test_registered_engine_is_loaded_by_name_and_refuses_hooks(monkeypatch):
    monkeypatch.setitem(ENGINES, "fake", f"{__name__}:fake_loader")
    engine = load_engine("anything", engine="fake")
    assert isinstance(engine, HooklessEngine)
    with pytest.raises(ProbekitError) as err:
        engine.hookable()
    assert "fake" in str(err.value) and "\n" not in str(err.value)


ENGINE_MODULE = "# probekit/engines/uniform.py"
"""The first line of docs/extending.md's example engine, a module of its own."""
ENGINE_PACKAGES = ("probekit.engines.hf", "probekit.engines.vllm")


class EngineImportRefused(importlib.abc.MetaPathFinder):
    """Refuses to import the engines' own modules (`ENGINE_PACKAGES`)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.startswith(ENGINE_PACKAGES):
            raise ImportError(f"{name} imported by a run on another engine")


def test_a_new_engine_is_one_module_and_one_registration(tmp_path, monkeypatch, minimal):
    """docs/extending.md's uniform engine, written as its own module and registered by one line
    of `ENGINES`, loads through `load_engine` and runs a study's exact scoring through the
    protocol alone (an import of the transformers or vLLM engine's modules is refused here):
    every answer scores 1/11, the gap is 0, and the manifest says there was no tier to choose
    and no noise figure."""
    page = REPO / "docs" / "extending.md"
    (module,) = [b.code for b in python_blocks(page) if b.code.startswith(ENGINE_MODULE)]
    (tmp_path / "uniform_engine.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ENGINES, "uniform", "uniform_engine:load_uniform")
    for name in [m for m in sys.modules if m.startswith(ENGINE_PACKAGES)]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [EngineImportRefused(), *sys.meta_path])
    engine = load_engine("null", engine="uniform")
    out = tmp_path / "run"
    run = probekit.run_study(minimal, engine, out=out, days=2, numerics=2, quiet=True)
    assert run.summary["gap"].tolist() == [0.0]
    scores = pd.read_parquet(out / "scores.parquet")
    probs = scores[[f"p::{k}" for k in range(11)]].to_numpy()
    assert len(scores) == 4 and (probs == 1 / 11).all() and (scores["expected"] == 5).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"] == "uniform" and manifest["precision"] is manifest["tier"] is None
    assert manifest["numerics"] == {"dtype": "none", "note": "not measured"}


def test_batches_back_off_on_out_of_memory():
    """A batch that runs out of CUDA memory is retried at half the size; outputs keep the input
    order, and the new size is reported."""
    prompts = [[i] * (1 + i % 3) for i in range(10)]
    sizes, shrunk = [], []

    def run(batch):
        sizes.append(len(batch))
        if len(batch) > 2:
            raise torch.cuda.OutOfMemoryError("fake")
        return [p[0] for p in batch]

    out = list(run_batched(prompts, run, batch_size=8, shrink=shrunk.append))
    assert out == list(range(10))
    assert shrunk == [4, 2]
    assert sizes[:3] == [8, 4, 2] and max(sizes[3:]) == 2


@pytest.fixture(scope="module")
def tiny():
    from conftest import tiny_llama

    return tiny_llama()


def test_the_scorer_plans_each_windows_batch_and_keeps_a_halved_one(tiny, monkeypatch):
    """Without a batch size the scorer asks the plan for each window's longest prompt plus the
    answer positions; an out-of-memory error caps every later batch; a given size is kept."""
    from probekit.engines.hf.scorer import PROMPT_HINT

    asked = []

    def plan(model, tokens):
        asked.append(tokens)
        return 8 if tokens < 40 else 4

    monkeypatch.setattr("probekit.engines.hf.scorer.planned_batch", plan)
    answers = AnswerSet.parse("A-E")  # 10 answer positions below the root
    scorer = tiny.scorer(answers, epsilon=0.0)
    assert asked == [PROMPT_HINT + 10] and scorer.batch_size == 4
    short, long = [[100 + i, 200, 300] for i in range(6)], [[100 + i] * 40 for i in range(6)]
    assert len(list(scorer.score(short))) == 6 and scorer.batch_size == 8 and asked[-1] == 13
    assert len(list(scorer.score(long))) == 6 and scorer.batch_size == 4 and asked[-1] == 50
    sizes = []

    def refuse(module, args, kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("fake")

    handle = tiny.hf.model.register_forward_pre_hook(refuse, with_kwargs=True)
    try:
        assert len(list(scorer.score(short))) == 6
    finally:
        handle.remove()
    assert scorer.batch_size == 2 and sizes[:3] == [6, 4, 2]  # 6 prompts: one batch of 6
    assert len(list(scorer.score(short))) == 6 and scorer.batch_size == 2  # capped from now on
    fixed = tiny.scorer(answers, batch_size=3)
    list(fixed.score(long))
    assert fixed.batch_size == 3 and asked[-1] == 13  # not planned again
