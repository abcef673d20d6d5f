"""`probekit run STUDY --ray [ADDRESS]`: a run's prompts scored by a pool of Ray actors, each
holding one loaded engine, on one machine or a cluster.

The driver (the `probekit run` process) enumerates the prompts that have no row yet (exactly as
a run in one process resumes), cuts them into fixed chunks of prompt indices and streams them to
the actors with back-pressure (at most `IN_FLIGHT` chunks queued per actor, so no actor waits
and the driver never holds more than that many chunks). An actor scores a chunk with the run
loop's own chunk function and returns its rows; the driver writes them as a finished part
(`probekit.run.parts.write_part`: the part's name comes from its prompt indices, so a chunk scored
twice writes the same file once), compacts parts as the run loop does, and merges
`scores.parquet` at the end. Only the driver touches the run directory: workers need probekit,
the model and nothing of the run's files.

A worker that dies mid-chunk (its process killed, its node lost) loses only that chunk: Ray
restarts the actor (the model loads again, on another node if its node is gone) and runs the
same chunk on it again, up to `RETRIES` times; rows arrive only from chunks that finished, so
none is lost or duplicated. A
Python error inside a worker (bad input) is raised in the driver as it is: one line for a
`ProbekitError`.

Why an actor pool and not Ray Data's `map_batches`: the chunks must be fixed sets of prompt
indices for a retried chunk to write the same part (Ray Data re-blocks rows as it goes), the
items are Python objects made lazily by the probe (Ray Data would hold them in its object store
as Arrow rows and run its own read and batching tasks, which on a 2-CPU machine compete with the
two actors for the CPUs), and the back-pressure needed is one bounded queue. The benchmark
`benchmarks/engines.py` measures the pool's overhead against one process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.options import given, named
from probekit.core.public import public
from probekit.engines import load_engine
from probekit.engines.base import Engine
from probekit.run.scoring import (
    Chunk,
    EnginePool,
    Scoring,
    local_scoring,
    pace_key,
    probe_row_bytes,
)
from probekit.studies.base import Probe

SETUP = "./setup.sh --ray"
CHUNK = 64  # prompts per chunk: 4 CPU batches; the most work a dead worker loses
IN_FLIGHT = 2  # chunks queued per actor
RETRIES = 3  # restarts of a dead actor, and runs again of the chunk it was scoring
CONNECT_SECONDS = 10.0  # to reach a given cluster address before saying it is unreachable
Loader = Callable[[], Engine]
"""Loads the engine inside a worker (e.g. `functools.partial(load_engine, spec, engine=...)`)."""


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the Ray cluster at `address` (`host:port`, `ray://host:port`, `auto`), else at
    `RAY_ADDRESS`, else start a local instance (with `num_cpus` if given). One line if Ray is
    not installed, the address cannot be reached within `CONNECT_SECONDS`, or the cluster asks
    for a token that this process does not give (Ray sends its token to a cluster named by
    address only under `RAY_AUTH_MODE=token`)."""
    try:
        import ray
    except ImportError:
        raise ProbekitError(
            f"{named('ray')} needs Ray, which is not installed here; run {SETUP}"
        ) from None
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    joining = address not in (None, "auto", "local")
    if joining:
        _check_reachable(address)
    # Joining by address, Ray's client logs each refused attempt to file descriptor 2 for ~10 s:
    # kept aside, and shown only where they say nothing that the one line below does not.
    with tempfile.TemporaryFile("w+") as log, _stderr_to(log if joining else None):
        try:
            ray.init(
                address=address,
                num_cpus=num_cpus if address is None else None,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="WARNING",
            )
            failure = None
        except (ConnectionError, RuntimeError, ValueError) as exc:
            failure = exc
        log.seek(0)
        client_log = log.read()
    if failure is None:
        sys.stderr.write(client_log)
        return
    where = address or "a local instance"
    reason = str(failure).strip().splitlines()[0] if str(failure).strip() else "no reason given"
    if "Unauthenticated" in client_log or "AuthToken" in client_log:
        reason = (
            "the cluster asks for its token (token authentication, on by default from Ray 2.59): "
            "set RAY_AUTH_MODE=token and put the head's ~/.ray/auth_token in the same place here "
            "(or its text in RAY_AUTH_TOKEN)"
        )
    raise ProbekitError(f"cannot start or join Ray at {where}: {reason}")


