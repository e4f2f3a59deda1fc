"""Small output helpers shared by the commands."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from orchestrator.errors import UserError


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename: never half-written."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise UserError(
            f"directory {path.parent} does not exist", field=str(path), fix="create it first"
        )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
