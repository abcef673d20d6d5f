"""The run loop: resume after SIGKILL, shards merging into the single run, torchrun, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO

from probekit import cli, run_study
from probekit.core.errors import ProbekitError
from probekit.core.store import INDEX
from probekit.datasets.crowd_envent import SAMPLE_ROOT, load_crowd_envent
from probekit.run.loop import Shard, run_probe
from probekit.run.parts import done_mask, scan_parts
from probekit.run.scoring import EnginePool, local_scoring
from probekit.studies.intergroup import IntergroupProbe, get_category, get_setting

SCRIPT = REPO / "experiments" / "intergroup_gap.py"
# The 10-point scale keeps the answer trie small, so these runs take seconds per chunk.
SETTING = "P0S1T0"


def small_probe(n_events: int = 2) -> IntergroupProbe:
    events = load_crowd_envent(SAMPLE_ROOT).head(n_events)
    return IntergroupProbe(get_category("religion"), get_setting(SETTING), events)


def manifest(probe):
    return {"model": "default", "probe": probe.config(), "view": "exact", "epsilon": 1e-4}


def test_shards_merge_into_the_single_run(tiny, tmp_path):
    probe = small_probe()
    single = run_probe(probe, tiny, tmp_path / "single", manifest(probe), chunk_size=32)
    assert single is not None
    split = tmp_path / "split"
    assert run_probe(probe, tiny, split, manifest(probe), shard=Shard(0, 2), chunk_size=16) is None
    merged = run_probe(probe, tiny, split, manifest(probe), shard=Shard(1, 2), chunk_size=16)
    a, b = pd.read_parquet(single), pd.read_parquet(merged)
    assert len(a) == len(probe) == 72
    assert list(a[INDEX]) == list(range(72))
    keys = ["perceiver", "experiencer", "event_id", "emotion", "greedy"]
    assert a[keys].equals(b[keys])
    assert np.allclose(a["expected"], b["expected"], atol=1e-5)


class ElsewherePool(EnginePool):
    """A pool whose engine happens to be in this process: what `run_probe` asks of any pool."""

    def __init__(self, engine) -> None:
        self.engine, self.asked = engine, []

    def scoring(self, probe, view, **settings):
        self.asked.append(settings)
        return local_scoring(probe, self.engine, view, **settings)


def test_a_pool_in_place_of_the_engine_runs_the_same_loop(tiny, tmp_path):
    """`run_probe` takes an `EnginePool` where it takes an engine (Ray's `RayPool` is one):
    the pool gets the scorer's settings and the run writes the rows the engine writes."""
    probe = small_probe(1)
    alone = run_probe(probe, tiny, tmp_path / "alone", manifest(probe), chunk_size=12)
    pool = ElsewherePool(tiny)
    pooled = run_probe(probe, pool, tmp_path / "pool", manifest(probe), chunk_size=12)
    assert pool.asked == [{"epsilon": 1e-4, "batch_size": None, "seed": 0, "chunk_size": 12}]
    a, b = pd.read_parquet(alone), pd.read_parquet(pooled)
    assert len(a) == len(probe) and a[INDEX].equals(b[INDEX])
    np.testing.assert_allclose(a["expected"], b["expected"], atol=1e-6)


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path):
    out = tmp_path / "run"
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_run import small_probe, manifest\n"
        "from probekit.engines.hf.model import load_model\n"
        "from probekit.run.loop import run_probe\n"
        "from pathlib import Path\n"
        "p = small_probe(3)\n"
        f"run_probe(p, load_model('default'), Path({str(out)!r}), manifest(p), chunk_size=12)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    parts = out / "parts"
    deadline = time.time() + 600
    while len(list(parts.glob("part-*.parquet"))) < 2 and time.time() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {p.name: p.stat().st_mtime_ns for p in parts.glob("part-*.parquet")}
    done_before = int(done_mask(scan_parts(out), 108).sum())
    assert 0 < done_before < 108, "the run must be killed half-way"
    assert not (out / "scores.parquet").exists()
    resumed = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=900)
    assert resumed.returncode == 0
    after = {p.name: p.stat().st_mtime_ns for p in parts.glob("part-*.parquet")}
    assert all(after[name] == mtime for name, mtime in before.items()), "finished parts redone"
    scores = pd.read_parquet(out / "scores.parquet")
    assert list(scores[INDEX]) == list(range(108))  # none lost, none duplicated


