"""Numerics: on the real default model the float32 default, bfloat16 within the tolerance the
README states, float64 scoring (the reference), the float32 answer head, and the noise figure a
run records in its manifest and summary; the precision tiers (`--tolerance`): float32 alone on a
CPU, TF32 rounding, the pick on a fake device that offers every tier (a tiny random model) and
the tiers' errors measured on the default model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import probekit
from probekit.core.errors import ProbekitError
from probekit.engines.base import describe_precision
from probekit.engines.hf import precision
from probekit.engines.hf.model import load_model
from probekit.engines.plan import plan_dtype

# The tolerances the README states for bfloat16 (float32 final norm and LM head) against
# float32, from benchmarks/dtype.py: the largest per-prompt |Δp| over the ISEAR, GIEBench and
# JaEm-ST slices was 0.033 (x1.5 margin); issue 30 measured |Δ expected 0-100| up to 0.58 on 36
# intergroup prompts (x2.5 margin).
BF16_MAX_PROB_DIFF = 0.05
BF16_MAX_EXPECTED_DIFF = 1.5
FP64_MAX_PROB_DIFF = 1e-5


def _prompts(model, study: str, argv: list[str], count: int):
    from probekit.run import runner
    from probekit.studies.base import get_study

    chosen = get_study(study)
    run = runner("run")
    options = run.parse(argv, f"probekit run {study}", chosen)
    probe = chosen.probes(options.study, run.context(options, lambda *a, **k: None))[0]
    items = [item for _, item in zip(range(count), probe.items(), strict=False)]
    return probe, [model.encode(item, probe.as_string).input_ids for item in items]


@pytest.fixture(scope="module")
def bf16():
    return load_model("default", dtype="bfloat16")


def test_the_dtype_policy_names_and_the_default_per_device():
    """`plan_dtype`, the loader's and the plan's policy: `memory` None is the CPU."""
    assert plan_dtype(None, None) == "float32"
    assert plan_dtype(None, None, "bf16") == "bfloat16"
    assert plan_dtype(None, 80 * 2**30, "float64") == "float64"
    assert plan_dtype(None, None, torch.float16) == "float16"
    with pytest.raises(ProbekitError, match="unknown dtype 'fp8'"):
        plan_dtype(None, None, "fp8")
    gpu = 80 * 2**30
    assert plan_dtype(8 * 10**9, gpu) == "float32"  # 32 GB of 80 GB
    assert plan_dtype(14 * 10**9, gpu) == "bfloat16"  # 56 GB: too much
    assert plan_dtype(None, gpu) == "bfloat16"  # size unknown


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
    assert diff["most_probable_changes"] == 0


@pytest.mark.slow
def test_noise_figure_restores_the_model(smol):
    probe, prompts = _prompts(smol, "isear", ["--events", "1"], 3)
    before = {n: p.clone() for n, p in smol.hf.named_parameters()}
    figure = precision.noise_figure(smol, prompts, probe.answers, sample=2, seed=1, epsilon=0.0)
    assert figure["dtype"] == "float32" and figure["reference_dtype"] == "float64"
    assert figure["sample"] == 2 and figure["score"] == "probability"
    assert figure["max_abs_diff"] <= FP64_MAX_PROB_DIFF
    assert smol.dtype == torch.float32
    for name, param in smol.hf.named_parameters():
        assert param.dtype == torch.float32 and torch.equal(param, before[name])
    with pytest.raises(ProbekitError, match="at least one prompt"):
        precision.noise_figure(smol, [], probe.answers, epsilon=0.0)


@pytest.mark.slow
def test_run_records_dtype_precision_batch_and_noise_in_manifest_and_summary(tmp_path):
    out = tmp_path / "run"
    probekit.run_study("isear", events=2, out=out, numerics=3)  # 3 of its 6 prompts
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "float32"
    numerics = manifest["numerics"]
    assert numerics["dtype"] == "float32" and numerics["reference_dtype"] == "float64"
    assert numerics["sample"] == 3 and numerics["epsilon"] == manifest["epsilon"]
    assert 0 <= numerics["max_abs_diff"] <= FP64_MAX_PROB_DIFF
    assert numerics["most_probable_changes"] == 0
    summary = (out / "summary.md").read_text()
    assert "## Numerics" in summary and "scored in float32 on cpu; against float64" in summary
    # the precision tier (a CPU: float32, nothing measured) and the batch the run ended with
    assert manifest["precision"]["tier"] == "float32" and manifest["precision"]["tried"] == []
    assert manifest["batch_size"] == 16
    assert (
        "precision: float32 for tolerance 0.005 (float32 is the fastest arithmetic on cpu: "
        "nothing to choose)" in summary
    )


# ---------------------------------------------------------------- precision tiers (--tolerance)


def _tiny(tie: bool = False, pending: bool = False):
    """The tiny random model; `pending`: as loaded on a device that offers every tier, its
    tier not chosen yet (a fake GPU: the tiers run on the CPU, TF32 emulated)."""
    from conftest import tiny_llama

    from probekit.engines.hf.precision import TIERS
    from probekit.engines.options import DEFAULT_TOLERANCE

    model = tiny_llama(tie=tie)
    if pending:
        model.meta["precision"] = {"tolerance": DEFAULT_TOLERANCE, "offered": list(TIERS)}
    return model


def _tiny_prompts(model, count: int = 3):
    texts = [f"Case {i}: how intense, from 0 to 10? Answer with a number." for i in range(count)]
    return [model.encode(probekit.Item(str(i), text=t)).input_ids for i, t in enumerate(texts)]


@pytest.mark.default_model
def test_a_cpu_offers_float32_alone_and_measures_nothing():
    model = _tiny()
    record = model.meta["precision"]
    assert precision.offered_tiers(model)[0] == ("float32",)
    assert record == {
        "tolerance": precision.DEFAULT_TOLERANCE,
        "offered": ["float32"],
        "tier": "float32",
        "tried": [],
        "note": "float32 is the fastest arithmetic on cpu: nothing to choose",
    }
    answers = probekit.AnswerSet.parse("0-10")
    assert model.settle_precision(answers, _tiny_prompts(model)) is record
    assert model.describe()["precision"] is record
    assert describe_precision(record) == (
        "precision: float32 for tolerance 0.005 (float32 is the fastest arithmetic on cpu: "
        "nothing to choose)"
    )


def test_tf32_rounding_is_to_nearest_with_ties_to_even():
    from probekit.engines.hf.precision import round_tf32

    ulp = 2.0**-10  # TF32's mantissa step at 1
    cases = {
        1 + ulp / 2: 1.0,  # a tie: to the even mantissa
        1 + 3 * ulp / 2: 1 + 2 * ulp,  # a tie: to the even mantissa
        1 + ulp / 2 + 2**-20: 1 + ulp,  # above the tie
        -(1 + ulp / 2 + 2**-20): -(1 + ulp),
        1 + ulp: 1 + ulp,  # already TF32
        2**-130: 2**-130,  # subnormal: its few bits are kept
    }
    x = torch.tensor(list(cases), dtype=torch.float32)
    assert round_tf32(x).tolist() == list(cases.values())
    values = torch.randn(10_000) * 100
    mantissa, exponent = np.frexp(values.double().numpy())
    expected = np.ldexp(np.round(mantissa * 2**11) / 2**11, exponent)  # numpy: ties to even
    assert np.array_equal(round_tf32(values).double().numpy(), expected)


@pytest.mark.default_model
def test_the_tier_is_the_fastest_within_the_tolerance_on_a_device_that_offers_all():
    """A fake device offering every tier: tolerance 0 measures them all, keeps float32 and puts
    the model back bit for bit (its tied head included); the measured errors order as the
    mantissas do; a tolerance between two of them takes the fastest tier below it; a large one
    float16 with its LM head in float16 (float32 sums), bfloat16's the fallback; bfloat16 with
    the head in float32 gives the tied head its own float32 copy."""
    answers = probekit.AnswerSet.parse("0-10")
    model = _tiny(tie=True, pending=True)
    prompts = _tiny_prompts(model)
    before = {n: p.detach().clone() for n, p in model.hf.named_parameters()}
    record = precision.choose_precision(model, prompts, answers, 0.0, precision.TIERS)
    assert record["tier"] == "float32" and record["sample"] == 3 and "fallback" not in record
    error = {t["tier"]: t["max_prob_diff"] for t in record["tried"]}
    assert list(error) == list(precision.TIERS[:-1])
    assert not any(t["accepted"] for t in record["tried"])
    assert 0 < error["tf32"] < error["float16"] < error["bfloat16"]
    assert error["tf32+head"] < error["float16+head"] < error["bfloat16+head"]
    assert model.dtype == torch.float32 and not {"matmul", "head"} & set(model.meta)
    after = dict(model.hf.named_parameters())
    assert before.keys() == after.keys()
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert model.hf.get_output_embeddings().weight is model.hf.get_input_embeddings().weight
    between = (error["tf32+head"] + error["float16+head"]) / 2
    model.meta["precision"] = {"tolerance": between, "offered": list(precision.TIERS)}
    record = model.settle_precision(answers, prompts)
    assert record["tier"] == "tf32+head" and model.meta["matmul"] == model.meta["head"] == "tf32"
    assert [t["accepted"] for t in record["tried"]] == [False, False, True]
    wide = _tiny(tie=True, pending=True)
    record = precision.choose_precision(wide, prompts, answers, 1.0, precision.TIERS)
    assert record["tier"] == "float16+head" and record["fallback"] == "bfloat16+head"
    assert [t["tier"] for t in record["tried"]] == ["float16+head", "bfloat16+head"]
    assert wide.dtype == torch.float16 and wide.meta["fp32_parts"] == ["final norm"]
    assert wide.meta["head"] == "float16" and wide.hf.model.norm.weight.dtype == torch.float32
    head = wide.hf.get_output_embeddings().weight
    assert head is wide.hf.get_input_embeddings().weight and head.dtype == torch.float16
    assert wide.describe()["dtype"] == "float16" and wide.describe()["precision"] is record
    line = describe_precision(record)
    assert "float16, LM head included (float32 final norm and sums) for tolerance 1" in line
    assert line.endswith("on overflow: bfloat16, LM head included (float32 final norm and sums)")
    kept = _tiny(tie=True, pending=True)  # bfloat16 with the head in float32: its own copy
    record = precision.choose_precision(kept, prompts, answers, 1.0, ("bfloat16", "float32"))
    assert record["tier"] == "bfloat16" and kept.meta["fp32_parts"] == ["final norm", "LM head"]
    assert kept.hf.get_output_embeddings().weight.dtype == torch.float32
    assert kept.hf.get_input_embeddings().weight.dtype == torch.bfloat16 and "head" not in kept.meta


@pytest.mark.default_model
def test_the_narrow_head_is_16_bit_products_summed_in_float32(monkeypatch):
    """`narrow_linear`: the hidden state rounded to the weights' 16 bits, every product exact,
    the sums float32 (against a float64 sum of the same rounded values); the LM head in float32
    differs from it by the rounding alone. A model whose weights are widened for its noise
    figure's reference runs its head in the wider dtype."""
    from probekit.engines.hf.head import narrow_linear
    from probekit.engines.hf.precision import apply_tier

    hidden = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    weight = torch.randn(7, 64, generator=torch.Generator().manual_seed(1))
    for dtype, mantissa in ((torch.float16, 11), (torch.bfloat16, 8)):
        out = narrow_linear(hidden, weight.to(dtype), None)
        exact = hidden.to(dtype).double() @ weight.to(dtype).double().T
        assert out.dtype == torch.float32
        assert torch.allclose(out.double(), exact, rtol=0, atol=1e-5)
        wide = hidden @ weight.T
        assert 0 < (out - wide).abs().max() < 64 * 2.0**-mantissa * 4
    model = _tiny()  # a float16+head model's noise figure: its head widened for the reference
    apply_tier(model, "float16+head")
    answers = probekit.AnswerSet.parse("0-10")
    figure = precision.noise_figure(model, _tiny_prompts(model), answers, sample=2, epsilon=0.0)
    assert figure["dtype"] == "float16" and figure["reference_dtype"] == "float32"
    assert 0 < figure["max_abs_diff"] < 0.01
    assert model.hf.get_output_embeddings().weight.dtype == torch.float16
    from probekit.engines.hf import head

    def refused(*args):
        raise AssertionError("a widened head ran as a 16-bit one")

    with precision.as_dtype(model, torch.float32):
        monkeypatch.setattr(head, "narrow_linear", refused)
        assert head.lm_head(model, hidden[:, :32]).dtype == torch.float32


