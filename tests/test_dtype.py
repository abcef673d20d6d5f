"""Numerics on the real default model: the float32 default, bfloat16 within the tolerance the
README states, float64 scoring (the reference), the float32 answer head, and the noise figure a
run records in its manifest and summary."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import probekit
from probekit.core.errors import ProbekitError
from probekit.engines.hf import precision
from probekit.engines.hf.model import load_model, pick_dtype

# The tolerances the README states for bfloat16 (float32 final norm and LM head) against
# float32, from benchmarks/dtype.py: the largest per-prompt |Δp| over the ISEAR, GIEBench and
# JaEm-ST slices was 0.033 (x1.5 margin); issue 30 measured |Δ expected 0-100| up to 0.58 on 36
# intergroup prompts (x2.5 margin).
BF16_MAX_PROB_DIFF = 0.05
BF16_MAX_EXPECTED_DIFF = 1.5
FP64_MAX_PROB_DIFF = 1e-5


def _prompts(model, study: str, argv: list[str], count: int):
    from probekit.cli.main import study_command
    from probekit.core.options import flag
    from probekit.run.options import run_context
    from probekit.studies.base import get_study

    chosen = get_study(study)
    models, run, own = study_command("run", chosen).parse(argv, f"probekit run {study}")
    probe = chosen.probes(own, run_context(run, models[0], flag, lambda *a, **k: None))[0]
    items = [item for _, item in zip(range(count), probe.items(), strict=False)]
    return probe, [model.encode(item, probe.as_string).input_ids for item in items]


@pytest.fixture(scope="module")
def bf16():
    return load_model("default", dtype="bfloat16")


def test_pick_dtype_names_and_the_default_per_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert pick_dtype(cpu) == torch.float32
    assert pick_dtype(cpu, "bf16") == torch.bfloat16
    assert pick_dtype(cuda, "float64") == torch.float64
    with pytest.raises(ProbekitError, match="unknown dtype 'fp8'"):
        pick_dtype(cpu, "fp8")
    monkeypatch.setattr("probekit.engines.hf.model.device_memory", lambda device: 80 * 2**30)
    assert pick_dtype(cuda, n_parameters=8 * 10**9) == torch.float32  # 32 GB of 80 GB
    assert pick_dtype(cuda, n_parameters=14 * 10**9) == torch.bfloat16  # 56 GB: too much
    assert pick_dtype(cuda) == torch.bfloat16  # size unknown


@pytest.mark.slow
def test_bfloat16_keeps_the_final_norm_and_head_in_float32(smol, bf16):
    assert bf16.dtype == torch.bfloat16
    assert bf16.meta["fp32_parts"] == ["final norm", "LM head"]
    assert bf16.hf.get_output_embeddings().weight.dtype == torch.float32
    assert bf16.hf.get_input_embeddings().weight.dtype == torch.bfloat16
    assert bf16.hf.model.norm.weight.dtype == torch.float32
    hidden = bf16.hf.model(input_ids=torch.tensor([[1, 2, 3]])).last_hidden_state
    assert hidden.dtype == torch.float32  # the head reads an unrounded hidden state
    assert "fp32_parts" not in smol.meta and smol.dtype == torch.float32


@pytest.mark.slow
def test_bfloat16_scores_within_the_stated_tolerance_of_float32(smol, bf16):
    for study, argv, count in [
        ("isear", ["--events", "2"], 6),
        ("intergroup", ["--events", "1"], 3),
    ]:
        probe, prompts = _prompts(smol, study, argv, count)
        ours = list(bf16.scorer(probe.answers).score(prompts))
        ref = list(smol.scorer(probe.answers).score(prompts))
        diff = precision.score_differences(ours, ref, numeric=probe.answers.numeric)
        assert diff["max_prob_diff"] <= BF16_MAX_PROB_DIFF, (study, diff)
        assert diff["max_valid_mass_rel_diff"] <= 0.25, (study, diff)
        if probe.answers.numeric:
            assert diff["max_abs_diff"] <= BF16_MAX_EXPECTED_DIFF, (study, diff)


@pytest.mark.slow
def test_float64_scoring_is_the_reference(smol):
    probe, prompts = _prompts(smol, "isear", ["--events", "1"], 2)
    wide = load_model("default", dtype="float64")
    assert wide.dtype == torch.float64 and "fp32_parts" not in wide.meta
    ours = list(smol.scorer(probe.answers, epsilon=0.0).score(prompts))
    ref = list(wide.scorer(probe.answers, epsilon=0.0).score(prompts))
    assert all(np.isfinite(r.probs).all() and r.valid_mass > 0 for r in ref)
    diff = precision.score_differences(ours, ref, numeric=False)
    assert diff["max_prob_diff"] <= FP64_MAX_PROB_DIFF
    assert diff["argmax_changes"] == 0


@pytest.mark.slow
def test_noise_figure_restores_the_model(smol):
    probe, prompts = _prompts(smol, "isear", ["--events", "1"], 3)
    before = {n: p.clone() for n, p in smol.hf.named_parameters()}
    figure = precision.noise_figure(smol, prompts, probe.answers, sample=2, seed=1)
    assert figure["dtype"] == "float32" and figure["reference_dtype"] == "float64"
    assert figure["sample"] == 2 and figure["score"] == "probability"
    assert figure["max_abs_diff"] <= FP64_MAX_PROB_DIFF
    assert smol.dtype == torch.float32
    for name, param in smol.hf.named_parameters():
        assert param.dtype == torch.float32 and torch.equal(param, before[name])
    with pytest.raises(ProbekitError, match="at least one prompt"):
        precision.noise_figure(smol, [], probe.answers)


@pytest.mark.slow
def test_run_records_dtype_and_noise_in_manifest_and_summary(tmp_path):
    out = tmp_path / "run"
    probekit.run_study("isear", events=1, out=out, numerics=3)  # 3 prompts: all of them
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "float32"
    numerics = manifest["numerics"]
    assert numerics["dtype"] == "float32" and numerics["reference_dtype"] == "float64"
    assert numerics["sample"] == 3 and numerics["epsilon"] == manifest["epsilon"]
    assert 0 <= numerics["max_abs_diff"] <= FP64_MAX_PROB_DIFF
    assert numerics["argmax_changes"] == 0
    summary = (out / "summary.md").read_text()
    assert "## Numerics" in summary and "scored in float32 on cpu; against float64" in summary
