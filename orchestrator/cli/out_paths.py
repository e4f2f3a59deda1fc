"""Output paths checked before any work, and outputs of several files written all or nothing.

:func:`check_output_file` refuses a path that is a folder, lies under a file or in a missing
folder, or where a file cannot be created (read-only, not permitted: tried with a probe file,
since permission bits do not bind every user). :class:`AllOrNothing` stages each output beside
its target and renames them into place only when every one was written.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import UserError


def check_output_file(path: Path, flag: str) -> None:
    """Refuse ``path`` as an output file (one line naming ``flag``) unless it can be written."""
    if path.is_dir():
        raise UserError(f"{path} is a folder", field=flag, fix="give a file name inside it")
    parent = path.parent
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserError(
            f"{probe} is a file, so {path} cannot be written", field=flag, fix="give another path"
        )
    if not parent.exists():
        raise UserError(f"folder {parent} does not exist", field=flag, fix="create it first")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    except OSError as exc:
        raise UserError(
            f"cannot write in {parent}: {exc.strerror or exc}",
            field=flag,
            fix="give a writable location",
        ) from None
    os.close(fd)
    os.unlink(tmp)


def check_output_dir(path: Path, flag: str) -> None:
    """Refuse ``path`` as an output folder unless it is, or can become, a writable folder."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(
            f"{probe} is a file, so {path} cannot be a folder", field=flag, fix="give a folder"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".orchestrator-probe-", dir=probe))
    except OSError as exc:
        raise UserError(
            f"cannot create folders in {probe}: {exc.strerror or exc}",
            field=flag,
            fix="give a writable location",
        ) from None


class AllOrNothing:
    """Stage outputs next to their targets; :meth:`commit` renames all, else none is left."""

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []

    def stage(self, target: Path, write: Callable[[Path], None]) -> None:
        """Call ``write(tmp)`` for a temporary path in ``target``'s folder (same suffix)."""
        fd, name = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent
        )
        os.close(fd)
        tmp = Path(name)
        self._staged.append((tmp, target))
        write(tmp)

    def commit(self) -> None:
        for tmp, target in self._staged:
            os.replace(tmp, target)
        self._staged = []

    def discard(self) -> None:
        for tmp, _ in self._staged:
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._staged = []