@pytest.mark.default_model
def test_float16_overflow_is_refused_in_the_sample_and_falls_back_later(capsys):
    """A token whose embedding is beyond float16's range: in the sample, the float16 tiers are
    refused (the overflow counted); outside it, the float16 tier is taken with its fallback, and
    the batch that overflows is scored again in the fallback, with one line, the same scores as
    the fallback tier gives."""
    answers = probekit.AnswerSet.parse("0-10")

    def overflowing():
        model = _tiny(pending=True)
        with torch.no_grad():
            model.hf.get_input_embeddings().weight[1000] *= 1e8  # float16 ends at 65504
        return model

    model = overflowing()
    prompts = _tiny_prompts(model)
    hot = prompts[0] + [1000]
    record = precision.choose_precision(model, [*prompts, hot], answers, 1.0, precision.TIERS)
    assert record["tried"][0] == {"tier": "float16+head", "overflow": 1, "accepted": False}
    assert record["tier"] == "bfloat16+head" and "fallback" not in record
    assert "overflowed on 1 prompt(s)" in describe_precision(record)

    model = overflowing()
    record = precision.choose_precision(model, prompts, answers, 1.0, precision.TIERS)
    assert record["tier"] == "float16+head" and record["fallback"] == "bfloat16+head"
    capsys.readouterr()
    scored = model.scorer(answers, epsilon=0.0).score_batch([prompts[1], hot])
    assert "overflowed on 1 prompt(s)" in capsys.readouterr().err
    assert all(np.isfinite(r.valid_mass) for r in scored)
    assert model.dtype == torch.bfloat16 and model.meta["head"] == "bfloat16"
    assert record["tier"] == "bfloat16+head" and record["fell_back_from"] == "float16+head"
    assert "fallback" not in record and precision.UNDO not in model.meta
    direct = overflowing()
    precision.apply_tier(direct, "bfloat16+head")
    for ours, theirs in zip(
        scored, direct.scorer(answers, epsilon=0.0).score_batch([prompts[1], hot]), strict=True
    ):
        assert np.array_equal(ours.probs, theirs.probs)


