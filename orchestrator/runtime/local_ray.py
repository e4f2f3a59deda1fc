"""A private Ray temp root for the local clusters this process starts, and cleanup by pid.

``ray.cluster_utils.Cluster`` writes (and on shutdown deletes) its address file under Ray's
default temp root, ``$RAY_TMPDIR`` else ``$TMPDIR`` else ``/tmp``, followed by ``/ray``, whatever
``temp_dir`` its nodes are given. On a fresh machine, or with ``TMPDIR`` set to a new folder, that
``ray`` folder does not exist and the start fails half way (its head's processes left running);
beside another Ray cluster it overwrites that cluster's address file, and a later plain
``ray.init()`` would join the wrong cluster.

:func:`private_ray_root` gives the local cluster its own root: a new short folder with its
``ray`` folder created, set as ``RAY_TMPDIR`` (and ``RAY_ADDRESS`` cleared) while the cluster
lives, so its address file, sessions and sockets stay inside it, and restored afterwards.

The root also holds the emulated devices' shared reference CPU times
(``worker/emulation.SharedReferences``), unless the caller already named a folder for them: a
local cluster's nodes are one host, so the least CPU time of a piece of work is the host's, and
every rank that runs it learns it together. Where nothing is emulated nothing reads them.
:func:`kill_started` stops, by process id, every process a failed start left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from orchestrator.runtime.local_nodes import descendants
from orchestrator.worker.emulation import SHARED_REFERENCES_ENV

# Ray's Unix socket paths (``<root>/session_<date>_<pid>/sockets/...``) must stay under ~107
# bytes; a longer base than this is replaced by /tmp.
MAX_BASE_CHARS = 40
_ENV_KEYS = ("RAY_TMPDIR", "RAY_ADDRESS", SHARED_REFERENCES_ENV)


def short_temp_base() -> str:
    """Where to make the private root: ``$TMPDIR`` when short and writable, else ``/tmp``."""
    for base in (os.environ.get("TMPDIR"), "/tmp", tempfile.gettempdir()):
        if base and len(base) <= MAX_BASE_CHARS and os.access(base, os.W_OK | os.X_OK):
            return base
    return tempfile.gettempdir()


def make_private_root(base: str | None = None) -> str:
    """A new folder ``<base>/orcXXXXXXXX`` with its ``ray`` sub-folder (the address file's)."""
    root = tempfile.mkdtemp(prefix="orc", dir=base or short_temp_base())
    os.mkdir(os.path.join(root, "ray"))
    return root


class PrivateRayEnv:
    """Points Ray's default temp root at ``root`` until :meth:`restore` (idempotent), and the
    emulated devices' shared reference times at a folder there unless a caller named one (see
    the module docstring); node processes inherit both."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._saved: dict[str, str | None] | None = {k: os.environ.get(k) for k in _ENV_KEYS}
        os.environ["RAY_TMPDIR"] = root
        # An inherited address would make a plain ray.init() (ours or a library's) join it.
        os.environ.pop("RAY_ADDRESS", None)
        if not os.environ.get(SHARED_REFERENCES_ENV):  # a benchmark's own folder is kept
            os.environ[SHARED_REFERENCES_ENV] = os.path.join(root, "emulation-references")

    def restore(self) -> None:
        if self._saved is None:
            return
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = None


@contextlib.contextmanager
def private_ray_root(base: str | None = None) -> Iterator[str]:
    """A private Ray temp root for the ``with`` block; removed afterwards."""
    root = make_private_root(base)
    env = PrivateRayEnv(root)
    try:
        yield root
    finally:
        env.restore()
        shutil.rmtree(root, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def child_pids() -> set[int]:
    """Every running process descended from this one."""
    return {pid for pid in descendants(os.getpid()) if _running(pid)}


def kill_started(before: Iterable[int], wait_s: float = 10.0) -> list[int]:
    """SIGKILL every descendant of this process not in ``before``; returns their pids.

    Waits (up to ``wait_s``) until they are gone, reaping this process's own children.
    """
    known = set(before)
    started = sorted(child_pids() - known)
    for pid in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    left = set(started)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)  # our direct children: reap, so none stays a zombie
            if not _running(pid):
                left.discard(pid)
        if left:
            time.sleep(0.05)
    return started
