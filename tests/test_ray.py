"""Runs on Ray: two actors on a local instance (2 CPUs) write the rows one process writes, for two
studies; a worker killed mid-run costs its chunk, which runs again, and every prompt gets
exactly one row; an address where no cluster answers is one line, and so is one whose cluster
asks for a token this process was not told to give."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed here (./setup.sh --ray installs it)")

from probekit.core import io  # noqa: E402
from probekit.core.errors import ProbekitError  # noqa: E402
from probekit.core.store import INDEX  # noqa: E402
from probekit.datasets.crowd_envent import SAMPLE_ROOT, load_crowd_envent  # noqa: E402
from probekit.engines import load_engine  # noqa: E402
from probekit.run.loop import run_probe  # noqa: E402
from probekit.run.ray import RayPool, connect  # noqa: E402
from probekit.studies.intergroup import IntergroupProbe, get_category, get_setting  # noqa: E402
from probekit.studies.isear.events import SAMPLE_ROOT as ISEAR_SAMPLES  # noqa: E402
from probekit.studies.isear.events import load_events, sample_events  # noqa: E402
from probekit.studies.isear.probe import IsearProbe  # noqa: E402

CHUNK = 6
LOAD = functools.partial(load_engine, "default")


def intergroup_probe() -> IntergroupProbe:
    """36 prompts: religion, one sample event, the 10-point scale (a small answer trie)."""
    events = load_crowd_envent(SAMPLE_ROOT).head(1)
    return IntergroupProbe(get_category("religion"), get_setting("P0S1T0"), events)


def isear_probe() -> IsearProbe:
    """12 prompts: four sample events x three genders, 12 emotion words."""
    return IsearProbe(sample_events(load_events(ISEAR_SAMPLES), 4, seed=123))


def manifest(probe) -> dict:
    return {"model": "default", "probe": probe.config(), "view": "exact", "epsilon": 1e-4}


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance of 2 CPUs for this module."""
    connect(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def single(smol, tmp_path_factory):
    """Each probe's rows from one process, in the same chunks and, as each of the two actors,
    on one thread (the thread count alone moves fp32 sums in the last digits)."""
    out = tmp_path_factory.mktemp("single")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {
            make.__name__: pd.read_parquet(
                run_probe(probe, smol, out / make.__name__, manifest(probe), chunk_size=CHUNK)
            )
            for make in (intergroup_probe, isear_probe)
            for probe in [make()]
        }
    finally:
        torch.set_num_threads(threads)


def same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns)
    assert list(a[INDEX]) == list(range(len(a))) == list(b[INDEX])
    numbers = a.select_dtypes("number").columns
    assert np.abs(a[numbers].to_numpy() - b[numbers].to_numpy()).max() <= 1e-6
    others = [c for c in a.columns if c not in numbers]
    assert a[others].equals(b[others])


def test_a_pool_of_no_actors_or_no_loader_is_refused_in_one_line():
    with pytest.raises(ProbekitError, match="actors must be at least 1, not 0"):
        RayPool(LOAD, actors=0)
    with pytest.raises(ProbekitError, match="load"):
        RayPool("default")


@pytest.mark.slow
@pytest.mark.parametrize("make", [intergroup_probe, isear_probe])
def test_two_actors_write_the_rows_of_one_process(cluster, single, make, tmp_path):
    probe = make()
    pool = RayPool(LOAD, actors=2)
    path = run_probe(probe, pool, tmp_path / "ray", manifest(probe), chunk_size=CHUNK)
    assert path is not None
    same_rows(single[make.__name__], pd.read_parquet(path))


class DiesOnce:
    """The default engine, except that the worker process exits (as if killed) when it first
    encodes the prompt `victim`; `marker` makes the restarted worker live."""

    def __init__(self, victim: str, marker: str) -> None:
        self.engine = load_engine("default")
        self.victim, self.marker = victim, Path(marker)

    def encode(self, item, as_string=False):
        if item.id == self.victim and not self.marker.exists():
            self.marker.touch()
            os._exit(1)
        return self.engine.encode(item, as_string)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.mark.slow
def test_a_killed_worker_loses_no_row(cluster, single, tmp_path):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests
    probe = intergroup_probe()
    victim = list(probe.items())[20].id  # in the fourth chunk, after others finished
    marker = tmp_path / "died"
    load = functools.partial(DiesOnce, victim, str(marker))
    pool = RayPool(load, actors=2)
    path = run_probe(probe, pool, tmp_path / "ray", manifest(probe), chunk_size=CHUNK)
    assert marker.exists(), "the worker was not killed"
    scores = pd.read_parquet(path)
    assert scores[INDEX].is_unique and len(scores) == len(probe)
    same_rows(single["intergroup_probe"], scores)