@pytest.mark.default_model
def test_score_and_a_run_choose_the_tier_before_they_score(tmp_path):
    """`probekit.score` chooses on its first window; a run on its numerics sample, or keeps
    the tier of the run it resumes (fake device offering every tier, as above)."""
    from probekit.core.rundir import RunDir
    from probekit.run.command import settle_run_precision

    model = _tiny(pending=True)
    model.meta["precision"]["tolerance"] = 1.0
    texts = [f"Case {i}: how intense, from 0 to 10? Answer with a number." for i in range(3)]
    with pytest.warns(UserWarning, match="weak signal"):  # random weights
        table = probekit.score(model, texts, "0-10")
    assert len(table) == 3 and model.meta["precision"]["tier"] == "float16+head"
    probe, _ = _prompts(model, "isear", ["--events", "1"], 0)
    fresh = _tiny(pending=True)
    record = settle_run_precision(fresh, probe, tmp_path / "new", seed=0)
    assert record["sample"] == min(precision.NOISE_SAMPLE, len(probe))
    # the tiny model's errors (~1e-5) are within the default tolerance: the fastest tier
    assert record["tier"] == fresh.meta["precision"]["tier"] == "float16+head"
    assert settle_run_precision(fresh, probe, tmp_path / "new") is None  # chosen already
    RunDir(tmp_path / "old").make()
    earlier = {"tier": "bfloat16", "tried": [], "tolerance": precision.DEFAULT_TOLERANCE}
    RunDir(tmp_path / "old").write_manifest({"precision": earlier})
    resumed = _tiny(pending=True)
    kept = settle_run_precision(resumed, probe, tmp_path / "old")
    assert kept["tier"] == "bfloat16" and kept["note"] == "kept from the run being resumed"
    assert resumed.dtype == torch.bfloat16
    other = _tiny(pending=True)  # loaded with another tolerance: chosen anew, not kept
    other.meta["precision"]["tolerance"] = 1e-9
    assert settle_run_precision(other, probe, tmp_path / "old")["tier"] == "float32"
    assert _tiny().keep_precision({"tier": "bfloat16"}) is None  # a CPU: float32 chosen


