"""A run's record is its identity: the tolerance a run picks its precision tier by, and the tier
picked, are resume keys (`probekit.core.rundir.RECORDED_ONLY`), so a folder resumed with
another tolerance is refused before the model loads, and rows of two tiers never mix in one run
(on the tiny random model; the run loads no model, `load_engine` hands it over)."""

from __future__ import annotations

import json

import minimal_study
import pytest

import probekit
from probekit.core.errors import ProbekitError
from probekit.core.rundir import RunDir

FAST = {"numerics": 0, "days": 2}


@pytest.fixture
def loads(tiny, monkeypatch):
    """The models loaded by name: each `load_engine` call is recorded and hands over `tiny`."""
    calls: list[dict] = []

    def load(spec, **keywords):
        calls.append(keywords)
        return tiny

    for where in ("probekit.engines.load_engine",):
        monkeypatch.setattr(where, load)
    return calls


def test_a_run_resumed_with_another_tolerance_is_refused_before_loading(loads, tmp_path):
    study, out = minimal_study.MinimalStudy(), tmp_path / "run"
    probekit.run_study(study, "default", out=out, **FAST)
    manifest = RunDir(out).manifest
    assert (manifest["tolerance"], manifest["tier"]) == (0.005, "float32")
    assert manifest["precision"]["tolerance"] == 0.005
    with pytest.raises(ProbekitError, match=r"different tolerance \(0.005, now 0.01\)"):
        probekit.run_study(study, probekit.ModelOptions(tolerance=0.01), out=out, **FAST)
    with pytest.raises(ProbekitError, match=r"different tolerance \(0.005, now None\)"):
        probekit.run_study(study, probekit.ModelOptions(dtype="float32"), out=out, **FAST)
    assert len(loads) == 1  # neither refusal loaded the model
    probekit.run_study(
        study, probekit.ModelOptions(tolerance=0.005), out=out, **FAST
    )  # the same: resumed
    assert RunDir(out).manifest["tolerance"] == 0.005


def test_a_resumed_run_whose_tier_cannot_be_kept_is_refused(tiny, tmp_path):
    """The run was scored in TF32 (on a GPU that offers it); this device offers float32 only,
    so the rows would mix two tiers: refused in one line naming the tier."""
    study, out = minimal_study.MinimalStudy(), tmp_path / "run"
    probekit.run_study(study, tiny, out=out, **FAST)
    folder = RunDir(out)
    record = {**folder.manifest["precision"], "tier": "tf32"}
    folder.update_manifest(tier="tf32", precision=record)
    with pytest.raises(ProbekitError, match=r"different tier \('tf32', now 'float32'\)"):
        probekit.run_study(study, _fresh_tiny(), out=out, **FAST)


def test_a_loaded_model_of_another_tolerance_does_not_resume_the_run(tiny, tmp_path):
    study, out = minimal_study.MinimalStudy(), tmp_path / "run"
    probekit.run_study(study, tiny, out=out, **FAST)
    other = _fresh_tiny()
    other.meta["precision"] = {"tolerance": 0.02, "offered": ["float32"]}
    with pytest.raises(ProbekitError, match=r"different tolerance \(0.005, now 0.02\)"):
        probekit.run_study(study, other, out=out, **FAST)


def test_a_folder_of_an_earlier_probekit_names_the_setting_it_did_not_record(loads, tmp_path):
    study, out = minimal_study.MinimalStudy(), tmp_path / "run"
    probekit.run_study(study, "default", out=out, **FAST)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["tolerance"], manifest["tier"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ProbekitError, match="an earlier probekit, which did not record its"):
        probekit.run_study(study, "default", out=out, **FAST)


def test_a_steering_run_resumed_with_another_tolerance_is_refused_before_loading(loads, tmp_path):
    study, out = minimal_study.MinimalStudy(), tmp_path / "steer"
    steer = {"alphas": [0, 1], "layers": [1], "days": 2, "out": out}
    probekit.steer_study(study, "default", **steer)
    manifest = RunDir(out).manifest
    assert (manifest["tolerance"], manifest["tier"]) == (0.005, "float32")
    with pytest.raises(ProbekitError, match=r"different tolerance \(0.005, now 0.5\)"):
        probekit.steer_study(study, probekit.ModelOptions(tolerance=0.5), **steer)
    assert len(loads) == 1


def _fresh_tiny():
    from probekit.testing.synthetic import tiny_model

    return tiny_model()


def test_score_says_the_tier_it_scored_in(tiny, capsys):
    with pytest.warns(UserWarning, match="weak signal"):  # random weights
        table = probekit.score(tiny, ["How sad, 0 to 10?", "How glad, 0 to 10?"], "0-10")
    record = table.attrs["precision"]
    assert (record["tier"], record["tolerance"]) == ("float32", 0.005)
    assert "probekit: precision: float32 for tolerance 0.005" in capsys.readouterr().err


def test_the_score_command_says_its_tier_on_stderr_and_in_the_file(loads, tiny, tmp_path, capsys):
    import pyarrow.parquet as pq

    from probekit import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "How sad, 0 to 10?"}\n')
    out = tmp_path / "o.parquet"
    argv = ["score", "--prompts", str(prompts), "--answers", "0-10", "--scores", str(out)]
    assert cli.main(argv) == 0
    assert "precision: float32" in capsys.readouterr().err
    stored = json.loads(pq.read_schema(out).metadata[b"probekit.precision"])
    assert stored["tier"] == "float32" == tiny.meta["precision"]["tier"]
