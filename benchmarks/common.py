"""What every benchmark script shares: timing a call, the load-average lines, a target's verdict.

The scripts run as `python benchmarks/NAME.py`, so this folder is on `sys.path` and they import
this module as `common`."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

if TYPE_CHECKING:
    from probekit.engines.base import ScorerStats
    from probekit.engines.hf.model import LoadedModel

T = TypeVar("T")


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


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


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
