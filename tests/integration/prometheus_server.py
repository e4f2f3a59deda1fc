"""Debian's real ``prometheus`` server on loopback, for tests: start, query, stop.

Nothing is mocked: the binary from the ``prometheus`` package (``scripts/install_tools.sh``)
scrapes the given targets every second into a temporary TSDB folder and answers the HTTP API.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

SCRAPE_INTERVAL_S = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_binary(name: str) -> str:
    """The binary's path; a clear failure (never a skip) when it is not installed."""
    path = shutil.which(name)
    if path is None:
        raise AssertionError(
            f"`{name}` is not installed: run scripts/install_tools.sh "
            "(or `apt-get install prometheus`); this test needs the real Prometheus"
        )
    return path


class PrometheusServer:
    """One Prometheus process scraping ``targets`` (``host:port`` strings) under job ``job``."""

    def __init__(self, workdir: Path, targets: list[str], *, job: str = "orchestrator") -> None:
        self.binary = require_binary("prometheus")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
            },
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(json.dumps(config))  # JSON is valid YAML
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout_s} s: {self.log_tail()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at_s: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at_s is not None:
            params["time"] = at_s
        return list(self._get("/api/v1/query", params)["result"])

    def query_range(
        self, expr: str, start_s: float, end_s: float, step_s: float = 1.0
    ) -> list[dict[str, Any]]:
        data = self._get(
            "/api/v1/query_range", {"query": expr, "start": start_s, "end": end_s, "step": step_s}
        )
        return list(data["result"])

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self._get(f"/api/v1/label/{label}/values", {"match[]": match}))

    def wait_for(self, expr: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Poll an instant query until it returns a finite value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.query(expr)
            if finite_values(result):
                return result
            time.sleep(0.5)
        raise AssertionError(f"{expr} returned nothing for {timeout_s} s: {self.log_tail()}")


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    """Every finite sample value of an instant or range query result."""
    values: list[float] = []
    for series in result:
        points = series.get("values") or ([series["value"]] if "value" in series else [])
        for _, raw in points:
            number = float(raw)
            if math.isfinite(number):
                values.append(number)
    return values