def run_python(*args, env=None, timeout=900):
    """`python ARGS` from the repository, its output captured."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def run_script(*args, env=None, timeout=900):
    return run_python(str(SCRIPT), *args, env=env, timeout=timeout)


@pytest.mark.slow
def test_torchrun_two_processes_equal_one(tmp_path):
    pytest.importorskip("accelerate")
    common = ["--setting", SETTING, "--events", "1", "--data", str(SAMPLE_ROOT)]
    one = run_script(*common, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    distributed = ["-m", "torch.distributed.run", "--nproc_per_node", "2", str(SCRIPT)]
    two = run_python(*distributed, *common, "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-3000:]
    a = pd.read_parquet(tmp_path / "one" / "scores.parquet")
    b = pd.read_parquet(tmp_path / "two" / "scores.parquet")
    assert len(a) == len(b) == 6 * 6 * 12
    keys = ["perceiver", "experiencer", "event_id"]
    assert a[keys].equals(b[keys])
    assert np.allclose(a["expected"], b["expected"], atol=1e-5)
    for name in ("summary.csv", "summary.md", "heatmap.png", "manifest.json"):
        assert (tmp_path / "two" / name).is_file()
    assert "Δ" in one.stdout or "delta" in one.stdout.lower()
    # `probekit report` re-writes the summary and figures from the results alone.
    before = pd.read_csv(tmp_path / "one" / "summary.csv")
    for name in ("summary.csv", "summary.md", "heatmap.png"):
        (tmp_path / "one" / name).unlink()
    report = run_python("-m", "probekit.cli", "report", str(tmp_path / "one"), timeout=300)
    assert report.returncode == 0, report.stderr
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "one" / "summary.csv"), before)
    assert (tmp_path / "one" / "heatmap.png").is_file() and "| religion |" in report.stdout
    # Several run folders (e.g. one per model) are summarised together, the paper's tables too.
    runs = [str(tmp_path / "one"), str(tmp_path / "two"), "--out", str(tmp_path / "both")]
    combined = run_python("-m", "probekit.cli", "report", *runs, timeout=300)
    assert combined.returncode == 0, combined.stderr
    assert len(pd.read_csv(tmp_path / "both" / "summary.csv")) == 2
    tables = (tmp_path / "both" / "paper_tables.md").read_text()
    assert "### Δ in z-scores [null 2.5–97.5%]" in tables


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"category": "caste"}, "unknown category 'caste'"),
        ({"setting": "P9S0T0"}, "unknown setting 'P9S0T0'"),
        ({"view": "sample"}, "unknown view 'sample'"),
        ({"events": 0}, "events must be at least 1"),
        ({"shard": "2/2"}, "'2/2': need 0 <= i < n"),
    ],
)
def test_bad_arguments(options, message, tmp_path):
    with pytest.raises(ProbekitError) as info:
        run_study("intergroup", out=tmp_path / "x", **options)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "x").exists()


def test_bad_arguments_on_the_command_line(tmp_path, capsys):
    assert cli.main(["run", "intergroup", "--view", "sample", "--out", str(tmp_path / "x")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "unknown view 'sample'" in lines[0]


def test_data_dir_missing_an_emotion_file(tmp_path):
    root = tmp_path / "data" / "crowd-enVent"
    root.mkdir(parents=True)
    for f in (SAMPLE_ROOT / "crowd-enVent").glob("*.tsv"):
        if "joy" not in f.name:
            (root / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ProbekitError, match="crowd-enVent_joy.tsv"):
        run_study("intergroup", data=tmp_path / "data", out=tmp_path / "x")


def test_events_file_with_missing_columns(tmp_path):
    root = tmp_path / "data" / "crowd-enVent"
    root.mkdir(parents=True)
    for f in (SAMPLE_ROOT / "crowd-enVent").glob("*.tsv"):
        text = f.read_text()
        if "anger" in f.name:  # drop the third_person_text column
            text = "\n".join("\t".join(line.split("\t")[:4]) for line in text.splitlines())
        (root / f.name).write_text(text)
    with pytest.raises(ProbekitError, match="third_person_text"):
        run_study("intergroup", data=tmp_path / "data", out=tmp_path / "x")


@pytest.mark.slow
def test_same_numbers_as_before_the_study_generic_core(smol, tmp_path):
    """Rows written by the last commit before the move (fb9ac13: religion, P0S1T0, sample events
    2 and 6); now also with every answer probability and the prompt id. Tolerances cover the
    float64 stop mass that came later (the old fp32 sum was 1.6-1.9e-4 low, relative)."""
    old = pd.read_parquet(REPO / "tests" / "data" / "intergroup_fb9ac13_P0S1T0.parquet")
    events = load_crowd_envent(SAMPLE_ROOT)
    events = events[events["event_id"].isin(set(old["event_id"]))]
    probe = IntergroupProbe(get_category("religion"), get_setting(SETTING), events)
    new = pd.read_parquet(run_probe(probe, smol, tmp_path, manifest(probe), chunk_size=72))
    keys = ["perceiver", "experiencer", "event_id", "emotion"]
    merged = old.merge(new, on=keys, suffixes=("_old", ""), validate="one_to_one")
    assert len(merged) == len(old) == len(new) == 72
    assert (merged["argmax"] == merged["greedy"]).all()  # the columns' old names
    assert (merged["mode"] == merged["most_probable"]).all()
    np.testing.assert_allclose(merged["expected"], merged["expected_old"], atol=2e-4)
    np.testing.assert_allclose(merged["valid_mass"], merged["valid_mass_old"], rtol=5e-4)
    probs = [f"p::{a}" for a in probe.answers.answers]
    assert list(new.columns[-len(probs) :]) == probs
    np.testing.assert_allclose(new[probs].sum(axis=1), 1.0, atol=1e-9)
    assert new["prompt_id"].str.startswith("religion|P0S1T0|").all()
    assert new["prompt_id"].is_unique


@pytest.mark.slow
def test_kept_probabilities_equal_probekit_score(smol, tmp_path):
    """The run loop's p:: columns are those `probekit score` writes for the same prompts."""
    from probekit import cli

    probe = small_probe(1)
    exact = {**manifest(probe), "epsilon": 0.0}
    run = pd.read_parquet(run_probe(probe, smol, tmp_path / "run", exact, epsilon=0.0))
    prompts = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"id": it.id, "messages": list(it.messages)}) for it in probe.items()]
    prompts.write_text("\n".join(lines[:8]) + "\n")
    out = tmp_path / "score.parquet"
    assert (
        cli.main(["score", "--prompts", str(prompts), "--answers", "0-10", "--scores", str(out)])
        == 0
    )
    scored = pd.read_parquet(out).set_index("id")
    mine = run.set_index("prompt_id").loc[scored.index]
    probs = [c for c in scored.columns if c.startswith("p::")]
    assert len(probs) == 11
    # The two commands batch the prompts differently, so their shared prefixes (KV computed once
    # per batch) differ: fp32 computation-path noise, ~1e-5 per logit, a few 1e-5 on the valid
    # mass, which multiplies several token probabilities.
    np.testing.assert_allclose(mine[probs], scored[probs], atol=1e-5)
    np.testing.assert_allclose(mine["valid_mass"], scored["valid_mass"], rtol=1e-4)


