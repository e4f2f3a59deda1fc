"""A real ``ray start --head`` on free ports, stopped by its process group at the end.

Never ``ray stop``: that ends every Ray process on the machine, other runs' too. ``--block`` keeps
``ray start`` in the foreground; it runs in a new session, so its daemons (GCS, raylet,
dashboard, workers) share its process group and one ``killpg`` ends them all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class RayHead:
    gcs_address: str
    dashboard_url: str
    env: dict[str, str]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait_for_dashboard(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=2) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            # Ray's token authentication (on where ~/.ray/auth_token exists) answers 401: the
            # dashboard is up, and `ray job submit` on this machine reads the same token.
            if exc.code in (401, 403):
                return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"Ray dashboard at {url} not up within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    time.sleep(2.0)  # the daemons stop after ray start itself; give them a moment
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@contextlib.contextmanager
def ray_head(num_cpus: int, labels: dict[str, str], extra_env: dict[str, str]) -> Iterator[RayHead]:
    """Start a one-node Ray cluster with ``labels``; yield its addresses; stop it by pid."""
    ports = free_ports(9)
    temp_dir = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Unix socket paths are limited
    env = {**os.environ, **extra_env, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    cmd = [
        str(VENV_BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
        f"--port={ports[0]}", f"--dashboard-port={ports[1]}", "--include-dashboard=true",
        f"--ray-client-server-port={ports[2]}", f"--dashboard-agent-listen-port={ports[3]}",
        f"--dashboard-agent-grpc-port={ports[4]}", f"--runtime-env-agent-port={ports[5]}",
        f"--metrics-export-port={ports[6]}", f"--node-manager-port={ports[7]}",
        f"--object-manager-port={ports[8]}", f"--num-cpus={num_cpus}", f"--temp-dir={temp_dir}",
        "--labels", ",".join(f"{k}={v}" for k, v in labels.items()),
    ]  # fmt: skip
    log = open(Path(temp_dir) / "ray-start.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    dashboard = f"http://127.0.0.1:{ports[1]}"
    try:
        _wait_for_dashboard(dashboard, proc, timeout_s=300)  # a readiness wait, not a timing test
        yield RayHead(f"127.0.0.1:{ports[0]}", dashboard, env)
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def snapshot_repo(repo: Path, dest: Path) -> Path:
    """Copy the files git would ship (tracked and untracked-not-ignored) into ``dest``.

    Submitting from a snapshot keeps the uploaded package stable while other processes write
    into the checkout (Ray hashes the directory, then uploads it).
    """
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=repo, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        src = repo / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest
