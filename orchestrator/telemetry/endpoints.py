"""Where this machine's runs serve their telemetry, so ``orchestrator status`` finds them.

A server that starts writes ``<dir>/<pid>-<port>.json`` (its URL, process id and start time) and
removes it when it stops; ``<dir>`` is ``$XDG_RUNTIME_DIR/orchestrator/endpoints``, else
``<temp dir>/orchestrator-<uid>/endpoints``. Records of processes that no longer run are skipped
(and removed). Only runs on this machine are recorded here; a controller on another node is
reached with ``--address``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path


def endpoints_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "orchestrator" / "endpoints"
    return Path(tempfile.gettempdir()) / f"orchestrator-{os.getuid()}" / "endpoints"


def record(url: str, port: int) -> Path | None:
    """Record a serving endpoint of this process; None when the folder cannot be written."""
    folder = endpoints_dir()
    path = folder / f"{os.getpid()}-{port}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "started_s": time.time()}))
        tmp.replace(path)
    except OSError:
        return None  # telemetry still serves; status then needs --address
    return path


def forget(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_endpoints() -> list[str]:
    """URLs of endpoints recorded by running processes, newest first."""
    found: list[tuple[float, str]] = []
    folder = endpoints_dir()
    if not folder.is_dir():
        return []
    for path in folder.glob("*.json"):
        try:
            doc = json.loads(path.read_text())
            pid, url, started = int(doc["pid"]), str(doc["url"]), float(doc["started_s"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _alive(pid):
            forget(path)
            continue
        found.append((started, url))
    return [url for _, url in sorted(found, reverse=True)]
