"""What every benchmark script shares: the common options (probekit's own `--model`, `--device`,
`--dtype`, `--batch-size`, `--seed` and `--epsilon` from their one declaration) and the data root,
the set-up (threads,
load averages, a warm-up forward) and its end, the first prompts of a probe, timing a call, a
target's verdict, steps that fail or are interrupted without losing what was measured.

The scripts run as `python benchmarks/NAME.py`, so this folder is on `sys.path` and they import
this module as `common`."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from probekit.core.options import REQUIRED, Command, flag
from probekit.core.shared_options import BatchSizeOption, SeedOption
from probekit.engines.options import EpsilonOption, ModelOptions

if TYPE_CHECKING:
    from probekit.engines.base import Engine, ScorerStats
    from probekit.engines.hf.model import LoadedModel
    from probekit.studies.base import Probe

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SHARED_DATA = REPO.parent / "shared" / "data"


DATA_HELP = (
    "data root (default: $PROBEKIT_DATA, else ../shared/data next to the repo if present, else "
    "the studies' own default)"
)


SHARED = Command("benchmark", (ModelOptions, SeedOption, BatchSizeOption, EpsilonOption))
"""probekit's options a benchmark may take, as the commands declare them."""


def shared_options(parser: argparse.ArgumentParser, *names: str, **defaults: Any) -> None:
    """Add probekit's options `names` (`model`, `device`, `dtype`, `batch_size`, `seed`,
    `epsilon`) to a benchmark's parser with the commands' flag, kind, help and default (one
    declaration each); `defaults`: the benchmark's own, where it differs."""
    command = Command(SHARED.name, SHARED.groups, defaults=defaults)
    for name in names:
        field = command.taken()[name][1]
        default = None if command.default(field) is REQUIRED else command.default(field)
        parser.add_argument(flag(name), **command.argument(field) | {"default": default})


def argument_parser(
    prog: str, description: str, epilog: str | None = None, data_help: str = DATA_HELP
) -> argparse.ArgumentParser:
    """A parser with the options every model benchmark takes (--model, --device, --data,
    --threads, --json); the script adds its own."""
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog)
    shared_options(parser, "model", "device")
    parser.add_argument("--data", default=None, metavar="ROOT", help=data_help)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="T",
        help="torch threads (default: torch's default)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="also write the numbers here"
    )
    return parser


def data_root(data: str | None) -> str | None:
    """`data`, else `../shared/data` beside the repository when it exists and $PROBEKIT_DATA is
    unset, else None (probekit's own default)."""
    if data is None and not os.environ.get("PROBEKIT_DATA") and SHARED_DATA.is_dir():
        return str(SHARED_DATA)
    return data


@dataclass
class Timing:
    """One timed method: `cpu_seconds` is this process's CPU time (all threads) over the run."""

    method: str
    prompts: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.prompts / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class Target:
    name: str
    value: float | None
    limit: float
    higher_is_better: bool
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.value is None or not np.isfinite(self.value):
            return "SKIP"
        ok = self.value >= self.limit if self.higher_is_better else self.value <= self.limit
        return "PASS" if ok else "FAIL"


def print_targets(targets: list[Target], heading: str) -> None:
    print()
    print(heading)
    for t in targets:
        value = "-" if t.value is None else f"{t.value:.3g}"
        print(f"  {t.name:<34} {value:>10}  {t.verdict}  {t.note}".rstrip())


def step_names(allowed: Sequence[str]) -> Callable[[str], set[str]]:
    """An argparse type: comma-separated names, each one of `allowed`."""

    def parse(text: str) -> set[str]:
        names = {name for name in text.split(",") if name}
        if not names:
            raise argparse.ArgumentTypeError(f"name at least one step ({', '.join(allowed)})")
        if names - set(allowed):
            unknown = ", ".join(sorted(names - set(allowed)))
            raise argparse.ArgumentTypeError(f"no step {unknown} (steps: {', '.join(allowed)})")
        return names

    return parse


