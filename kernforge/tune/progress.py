"""The sweep's progress bar: configurations finished out of planned, the compiled / verified
/ timed / rejected counts, and the best so far, redrawn by rich while a sweep runs.

A sweep is minutes of compiling with nothing else to show, so the bar is what tells the
user it is moving and whether it has found anything yet.  It draws only on a terminal: in
CI logs and pipes it stays silent, so the output is exactly the results (``--json`` stays
parseable).
"""
from __future__ import annotations

import sys
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kernforge.tune.db import canonical

# events that settle a configuration for good (a re-timed one is not finished twice)
_FINAL = ("timed", "rejected", "pruned", "reused")


class SweepProgress:
    """A ``progress=`` callback for :func:`kernforge.tune.tune`, and a context manager that
    owns the live display.  ``console`` defaults to stderr; a console that is not a
    terminal (or ``enabled=False``) keeps the counts and draws nothing."""

    def __init__(self, kernel: str, console: Optional[Console] = None, enabled: Optional[bool] = None):
        self.console = console or Console(file=sys.stderr)
        self.enabled = self.console.is_terminal if enabled is None else enabled
        self.counts = dict(compiled=0, verified=0, timed=0, rejected=0, pruned=0, reused=0)
        self._finished: set = set()
        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("{task.fields[counts]}"),
                             console=self.console, transient=True, disable=not self.enabled)
        self._task = self._bar.add_task(f"tune {kernel}", total=None, counts="")

    def __enter__(self) -> "SweepProgress":
        self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.stop()

    def line(self, result) -> str:
        """The counts and the best so far, as the bar shows them."""
        text = " · ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        lead = result.leader
        if lead is not None:
            shown = " ".join(f"{k}={lead.config[k]}" for k, vals in result.space.items() if len(vals) > 1)
            text += f" | best {lead.median_ms:.4g} ms" + (f" ({shown})" if shown else "")
        return text

    def __call__(self, event: str, config: dict, result) -> None:
        key = canonical(config)
        if event != "timed" or key not in self._finished:  # a re-timing is not a new timing
            self.counts[event] += 1
        if event in _FINAL:
            self._finished.add(key)
        self._bar.update(self._task, total=result.planned or None, completed=len(self._finished),
                         counts=self.line(result))