@pytest.mark.slow
def test_a_disk_without_room_for_the_rows_is_refused_before_the_actors_score(
    cluster, tmp_path, monkeypatch
):
    """The driver writes every row, so its disk is checked as a run in one process checks it."""
    probe = intergroup_probe()
    usage = io.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(io.shutil, "disk_usage", lambda path: usage._replace(free=10))
    with pytest.raises(ProbekitError, match=r"its disk has 0 MiB free, the work writes about"):
        run_probe(probe, RayPool(LOAD, actors=1), tmp_path / "ray", manifest(probe))
    assert not any((tmp_path / "ray").glob("parts/*"))


JOIN = """
from probekit.core.errors import ProbekitError
from probekit.run.ray import connect
try:
    connect({address!r})
except ProbekitError as error:
    print(f"refused: {{error}}")
else:
    import ray
    print(f"joined: {{ray.cluster_resources()['CPU']:g}} CPUs")
"""


@pytest.mark.slow
def test_joining_by_address_gives_the_token_only_when_told(cluster, tmp_path):
    """The multi-node recipe's driver, joining the module's instance (token authentication is
    on by default for a Ray instance) by its address: without `RAY_AUTH_MODE=token` one line that
    says what to set; with it, the cluster."""
    if os.environ.get("RAY_AUTH_MODE") != "token":  # set by ray.init when it turns tokens on
        pytest.skip("this Ray's local instance runs without token authentication (Ray < 2.59)")
    code = JOIN.format(address=ray.get_runtime_context().gcs_address)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    outputs = {}
    for mode in ("", "token"):
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "RAY_AUTH_MODE": mode} if mode else env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        outputs[mode] = done.stdout.strip().splitlines()
    assert len(outputs[""]) == 1 and "set RAY_AUTH_MODE=token" in outputs[""][0]
    assert outputs["token"] == ["joined: 2 CPUs"]


def test_unreachable_address_is_one_line(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh `probekit run`
    with pytest.raises(ProbekitError, match="cannot reach the Ray cluster at 127.0.0.1:9"):
        connect("127.0.0.1:9")


@pytest.mark.slow
def test_a_slice_of_the_full_grid_on_ray_actors_writes_the_rows_of_one_process(
    cluster, tmp_path, monkeypatch
):
    """The full study's recipe (docs/performance.md, "The full study": `probekit run intergroup
    --category all --setting all --events all --ray`) on CPU workers, on a slice of its grid:
    religion in every prompt setting (seven probes, both answer sets), the whole units `--limit`
    keeps, a tiny random model read from a folder by each actor. Two Ray actors write every
    probe's rows, each prompt once, as the same run in one process does."""
    from probekit.core.rundir import RunDir
    from probekit.run import ray as pool
    from probekit.run.study import run_study
    from probekit.studies.intergroup.probe import SETTINGS
    from probekit.testing.synthetic import tiny_model

    model = tmp_path / "tiny"
    tiny = tiny_model()
    tiny.hf.save_pretrained(model)
    tiny.tokenizer.save_pretrained(model)
    grid = {"category": "religion", "setting": "all", "events": 1, "limit": 72}
    grid |= {"data": SAMPLE_ROOT, "numerics": 0, "quiet": True}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each of the two actors on 2 CPUs
    try:
        alone = run_study("intergroup", str(model), out=tmp_path / "one", **grid)
    finally:
        torch.set_num_threads(threads)
    started = []
    start_pool = pool._start_pool
    monkeypatch.setattr(
        pool, "_start_pool", lambda *a: started.append(start_pool(*a)) or started[-1]
    )
    ray_run = run_study(
        "intergroup", str(model), out=tmp_path / "ray", ray="", ray_actors=2, **grid
    )
    assert [len(actors) for actors in started] == [2] * len(SETTINGS)  # a pool for each probe
    probes = [f.relative_to(ray_run.path).as_posix() for f in ray_run.folders]
    assert probes == [f"religion/{s}" for s in SETTINGS]
    for one, many in zip(alone.folders, ray_run.folders, strict=True):
        rows = RunDir(many).scores()
        assert len(rows) == 72 and rows[INDEX].is_unique
        same_rows(RunDir(one).scores(), rows)