@contextlib.contextmanager
def _stderr_to(file: IO[str] | None) -> Iterator[None]:
    """Send this process's file descriptor 2 (where Ray's C++ client writes) to `file` for the
    block; `None` leaves it alone."""
    if file is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _check_reachable(address: str) -> None:
    """Fail fast, with one line, on an address whose port does not answer (Ray itself would
    retry for a minute or more)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ProbekitError(
            f"{given('ray', address)} is not a cluster address; give HOST:PORT (the head's GCS "
            "port, 6379 by default), ray://HOST:PORT, auto, or nothing for a local instance"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise ProbekitError(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}); start its head "
            "with `ray start --head` there, or leave out the address to run a local instance"
        ) from None


class Worker:
    """One Ray actor: a loaded engine, scoring chunks of a probe with one scorer.

    The probe comes with every chunk as a reference to the driver's one copy in the object store
    (fetched once per node), not as a constructor argument: Ray cannot restart an actor whose
    constructor arguments it has lost."""

    def __init__(self, load: Loader, view: str, options: dict[str, Any], threads: int | None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.view = view
        self.options = options
        self.engine = load()
        self.scoring: Scoring | None = None

    def run(self, probe: Probe, chunk: Chunk) -> pd.DataFrame:
        """The rows of one chunk of (prompt index, item), as the run loop makes them, except
        `parsed`: the driver parses, since a study may set its parser up in the driver's process
        only (ISEAR's NLTK tables)."""
        probe.parse = lambda response: None  # this actor's own copy of the probe
        if self.scoring is None:
            self.scoring = local_scoring(probe, self.engine, self.view, **self.options)
        return next(self.scoring.rows(iter([chunk]), None))


class RayScoring(Scoring):
    """A run's chunks scored by a pool of Ray actors (`Worker`), streamed with back-pressure;
    the driver parses generated responses. Its pace is the one recorded for Ray runs of the
    model on this machine, if any."""

    def __init__(
        self, probe: Probe, load: Loader, view: str, options: dict[str, Any], actors: int | None
    ) -> None:
        import ray

        self.ray, self.probe = ray, probe
        self.pool = _start_pool(ray, load, view, options, actors)
        self.shared = ray.put(probe)
        self.desc = f"{probe.name} (ray, {len(self.pool)} actors)"
        self.chunk_size = options["chunk_size"]
        self.row_bytes = probe_row_bytes(probe)  # the driver writes every row
        loads = repr(load.args) if isinstance(load, functools.partial) else repr(load)
        described = {"engine": "ray", "model": loads, "device": f"{len(self.pool)} actors"}
        self.key = pace_key(described, probe.answers, view)

    def rows(self, chunks: Iterator[Chunk], bar: Any) -> Iterator[pd.DataFrame]:
        for frame in _stream(self.ray, self.pool, self.shared, chunks):
            if "parsed" in frame:
                frame["parsed"] = [self.probe.parse(text) for text in frame["response"]]
            bar.update(len(frame))
            yield frame

    def close(self) -> None:
        for actor in self.pool:
            self.ray.kill(actor)


@public()
@dataclass(frozen=True)
class RayPool(EnginePool):
    """Engines on the connected Ray cluster (`connect` first), one per actor, each made by
    `load` inside its actor: give it to `probekit.run.loop.run_probe` in place of an engine to
    score the run there (the same run loop, `run_rows`; its chunk is `CHUNK` prompts unless
    `chunk_size` is given).

    `actors`: how many engines to load (default: one per GPU of the cluster, else one per node);
    on GPUs each actor takes one GPU, on CPUs an equal share of the CPUs as torch threads."""

    load: Loader
    actors: int | None = None

    def __post_init__(self) -> None:
        if self.actors is not None and self.actors < 1:
            raise ProbekitError(f"actors must be at least 1, not {self.actors}")

    def scoring(self, probe: Probe, view: str, **settings: Any) -> Scoring:
        settings["chunk_size"] = settings.get("chunk_size") or CHUNK  # 0 refused before
        return RayScoring(probe, self.load, view, settings, self.actors)


def load_in_tier(
    spec: str, engine: str, device: str | None, dtype: Any, precision: dict[str, Any]
) -> Engine:
    """An actor's engine (`probekit run --ray`): `spec` loaded on `engine`, put in the tier of
    `precision` (the run's manifest field, chosen by the driver) where the actor's device
    offers it."""
    loaded = load_engine(spec, engine=engine, device=device, dtype=dtype)
    loaded.keep_precision(precision)
    return loaded


def _start_pool(ray: Any, load: Loader, view: str, options: dict, actors: int | None) -> list:
    """The actors, each loading its engine (in parallel; the first chunk waits for it)."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    count = actors or gpus or max(1, len(nodes))
    if gpus:
        spec, threads = {"num_gpus": 1}, None
    else:
        per_node = min(int(n["Resources"].get("CPU", 1)) for n in nodes) if nodes else 1
        threads = max(1, min(per_node, int(resources.get("CPU", 1)) // count))
        spec = {"num_cpus": threads}
    remote = ray.remote(max_restarts=RETRIES, max_task_retries=RETRIES, **spec)(Worker)
    return [remote.remote(load, view, options, threads) for _ in range(count)]


def _stream(ray: Any, pool: list, probe: Any, chunks: Iterator[Chunk]) -> Iterator[pd.DataFrame]:
    """Each chunk's rows as its actor finishes it, at most `IN_FLIGHT` chunks queued per actor.
    A chunk whose actor died is run again by Ray on the restarted actor (`max_task_retries`);
    the run stops with one line only when that has failed `RETRIES` times."""
    from ray.exceptions import RayActorError, RayTaskError

    pending: dict[Any, tuple[list, int]] = {}  # ref -> (chunk, actor)
    queued = [0] * len(pool)

    def collect() -> pd.DataFrame:
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        chunk, actor = pending.pop(ref)
        queued[actor] -= 1
        try:
            return ray.get(ref)
        except RayTaskError as exc:
            if isinstance(exc.cause, ProbekitError):
                raise exc.cause from None
            raise
        except RayActorError as exc:
            raise ProbekitError(
                f"a Ray worker died {RETRIES + 1} times on prompts {chunk[0][0]}..{chunk[-1][0]} "
                f"({(str(exc).strip() or type(exc).__name__).splitlines()[0]}); the finished parts "
                "are kept: run the same command again to resume"
            ) from None

    for chunk in chunks:
        actor = min(range(len(pool)), key=queued.__getitem__)
        pending[pool[actor].run.remote(probe, chunk)] = (chunk, actor)
        queued[actor] += 1
        while len(pending) >= IN_FLIGHT * len(pool):
            yield collect()
    while pending:
        yield collect()
