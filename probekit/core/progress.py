"""Progress of every long call (the run loop, `probekit.score`, `patch`, `steer`, `capture`), by
one helper: `progress(total, unit, desc)` gives an object with tqdm's `update(n)` and `close()`.

- On a terminal (or in a notebook) it is a live tqdm bar.
- Anywhere else (output sent to a log file, a background job, CI) it writes one plain line on
  stderr whenever another 10 % of the work is done or 30 s have passed since the last line,
  and one at the end: a log shows how far a call is and how long it has left, without the
  carriage returns of a bar.
- Either way, once the first batch is done it says, in one line, how long the whole call will
  take on this device at that pace (`estimate`), with the caller's hint on how to make it
  smaller; the run loop gives that line before the rest of the prompts are scored (a call done
  in one batch just ends with its line).
- Inside `silenced()` (the `quiet` keyword of the API functions, `--quiet` on the command line)
  nothing is written. Lines about the state of a run (a part set aside) are not progress and
  are still said.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Any

from probekit.core.options import as_keywords

LOG_STEP = 0.1
"""Fraction of the work between two progress lines in a log."""
LOG_SECONDS = 30.0
"""Seconds after which a log gets a progress line even if less than `LOG_STEP` was done."""

_QUIET: ContextVar[bool] = ContextVar("probekit_quiet", default=False)


@contextmanager
def silenced(on: bool = True) -> Iterator[None]:
    """No progress lines, bars or estimates inside the block when `on` (a block inside a quiet
    one stays quiet)."""
    token = _QUIET.set(on or _QUIET.get())
    try:
        yield
    finally:
        _QUIET.reset(token)


def is_quiet() -> bool:
    return _QUIET.get()


def shown(text: str, stream: IO[str]) -> str:
    """`text` as `stream` shows it: the command line's streams write the options a line names
    as flags themselves (`names_flags`, `probekit.cli.main.Flagged`); any other stream gets
    Python's keywords."""
    return text if getattr(stream, "names_flags", False) else as_keywords(text)


def echo(*values: Any, file: IO[str] | None = None, **kwargs: Any) -> None:
    """`print`, with the options its line names as the stream shows them (`shown`)."""
    stream = file or sys.stdout
    print(shown(" ".join(str(v) for v in values), stream), file=stream, **kwargs)


def note(message: str) -> None:
    """A line about the work ahead (what a call will score, how to make it smaller) on stderr,
    unless quiet."""
    if not is_quiet():
        echo(message, file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """`75` -> `1 min 15 s`, `4000` -> `1 h 07 min`: a time a reader takes in at a glance."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    """The progress of one call: `bar`, a live tqdm bar (a terminal), or None (a log), where
    it writes one line per `LOG_STEP` of the work or `LOG_SECONDS`, and one at the end; after
    the first batch, either way, the estimate. With no `stream` it writes nothing."""

    def __init__(
        self,
        total: int,
        unit: str = "prompt",
        desc: str = "",
        hint: str | None = None,
        stream: IO[str] | None = None,
        live: Any = None,
    ) -> None:
        self.total, self.desc, self.hint, self.stream = total, desc, hint, stream
        self.units = unit if total == 1 else f"{unit}s"
        self.bar = live  # a tqdm bar on a terminal, None in a log
        self.done = self.last_done = 0
        self.started = self.last_time = time.monotonic()

    def update(self, n: int = 1) -> None:
        first = self.done == 0 and n > 0
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        now = time.monotonic()
        if first and self.done < self.total:
            self._write(self.estimate(now - self.started))
            self.last_time, self.last_done = now, self.done
            return
        if self.bar is None and self.done < self.total:
            step = self.done - self.last_done >= LOG_STEP * self.total
            if step or now - self.last_time >= LOG_SECONDS:
                self._write(self.line(now))
                self.last_time, self.last_done = now, self.done

    def estimate(self, seconds: float) -> str:
        """How long the whole call takes at the pace of its first `done` units (`seconds`)."""
        whole = seconds * self.total / max(self.done, 1)
        text = (
            f"{self.desc}: {self.total} {self.units} to go; the first {self.done} took "
            f"{duration(seconds)}, so about {duration(whole)} in all on this device"
        )
        return text + (f" (a smaller run: {self.hint})" if self.hint else "")

    def line(self, now: float) -> str:
        elapsed = now - self.started
        text = (
            f"{self.desc}: {self.done} of {self.total} {self.units} "
            f"({100 * self.done / max(self.total, 1):.0f}%) in {duration(elapsed)}"
        )
        if self.done < self.total and self.done:
            text += f", about {duration(elapsed * (self.total - self.done) / self.done)} left"
        return text

    def _write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(shown(text, self.stream), file=self.stream)  # type: ignore[arg-type]
        elif self.stream is not None:
            echo(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.done and self.last_done != self.done:
            self._write(self.line(time.monotonic()))
        self.last_done = self.done

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Silent(Progress):
    """Progress that writes nothing (quiet, or no work)."""

    def __init__(self) -> None:
        super().__init__(0)


def progress(
    total: int,
    unit: str = "prompt",
    desc: str = "",
    hint: str | None = None,
    stream: IO[str] | None = None,
) -> Progress:
    """The progress of a call that does `total` units of work (`desc` names it in every line;
    `hint` says how to make it smaller, in the estimate): a live bar on a terminal or in a
    notebook, plain lines in a log, nothing when quiet or when there is nothing to do."""
    stream = stream or sys.stderr
    if is_quiet() or total <= 0:
        return Silent()
    bar = None
    if "ipykernel" in sys.modules or getattr(stream, "isatty", lambda: False)():
        from tqdm.auto import tqdm  # a bar redraws itself: a terminal, or a Jupyter kernel

        bar = tqdm(total=total, unit=unit, desc=desc, file=stream, mininterval=0.1)
    return Progress(total, unit, desc, hint, stream, bar)