def measured(name: str, measure: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
    """The records of step `name`, `measure(*args)` (a record or a list of them); where it
    raises, its traceback printed and one record that says so (the figure's unit: `failed: ...`),
    so that a run goes on to its other steps."""
    try:
        got = measure(*args)
    except Exception as error:
        traceback.print_exc()
        print(f"{name}: failed ({type(error).__name__}); the run goes on")
        return [{"step": name, "skipped": f"failed: {type(error).__name__}: {error}"}]
    return got if isinstance(got, list) else [got]


@contextlib.contextmanager
def until_interrupted(then: str) -> Iterator[None]:
    """Run the block until it ends or Ctrl-C (`timeout -s INT`) stops it, which says `then`."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"interrupted: {then}")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def reset_peak(device: torch.device) -> None:
    """Start a new peak-memory count on `device` (the CPU's resident peak cannot be reset)."""
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory since `reset_peak`: CUDA's allocator, else the process's resident peak."""
    import resource

    if device.type == "cuda":
        peak, of = torch.cuda.max_memory_allocated(device), "cuda allocator"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        of = "process (CPU resident, whole run)"
    return {"peak_memory_mib": round(peak / 2**20, 1), "peak_of": of}


def release(device: torch.device) -> None:
    """Free what dropped models held: collect them, and empty CUDA's cache on a GPU."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed(device: torch.device, fn: Callable[[], T]) -> tuple[T, float, float]:
    """fn's result, wall seconds and process CPU seconds (its CUDA work included on a GPU)."""
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def load_line(label: str) -> tuple[float, float, float]:
    """Print and return the 1/5/15-minute load averages."""
    load = os.getloadavg()
    print(f"load average {label}: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min)")
    return load


def warn_load(load1: float, own: float, threshold: float | None = None) -> None:
    """Warn on stderr when processes other than this one (`own` threads) load the CPUs."""
    threshold = 0.75 * (os.cpu_count() or 1) if threshold is None else threshold
    others = load1 - own
    if others > threshold:
        print(
            f"WARNING: load from other processes ~{others:.1f} (> {threshold:.1f}) on "
            f"{os.cpu_count()} CPUs: the timings are distorted; rerun on a quiet machine",
            file=sys.stderr,
        )


def set_up(threads: int | None) -> tuple[float, float, float]:
    """Set torch's thread count (None: torch's default), then print the load averages and warn
    when other processes load the CPUs; return the load averages."""
    if threads is not None:
        torch.set_num_threads(threads)
    load = load_line("at start")
    warn_load(load[0], 0.0)
    return load


def tear_down(device: torch.device) -> tuple[float, float, float]:
    """The load averages at the end (this run's own threads discounted on a CPU), printed."""
    load = load_line("at end (includes this run's own threads)")
    warn_load(load[0], float(torch.get_num_threads()) if device.type == "cpu" else 0.0)
    return load


def warm_up(model: LoadedModel, ids: list[int]) -> None:
    """One forward of `ids` before anything is timed: the first pays one-off set-up costs."""
    from probekit.engines.hf.forward import body

    with torch.inference_mode():
        body(model, torch.tensor([ids], device=model.device))
    synchronize(model.device)


def first_prompts(model: Engine, probe: Probe, n: int) -> list[list[int]]:
    """Token ids of the probe's first `n` prompts in probe order, encoded as the probe asks."""
    items = itertools.islice(probe.items(), n)
    return [model.encode(item, probe.as_string).input_ids for item in items]


def json_ready(value: Any) -> Any:
    """numpy scalars as Python numbers (for `json.dumps`)."""
    return value.item() if isinstance(value, np.generic) else value


def trie_rates(stats: ScorerStats, model: LoadedModel) -> dict[str, float]:
    """The trie pass's positions/s against the prompt pass's tokens/s (`Scorer.stats`), with and
    without the trie's LM head, and the ratio the arithmetic allows: a prompt token runs the
    transformer body, a trie position the body plus the LM head over the whole vocabulary, so
    positions/s <= tokens/s x body / (body + head) in multiply-adds per position."""
    prompt_rate = stats.prompt_tokens / stats.prompt_seconds
    trie_rate = stats.trie_positions / stats.trie_seconds
    body_rate = stats.trie_positions / (stats.trie_seconds - stats.head_seconds)
    from probekit.engines.hf.head import parameter_split

    body, head = parameter_split(model)
    return {
        "prompt_tokens_per_s": prompt_rate,
        "trie_positions_per_s": trie_rate,
        "trie_vs_prompt": trie_rate / prompt_rate,
        "trie_without_head_vs_prompt": body_rate / prompt_rate,
        "head_share_of_trie": stats.head_seconds / stats.trie_seconds,
        "bound_from_flops": body / (body + head),
    }


def trie_rates_line(rates: dict[str, float]) -> str:
    return (
        f"trie pass {rates['trie_positions_per_s']:.0f} positions/s = "
        f"{rates['trie_vs_prompt']:.0%} of the prompt pass's {rates['prompt_tokens_per_s']:.0f} "
        f"tokens/s ({rates['trie_without_head_vs_prompt']:.0%} without the trie's LM head, "
        f"{rates['head_share_of_trie']:.0%} of the trie pass; the multiply-adds allow "
        f"{rates['bound_from_flops']:.0%})"
    )


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU model and count, memory, OS, Python and torch."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": memory,
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def device_name(device: torch.device | str) -> str:
    """`cpu`, or the accelerator's type and name (`cuda: NVIDIA H100 80GB HBM3`)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return device.type


def commit() -> str:
    """The checkout's commit, `+changes` when tracked files differ from it; `unknown` outside
    git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+changes" if dirty else head


def write_results(
    benchmark: str,
    figures: list[dict[str, Any]],
    *,
    device: torch.device | str,
    threads: int | None,
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
    argv: list[str] | None = None,
    path: Path | None = None,
    details: dict[str, Any] | None = None,
    note: str | None = None,
) -> Path:
    """Write one benchmark run's figures as JSON (default `benchmarks/results/<benchmark>.json`)
    with what they were measured on: machine, device, threads, load averages, commit, date and
    the command that reproduces them. `docs/performance.md` is generated from these files
    (`python benchmarks/report.py`).

    Each figure is a dict with `figure` (what it is, in words), `value` and `unit` (and any
    other keys, kept as they are); `details`, the script's own fuller record, is kept beside
    them under `details`; `note`, what a reader must know beside them, is printed above them."""
    for figure in figures:
        if not {"figure", "value", "unit"} <= figure.keys():
            raise ValueError(f"a figure needs 'figure', 'value' and 'unit', got {sorted(figure)}")
    argv = sys.argv if argv is None else argv
    record = {
        "benchmark": benchmark,
        "command": " ".join(["python", f"benchmarks/{Path(argv[0]).name}", *argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": machine(),
        "device": device_name(device),
        "threads": torch.get_num_threads() if threads is None else threads,
        "load_average": {
            "start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in load_end],
        },
        "figures": figures,
    }
    if note is not None:
        record["note"] = note
    if details is not None:
        record["details"] = details
    path = RESULTS / f"{benchmark}.json" if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=json_ready) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return path
