"""Steering and patching say when they measure nothing: a step (α) or a patch whose mean valid
mass falls below the weak-signal threshold is named in a warning, a table column and (steering)
the page; each α is said against the vector's and the residual's norm (`push`); the result
objects print as one line (on the tiny random model, whose answers keep almost no mass: every
step is weak there)."""

from __future__ import annotations

import minimal_study
import pandas as pd
import pytest

import probekit
from probekit.core.signal import WEAK_SIGNAL_VALID_MASS
from probekit.mechanism.patching import weak_patches
from probekit.mechanism.steering import weak_steps


def _summary(masses: dict[float, float]) -> pd.DataFrame:
    rows = [
        {"site": "hook_resid_post", "layer": 3, "vector": kind, "alpha": a, "mean_valid_mass": m}
        for kind in ("steer", "random")
        for a, m in masses.items()
    ]
    return pd.DataFrame(rows)


def test_weak_steps_names_the_steps_whose_mass_collapsed():
    """The issue's ISEAR run: 0.134 unsteered, ~1e-5 at α = ±4."""
    line = weak_steps(_summary({-4.0: 1e-5, 0.0: 0.134, 4.0: 2e-5}))
    assert line.startswith("weak signal under steering at α=-4 (steer, L3 hook_resid_post)")
    assert "α=4 (random, L3 hook_resid_post)" in line and "α=0 " not in line
    assert "falls to 1e-05 (0.134 unsteered)" in line
    assert weak_steps(_summary({-1.0: 0.12, 0.0: 0.134, 1.0: WEAK_SIGNAL_VALID_MASS})) is None


def test_weak_patches_names_the_components_whose_mass_collapsed():
    rows = [
        {
            "layer": 2,
            "site": "hook_resid_pre",
            "head": None,
            "span": "name",
            "valid_mass_patched": m,
        }
        for m in (0.01, 0.02)
    ]
    rows += [
        {"layer": 5, "site": "attn.hook_z", "head": 1, "span": "name", "valid_mass_patched": 0.6}
    ]
    line = weak_patches(pd.DataFrame(rows))
    assert line.startswith("weak signal under the patches of L2 hook_resid_pre at name:")
    assert "falls to 0.015" in line and "L5" not in line
    assert weak_patches(pd.DataFrame(rows[2:])) is None
    assert weak_patches(pd.DataFrame(rows).drop(columns="valid_mass_patched")) is None


def test_a_steering_run_says_each_step_against_the_norms_and_flags_weak_steps(
    tiny, tmp_path, capsys
):
    out = tmp_path / "steer"
    steered = probekit.steer_study(
        minimal_study.MinimalStudy(), tiny, out=out, alphas=[0, 2], layers=[1], days=2, controls=1
    )
    summary = steered.summary
    expected = summary["alpha"].abs() * summary["norm"] / summary["residual_norm"]
    assert summary["push"].to_numpy() == pytest.approx(expected.to_numpy())
    assert (summary["residual_norm"] > 0).all()
    assert summary["weak_signal"].tolist() == (summary["mean_valid_mass"] < 0.05).tolist()
    assert summary["weak_signal"].all()  # random weights: no mass on the answers anywhere
    err = capsys.readouterr()
    assert "probekit: warning: weak signal under steering at α=0 (steer, L1" in err.err
    assert "(push " in err.out and "weak signal: valid mass" in err.out
    page = (out / "report.html").read_text()
    assert 'id="weak-signal"' in page and "⚠" in page and "<th>push</th>" in page
    assert "<th>tolerance</th><td><code>0.005</code>" in page
    assert steered.warning.startswith("weak signal under steering at α=0 (steer, L1")
    assert "weak signal under steering at α=0 (steer, L1" in page
    assert pd.read_csv(out / "summary.csv")["weak_signal"].all()
    shown = repr(steered)
    assert "\n" not in shown and len(shown) < 300
    assert shown.startswith(f"StudySteer('{out}': gap, Alice - Bob at α = 0, 2 on L1 ")
    assert "weak signal at 4 steps" in shown


def test_patching_flags_a_weak_signal_and_its_results_print_as_one_line(tiny, tmp_path, capsys):
    study = minimal_study.MinimalStudy()
    patched = probekit.patch_study(
        study,
        tiny,
        out=tmp_path / "patch",
        layers=[1],
        sites=["resid_pre"],
        days=2,
        bootstrap=20,
        skip_direction=True,
    )
    assert "probekit: warning: weak signal under the patches of L1" in capsys.readouterr().err
    assert "valid_mass_patched" in patched.table
    assert patched.summary["weak_signal"].all()
    assert "weak_signal" in pd.read_csv(tmp_path / "patch" / "patching_summary.csv")
    shown = repr(patched)
    assert "\n" not in shown and len(shown) < 300 and "weak signal at" in shown
    encoded = [
        tiny.encode(item)
        for item in study.mechanism_items(
            minimal_study.MinimalOptions(days=2), probekit.studies.base.Context("patch")
        )[1]
    ]
    with pytest.warns(UserWarning, match="weak signal under the patches of L0"):
        probekit.patch(
            tiny,
            [(encoded[0], encoded[1])],
            spans=["name"],
            sites=["resid_pre"],
            layers=[0],
            answers="0-10",
        )
    captured = probekit.capture_study(
        study, tiny, out=tmp_path / "capture", layers=[1], sites=["resid_post"], days=2
    )
    shown = repr(captured)
    assert shown.startswith("Activations(4 prompts, spans ") and "[" in shown
    assert "\n" not in shown and len(shown) < 300


def test_the_steering_page_of_a_run_on_the_sample_says_so_with_its_checksum(tiny, tmp_path):
    """The issue's steering page had no sample-data banner and said "SHA-256 None"."""
    from probekit.studies.isear.events import SAMPLE_ROOT

    out = tmp_path / "steer"
    steered = probekit.steer_study(
        "isear", tiny, out=out, data=SAMPLE_ROOT, events=2, alphas=[0, 1], layers=[1]
    )
    manifest = probekit.RunDir(out).manifest
    assert len(manifest["data_sha256"]) == 64 and manifest["data_origin"] == "explicit"
    page = (out / "report.html").read_text()
    assert 'id="sample-data"' in page and manifest["data_sha256"] in page
    assert steered.data.startswith("probekit's own sample") and "None" not in steered.data
