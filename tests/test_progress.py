"""Progress where nobody watches a terminal: plain lines at a sensible interval in a log, the time
a call will take said after its first batch, and nothing at all when asked to be quiet."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from test_run_state import CountingEngine, FigureStudy, GroupProbe, manifest

import probekit
from probekit import cli
from probekit.core import progress as shown
from probekit.core.progress import duration, progress, silenced
from probekit.run.loop import run_probe


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(shown.time, "monotonic", clock)
    return clock


def test_a_log_gets_a_line_every_tenth_or_half_minute(clock):
    log = io.StringIO()  # not a terminal: lines, no bar
    bar = progress(100, "prompt", "demo", "--limit N", stream=log)
    clock.now = 2.0
    bar.update(10)  # the first batch: the estimate
    clock.now = 3.0
    bar.update(5)  # 5 % more, 1 s later: no line
    clock.now = 4.0
    bar.update(5)  # 10 % since the last line
    clock.now = 40.0
    bar.update(1)  # 36 s since the last line
    bar.close()  # its last line is where it stopped: not said twice
    assert log.getvalue().splitlines() == [
        "demo: 100 prompts to go; the first 10 took 2 s, so about 20 s in all on this device "
        "(a smaller run: --limit N)",
        "demo: 20 of 100 prompts (20%) in 4 s, about 16 s left",
        "demo: 21 of 100 prompts (21%) in 40 s, about 2 min 30 s left",
    ]
    assert "\r" not in log.getvalue()


def test_a_call_done_in_one_batch_says_one_line(clock):
    log = io.StringIO()
    with progress(3, "prompt", "isear", stream=log) as bar:
        clock.now = 34.0
        bar.update(3)
    assert log.getvalue().splitlines() == ["isear: 3 of 3 prompts (100%) in 34 s"]


def test_a_finished_call_ends_with_its_total(clock):
    log = io.StringIO()
    with progress(4, "run", "patching", stream=log) as bar:
        for second in range(1, 5):
            clock.now = float(second)
            bar.update(1)
    assert log.getvalue().splitlines()[-1] == "patching: 4 of 4 runs (100%) in 4 s"


def test_quiet_writes_nothing():
    log = io.StringIO()
    with silenced():
        bar = progress(10, stream=log)
        bar.update(10)
        bar.close()
        shown.note("a line about the work ahead")
    assert log.getvalue() == ""
    with silenced(False):
        assert not shown.is_quiet()


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0 s"), (59, "59 s"), (75, "1 min 15 s"), (4000, "1 h 06 min")]
)
def test_durations_read_at_a_glance(seconds, text):
    assert duration(seconds) == text


def test_the_run_loop_says_its_estimate_and_progress_in_a_log(tmp_path, capsys):
    probe = GroupProbe(events=30)  # 60 prompts, batches of 4
    out = tmp_path / "run"
    run_probe(probe, CountingEngine(), out, manifest(probe), hint="--limit N")
    err = capsys.readouterr().err  # pytest's capture is not a terminal
    assert "\r" not in err
    lines = err.splitlines()
    # Before the first batch: the prompts and the time, at the pace of a sample (no earlier run
    # of this model here); then the estimate at the pace of the first batch, then the progress.
    assert lines[0].startswith(f"groups: 60 prompts to score into {out}, about ")
    assert "on this device (at " in lines[0] and "measured on 4 prompts after a warm-up" in lines[0]
    assert lines[0].endswith("; a smaller run: --limit N)")
    assert lines[1].startswith("groups: 60 prompts to go; the first 4 took ")
    assert lines[1].endswith("on this device (a smaller run: --limit N)")
    assert lines[-1].startswith("groups: 60 of 60 prompts (100%) in ")


def test_the_first_line_takes_the_pace_of_the_last_run_on_this_machine(tmp_path, capsys):
    """The pace a run measured is kept for the next run of the same model, device, answers and
    view on this machine, which says its time from it without a sample."""
    from probekit.run.scoring import Pace, pace_key, record_pace, recorded_pace

    probe, engine = GroupProbe(events=30), CountingEngine()
    key = pace_key(engine.describe(), probe.answers, "exact")
    run_probe(probe, engine, tmp_path / "first", manifest(probe))
    kept = recorded_pace(key)
    assert kept is not None and kept.per_second > 0
    assert kept.source.startswith("measured by the last run of this model on this machine (60 ")
    record_pace(key, Pace(2.0, "measured by the last run of this model on this machine"))
    capsys.readouterr()
    engine.scored = 0
    run_probe(probe, engine, tmp_path / "again", manifest(probe))
    first = capsys.readouterr().err.splitlines()[0]
    assert "60 prompts to score" in first and "about 30 s on this device (at 2 prompts/s, " in first
    assert engine.scored == 60  # no sample: the record said the pace
    other = pace_key({**engine.describe(), "dtype": "bfloat16"}, probe.answers, "exact")
    assert recorded_pace(other) is None  # another dtype is another pace
    assert recorded_pace(pace_key(engine.describe(), probe.answers, "generate")) is None


def test_a_pace_sample_keeps_no_rows(tmp_path):
    """The sample's batches are not the run's (which prompts share a batch decides the last
    digits), so its rows are dropped: the run's rows are those of a quiet run, which samples
    nothing."""
    probe = GroupProbe(events=6)
    said = run_probe(probe, CountingEngine(), tmp_path / "said", manifest(probe), chunk_size=4)
    with silenced():
        quiet = run_probe(
            probe, CountingEngine(), tmp_path / "quiet", manifest(probe), chunk_size=4
        )
    pd.testing.assert_frame_equal(pd.read_parquet(said), pd.read_parquet(quiet))
    names = [
        sorted(p.name for p in (tmp_path / run / "parts").iterdir()) for run in ("said", "quiet")
    ]
    assert names[0] == names[1]  # no part of the sample's


def test_a_run_of_several_probes_says_its_prompts_and_time_before_any_work(tmp_path):
    from probekit.run.loop import Shard
    from probekit.run.scoring import Pace, pace_key, record_pace
    from probekit.run.study import forecast_runs

    probes, engine = [GroupProbe(events=3), GroupProbe(events=9)], CountingEngine()
    record_pace(pace_key(engine.describe(), probes[0].answers, "exact"), Pace(4.0, "a record"))
    options = {"epsilon": 0.0, "batch_size": None, "seed": 0}
    line = forecast_runs(probes, engine, "exact", Shard(), **options)
    assert line == "24 prompts in 2 runs, about 6 s on this device (at the pace a record)"
    half = forecast_runs(probes, engine, "exact", Shard(0, 2), **options)
    assert half.startswith("12 prompts in 2 runs, about 3 s")  # this shard's share
    assert engine.scored == 0  # a recorded pace: nothing scored to say it


def test_a_quiet_run_says_nothing_but_its_results(tmp_path, capsys):
    from probekit import run_study

    run = run_study(FigureStudy.make(), CountingEngine(), out=tmp_path, days=3, quiet=True)
    assert run.path == tmp_path
    err = capsys.readouterr().err
    assert "prompts to go" not in err and "prompts to score" not in err


def test_a_run_says_how_many_prompts_and_how_to_make_it_smaller(tmp_path, capsys):
    from probekit import run_study

    run_study(FigureStudy.make(), CountingEngine(), out=tmp_path, days=3)
    first, *_ = capsys.readouterr().err.splitlines()
    assert first.startswith(f"minimal: 6 prompts to score into {tmp_path}, about ")
    assert "on this device (at " in first and first.endswith("; a smaller run: limit=N)")


def test_score_says_its_progress_unless_quiet(capsys):
    prompts = [f"How good is day {i}? 0 to 3." for i in range(9)]
    probekit.score(CountingEngine(), prompts, "0-3")
    err = capsys.readouterr().err
    assert (
        "score: 9 prompts to go; the first 4 took" in err
        and "(a smaller run: fewer prompts)" in err
    )
    probekit.score(CountingEngine(), prompts, "0-3", quiet=True)
    assert capsys.readouterr().err == ""


def test_the_score_command_takes_quiet(tmp_path, capsys, monkeypatch):
    import probekit.engines

    monkeypatch.setattr(probekit.engines, "load_engine", lambda *a, **k: CountingEngine())
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(f'{{"id": "{i}", "text": "Day {i}? 0 to 3."}}\n' for i in range(9)))
    args = ["score", "--prompts", str(prompts), "--answers", "0-3", "--scores", str(tmp_path / "s")]
    assert cli.main([*args, "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert cli.main(args) == 0
    assert "score: 9 prompts to go" in capsys.readouterr().err


@pytest.mark.slow
def test_patch_steer_and_capture_say_their_progress_unless_quiet(model, capsys):
    from conftest import EVENT

    prompts = [f"{EVENT} How angry is the driver, 0 to 12?", "How calm is a lake, 0 to 12?"]
    steer = dict(layers=[3], alphas=[1.0], answers="0-12", controls=0, batch_size=1)
    capture = dict(layers=[3], sites=["resid_post"], batch_size=1)
    vector = [1e-3] * model.hf.config.hidden_size  # a zero vector is refused
    capsys.readouterr()
    probekit.steer(model, prompts, vector, **steer)
    probekit.capture(model, prompts, **capture)
    err = capsys.readouterr().err
    for name in ("steering", "capture"):  # two batches of one: the estimate, then the end
        mine = [line for line in err.splitlines() if line.startswith(f"{name}:")]
        assert len(mine) == 2, err
        assert mine[0].startswith(f"{name}: 2 prompts to go; the first 1 took ")
        assert mine[1].startswith(f"{name}: 2 of 2 prompts (100%) in ")
    probekit.steer(model, prompts, vector, **steer, quiet=True)
    probekit.capture(model, prompts, **capture, quiet=True)
    assert capsys.readouterr().err == ""


def test_a_study_of_several_probes_says_the_whole_run_first(tmp_path, capsys):
    """`run_study` of a study of several probes (as `--category all --setting all`): its first
    line, before any probe starts, holds every prompt and the time they take on this device."""
    from minimal_study import MinimalProbe, MinimalStudy

    from probekit import run_study

    class TwoProbes(MinimalStudy):
        def probes(self, options, context):
            probes = [MinimalProbe(2), MinimalProbe(options.days)]  # two units at least
            for probe, subdir in zip(probes, ("two-days", "more-days"), strict=True):
                probe.subdir = subdir
            return probes

    run_study(TwoProbes(), CountingEngine(), out=tmp_path, days=3)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("minimal: 10 prompts in 2 runs, about ")
    assert "on this device (at the pace measured on " in lines[0]
    assert lines[0].endswith(f"model fake -> {tmp_path}")
    assert lines[1].startswith(f"minimal: 4 prompts to score into {tmp_path / 'two-days'}, about ")
    assert "after a warm-up" in lines[1]  # the sample kept for the probe's own line


def test_the_first_estimate_leaves_the_warm_up_out_and_holds_within_twice_the_real_time():
    """On a fake clock: a first call that pays 20 s of warm-up, then 0.05 s a prompt (a busy
    machine's pace). The estimate for 10,000 prompts, measured on one batch of 16, lies within
    2x of the real time (a pace from the first prompt alone would say 56 h for 8 min)."""
    from probekit.run.scoring import sample_pace

    now, calls = [0.0], []

    def score(batch):
        now[0] += (20.0 if not calls else 0.0) + 0.05 * len(batch)
        calls.append(len(batch))
        yield from ()

    pace = sample_pace(score, [(i, None) for i in range(16)], clock=lambda: now[0])
    real = 20.0 + 0.05 * 10_000
    assert calls == [1, 16]  # the warm-up on one prompt, then the batch timed
    assert real / 2 <= pace.seconds(10_000) <= 2 * real
    assert pace.source == "measured on 16 prompts after a warm-up"