def test_dtype_and_tolerance_are_refused_together_before_loading(capsys):
    from probekit import cli
    from probekit.engines import load_engine

    with pytest.raises(ProbekitError, match="^give dtype or tolerance, not both"):
        load_model("default", dtype="bfloat16", tolerance=0.01)
    with pytest.raises(ProbekitError, match=r"^tolerance must be between 0 and 1 \(got 2\)"):
        load_model("default", tolerance=2)
    with pytest.raises(ProbekitError, match="^tolerance picks the hf engine's arithmetic"):
        load_engine("default", engine="vllm", tolerance=0.01)
    assert cli.main(["setup", "--tolerance", "1.5"]) == 2
    assert "--tolerance" in capsys.readouterr().err
    assert cli.main(["setup", "--tolerance", "0.01", "--dtype", "bf16"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.default_model
@pytest.mark.slow
def test_the_tiers_errors_on_the_default_model_and_the_pick():
    """The default model on this CPU is offered float32 alone (nothing measured); on a device
    offering every tier (TF32 and the 16-bit heads emulated here), its measured errors on 0-100
    intergroup prompts put float16 with its LM head in float16 within the default tolerance and
    bfloat16 above it, so the default picks float16+head, with TF32 (head included) as the
    measured fallback; a tolerance of 0.05 takes bfloat16+head as the fallback (the H100
    measured TF32 at 1.3e-3 and bfloat16 at 0.015 on 72 prompts)."""
    model = load_model("default")
    assert model.meta["precision"]["tier"] == "float32" and model.meta["precision"]["tried"] == []
    probe, prompts = _prompts(model, "intergroup", ["--events", "1"], 2)
    record = precision.choose_precision(model, prompts, probe.answers, None, precision.TIERS)
    tried = {t["tier"]: t for t in record["tried"]}
    assert record["tier"] == "float16+head" and record["fallback"] == "tf32+head"
    assert list(tried) == ["float16+head", "bfloat16+head", "tf32+head"]
    assert record["tolerance"] == precision.DEFAULT_TOLERANCE == 0.005
    # measured here on 2 prompts: float16+head 9.3e-4, bfloat16+head 0.013, tf32+head 8.0e-4
    assert 0 < tried["float16+head"]["max_prob_diff"] <= 0.002
    assert 0 < tried["tf32+head"]["max_prob_diff"] <= 0.002
    assert 0.005 < tried["bfloat16+head"]["max_prob_diff"] <= 0.05
    assert tried["float16+head"]["max_abs_diff"] <= 0.3
    assert tried["bfloat16+head"]["max_abs_diff"] <= BF16_MAX_EXPECTED_DIFF
    assert model.dtype == torch.float16 and model.meta["head"] == "float16"
    model.meta.pop(precision.UNDO)()  # back to float32
    record = precision.choose_precision(model, prompts, probe.answers, 0.05, precision.TIERS)
    assert record["tier"] == "float16+head" and record["fallback"] == "bfloat16+head"


@pytest.mark.default_model
def test_steering_chooses_the_tier_before_it_scores():
    """The mechanism's `steer` settles the tier first (fake device offering every tier, the
    tolerance loose enough for float16), and scores in it under the TransformerLens bridge."""
    model = _tiny(pending=True)
    model.meta["precision"]["tolerance"] = 1.0
    texts = ["Case 1: how intense, from 0 to 10?", "Case 2: how sad, from 0 to 10?"]
    vector = torch.ones(model.hf.config.hidden_size)
    rows = probekit.steer(
        model, texts, vector, layers=[0], alphas=[0, 1], answers="0-10", hooks="nnsight",
        positions="span", controls=0,
    )  # fmt: skip
    assert len(rows) == 4 and rows["valid_mass"].gt(0).all()
    assert model.meta["precision"]["tier"] == "float16+head" and model.dtype == torch.float16


def test_the_tiers_a_device_offers(monkeypatch):
    """Every tier on a CUDA device of compute capability 8 or more; the float16 tiers and float32
    on a 7.x one (float16 tensor cores only); float32 alone on an older one, on a dispatched
    model and on a CPU; the loaded dtype alone on a model loaded in bfloat16 (a fake CUDA
    device: nothing runs on it)."""
    from probekit.engines.hf.model import LoadedModel
    from probekit.engines.hf.precision import TIERS, offered_tiers

    cuda = LoadedModel(None, None, "m", "random", torch.device("cuda"), torch.float32)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    assert offered_tiers(cuda)[0] == TIERS
    assert TIERS == (
        "float16+head", "bfloat16+head", "tf32+head", "float16", "bfloat16", "tf32", "float32"
    )  # fmt: skip
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (7, 5))
    assert offered_tiers(cuda)[0] == ("float16+head", "float16", "float32")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (6, 1))
    assert offered_tiers(cuda)[0] == ("float32",)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    cuda.meta["device_map"] = "model.layers.0-15: cuda:0; model.layers.16-31: cpu"
    assert offered_tiers(cuda)[0] == ("float32",)
    narrow = LoadedModel(None, None, "m", "random", torch.device("cuda"), torch.bfloat16)
    assert offered_tiers(narrow)[0] == ("bfloat16",)
    cpu = LoadedModel(None, None, "m", "random", torch.device("cpu"), torch.float32)
    assert offered_tiers(cpu)[0] == ("float32",)


def test_16_bit_products_sum_in_float32_on_cuda():
    """A 16-bit model's matrix products on CUDA add their partial sums in float32, as the CPU
    that measures the tiers does (cuBLAS's reduced-precision reductions off, restored after);
    nothing changes for a float32 model (a fake CUDA device: nothing runs on it)."""
    from probekit.engines.hf.model import LoadedModel
    from probekit.engines.hf.precision import arithmetic

    matmul = torch.backends.cuda.matmul
    flags = lambda: (  # noqa: E731
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
    )
    before = flags()
    for dtype in (torch.float16, torch.bfloat16):
        narrow = LoadedModel(None, None, "m", "random", torch.device("cuda"), dtype)
        with arithmetic(narrow):
            assert flags() == (False, False)
        assert flags() == before
    wide = LoadedModel(None, None, "m", "random", torch.device("cuda"), torch.float32)
    with arithmetic(wide):
        assert flags() == before