def test_resume_of_an_older_results_format_is_refused(tiny, tmp_path):
    probe = small_probe(1)
    old = {**manifest(probe), "results_format": 1}
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    with pytest.raises(ProbekitError, match="results format 1") as info:
        run_probe(probe, tiny, tmp_path, manifest(probe))
    assert "\n" not in str(info.value)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest(probe)))  # format 1: no field
    with pytest.raises(ProbekitError, match="results format 1"):
        run_probe(probe, tiny, tmp_path, manifest(probe))


def test_resuming_with_other_settings_is_refused(tiny, tmp_path):
    probe = small_probe(1)
    run_probe(probe, tiny, tmp_path, manifest(probe), chunk_size=64)
    other = {**manifest(probe), "epsilon": 0.0}
    with pytest.raises(Exception, match="different epsilon"):
        run_probe(probe, tiny, tmp_path, other)


@pytest.mark.slow
def test_rows_are_reused_only_for_the_run_they_were_scored_for(tmp_path, capsys):
    """On the real model, through the command line: after `manifest.json` and `scores.parquet`
    are removed (as the damaged-manifest message advises), a run with another --dtype or other
    --genders scores its prompts again instead of taking the old rows; a finished run whose
    parts are gone is not scored again."""
    out = tmp_path / "isear"
    common = ["run", "isear", "--events", "2", "--out", str(out)]
    assert cli.main(common) == 0
    first = pd.read_parquet(out / "scores.parquet")

    def rerun(*options: str) -> tuple[pd.DataFrame, str]:
        (out / "manifest.json").unlink()
        (out / "scores.parquet").unlink()
        capsys.readouterr()
        assert cli.main([*common, *options]) == 0
        return pd.read_parquet(out / "scores.parquet"), capsys.readouterr().err

    half, err = rerun("--dtype", "bfloat16")
    assert "already done" not in err
    assert "scored under another dtype ('float32', now 'bfloat16')" in err
    assert json.loads((out / "manifest.json").read_text())["dtype"] == "bfloat16"
    assert (half["valid_mass"] - first["valid_mass"]).abs().max() > 1e-4  # bfloat16's own rows
    others, err = rerun("--dtype", "bfloat16", "--genders", "a man,a woman")
    assert "already done" not in err and "set aside" in err
    assert sorted(others["gender"].unique()) == ["a man", "a woman"]
    for part in (out / "parts").glob("part-*.parquet"):
        part.unlink()
    capsys.readouterr()
    assert cli.main([*common, "--dtype", "bfloat16", "--genders", "a man,a woman"]) == 0
    assert "nothing to score" in capsys.readouterr().err


def test_the_manifest_commit_is_the_checkouts_head_or_unknown(tmp_path):
    """`commit`: HEAD of the git checkout that tracks the package's files, "unknown" for a
    package folder git does not track (a wheel, even inside another repository)."""
    from probekit.run.command import commit

    package, loose = tmp_path / "pkg", tmp_path / "loose"
    for folder in (package, loose):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "pkg"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert commit(package) == head.strip()
    assert commit(loose) == "unknown"
