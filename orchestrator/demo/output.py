"""The demo's own output, kept apart from Ray's.

Ray's driver prints messages of its own (a crashed raylet's last log lines, for one) to
``sys.stdout`` and ``sys.stderr``. While the demo runs, those go to ``ray-driver.log`` in the
demo's work directory; the demo writes its lines and its progress bar to the streams it started
with.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from rich.console import Console


class DemoOutput:
    """Lines above an optional progress bar, on the original stdout (bar on stderr)."""

    def __init__(self, quiet: bool = False) -> None:
        self.stdout: IO[str] = sys.stdout
        self.stderr: IO[str] = sys.stderr
        self.quiet = quiet
        self.console = Console(file=self.stderr)
        self._bar_console: Console | None = None

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self._bar_console is not None and self._bar_console.is_terminal:
            self._bar_console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stdout, flush=True)

    def attach_bar(self, console: Console | None) -> None:
        self._bar_console = console

    @property
    def is_terminal(self) -> bool:
        return self.console.is_terminal


@contextlib.contextmanager
def ray_output_to(path: Path) -> Iterator[None]:
    """Send what is written to ``sys.stdout``/``sys.stderr`` to ``path`` meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = sys.stdout, sys.stderr
    with open(path, "a", buffering=1) as log:
        sys.stdout = sys.stderr = log
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved
