"""``orchestrator status``: what the running job is doing, and why.

Reads the controller's status endpoint (``GET /v1/status`` of the telemetry server, the same
host and port as its ``/metrics``) and prints the state, the plan, the nodes by device type,
throughput against the prediction and the last events. ``--json`` prints the document as it came.
Exit codes: 0 on success, 1 when no job answers at the address.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from orchestrator.errors import UserError

DEFAULT_ADDRESS = "http://127.0.0.1:9400"  # telemetry.server.DEFAULT_HOST / DEFAULT_PORT
EXIT_NO_JOB = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show the running job: state, plan, nodes, speed and last events",
        description="Connect to a running job's controller and print its status.",
    )
    parser.add_argument(
        "--address",
        help=f"the controller's telemetry endpoint, http://HOST:PORT (default {DEFAULT_ADDRESS}, "
        "then the endpoints runs on this machine recorded)",
    )
    parser.add_argument("--json", action="store_true", help="print the status document as JSON")
    parser.add_argument("--events", type=int, default=10, help="how many last events to show")
    parser.add_argument(
        "--timeout-s", type=float, default=5.0, help="connection timeout in seconds (default 5)"
    )
    parser.set_defaults(func=run_status)


def status_url(address: str) -> str:
    """``http://host:port[/...]`` -> ``http://host:port/v1/status``; refuse anything else."""
    address = address.strip().rstrip("/")
    if "://" not in address:
        address = f"http://{address}"
    scheme = address.split("://", 1)[0]
    if scheme not in ("http", "https"):
        raise UserError(
            f"{address!r} is not an HTTP address",
            field="--address",
            fix="give the controller's telemetry endpoint, e.g. http://10.0.0.5:9400",
        )
    for suffix in ("/metrics", "/v1/status"):
        if address.endswith(suffix):
            address = address[: -len(suffix)]
    _check_host_port(address.split("://", 1)[1])
    return f"{address}/v1/status"


def _check_host_port(netloc: str) -> None:
    """``host[:port]`` with a port 1..65535, else a one-line error naming --address."""
    netloc = netloc.split("/", 1)[0]
    host, sep, port = netloc.rpartition(":")
    if not sep:
        host, port = netloc, ""
    if not host:
        raise UserError(f"{netloc!r} has no host", field="--address", fix="give http://HOST:PORT")
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise UserError(
            f"port {port!r} is not a number in 1..65535",
            field="--address",
            fix="give http://HOST:PORT, e.g. http://127.0.0.1:9400",
        )


def _check_flags(args: argparse.Namespace) -> None:
    if not math.isfinite(args.timeout_s) or args.timeout_s <= 0:
        raise UserError(
            f"{args.timeout_s} is not a positive number of seconds",
            field="--timeout-s",
            fix="give e.g. --timeout-s 5",
        )
    if args.events < 0:
        raise UserError(f"{args.events} is negative", field="--events", fix="give 0 or more")
    if args.address is not None and not args.address.strip():
        raise UserError("the address is empty", field="--address", fix="give http://HOST:PORT")


def fetch_status(address: str, *, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The status document, or None when nothing answers at ``address``."""
    url = status_url(address)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 503):
            return None  # something answers, but it is not a controller with a run
        raise
    except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
        return None
    return body if isinstance(body, dict) and "state" in body else None


def _find_job(timeout_s: float) -> tuple[str, dict[str, Any] | None]:
    """No --address: the default endpoint, else the newest recorded one that answers."""
    from orchestrator.telemetry.endpoints import live_endpoints

    for address in [DEFAULT_ADDRESS, *live_endpoints()]:
        doc = fetch_status(address, timeout_s=timeout_s)
        if doc is not None:
            return address, doc
    return DEFAULT_ADDRESS, None


def run_status(args: argparse.Namespace) -> int:
    _check_flags(args)
    if args.address is None:
        args.address, found = _find_job(args.timeout_s)
        if found is not None:
            return _show(args, found)
    status_url(args.address)  # a malformed address is a mistake (exit 2), not "no job"
    try:
        doc = fetch_status(args.address, timeout_s=args.timeout_s)
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc)
        print(
            f"orchestrator status: the job at {args.address} answered HTTP {exc.code}: {detail}",
            file=sys.stderr,
        )
        return EXIT_NO_JOB
    if doc is None:
        print(
            f"orchestrator status: no job is running at {args.address} "
            "(start one with `orchestrator run JOB.yaml`, or pass --address http://HOST:PORT)",
            file=sys.stderr,
        )
        return EXIT_NO_JOB
    return _show(args, doc)


def _show(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    from rich.console import Console  # imported here: the command's only heavy dependency

    render_status(doc, Console(), max_events=args.events)
    return 0


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """The server's one-line JSON ``error``, else the status reason (never an HTML page)."""
    try:
        body = json.loads(exc.read())
    except (ValueError, OSError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"].splitlines()[0] if body["error"] else str(exc.reason)
    return str(exc.reason)


def _fmt(value: Any, spec: str = ".3g", unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float | int) and not isinstance(value, bool):
        return f"{value:{spec}}{unit}"
    return str(value)


def render_status(doc: dict[str, Any], console: Any, *, max_events: int = 10) -> None:
    """Print the status document as a header line and three tables (plan, nodes, events)."""
    from rich.table import Table

    emulated = " [yellow](device speeds emulated)[/yellow]" if doc.get("emulated") else ""
    console.print(
        f"[bold]run[/bold] {doc.get('run', '-')}  [bold]state[/bold] {doc.get('state') or '-'}  "
        f"[bold]step[/bold] {_fmt(doc.get('step'), 'd')}  "
        f"[bold]loss[/bold] {_fmt(doc.get('loss'), '.4g')}{emulated}"
    )
    measured, predicted = (
        doc.get("throughput_samples_per_s"),
        doc.get("predicted_throughput_samples_per_s"),
    )
    ratio = f" ({measured / predicted:.0%} of predicted)" if measured and predicted else ""
    console.print(
        f"throughput {_fmt(measured, '.4g', ' samples/s')} measured, "
        f"{_fmt(predicted, '.4g', ' samples/s')} predicted{ratio}; step "
        f"{_fmt(doc.get('step_duration_s'), '.3g', ' s')} measured, "
        f"{_fmt(doc.get('predicted_step_s'), '.3g', ' s')} predicted; "
        f"recoveries {doc.get('recoveries', 0)}, lost steps {doc.get('lost_steps', 0)}"
    )
    console.print(_plan_table(doc.get("plan"), doc.get("plan_reason"), Table))
    console.print(_nodes_table(doc.get("nodes") or {}, Table))
    console.print(_events_table(doc.get("events") or [], max_events, Table))


def _plan_table(plan: dict[str, Any] | None, reason: str | None, table_cls: Any) -> Any:
    if not plan:
        table = table_cls(title="plan: none yet")
        table.add_column("")
        return table
    devices = ", ".join(f"{n} x {t}" for t, n in plan.get("devices", {}).items())
    table = table_cls(
        title=f"plan ({reason or '-'}): {plan.get('num_replicas')} replica(s), {devices}; "
        f"global batch {plan.get('global_batch_size')}, microbatch {plan.get('microbatch_size')}"
    )
    for column in ("replica", "batch", "stage", "layers", "device type", "tp", "node"):
        table.add_column(column)
    for replica in plan.get("replicas", []):
        for stage in replica.get("stages", []):
            first = stage.get("stage") == 0
            start, end = stage.get("layers", [None, None])
            table.add_row(
                str(replica.get("replica")) if first else "",
                str(replica.get("batch_size")) if first else "",
                str(stage.get("stage")),
                f"[{start}, {end})",
                str(stage.get("device_type")),
                str(stage.get("tp")),
                stage.get("node") or "-",
            )
    return table


def _nodes_table(nodes: dict[str, Any], table_cls: Any) -> Any:
    alive, draining = nodes.get("alive") or {}, nodes.get("draining") or {}
    table = table_cls(title="devices by type")
    for column in ("device type", "alive", "draining"):
        table.add_column(column)
    for device_type in sorted(set(alive) | set(draining)):
        counts = (alive.get(device_type, 0), draining.get(device_type, 0))
        table.add_row(device_type, *(str(n) for n in counts))
    return table


def _events_table(events: list[dict[str, Any]], max_events: int, table_cls: Any) -> Any:
    shown = events[-max_events:] if max_events > 0 else []
    table = table_cls(title=f"last {len(shown)} of {len(events)} events")
    for column in ("time", "event", "message", "numbers"):
        table.add_column(column)
    for event in shown:
        stamp = event.get("time_s")
        # Wall-clock stamps print as a time of day; run-relative seconds as they are.
        if isinstance(stamp, int | float) and stamp > 1e9:
            when = time.strftime("%H:%M:%S", time.localtime(stamp))
        else:
            when = _fmt(stamp, ".1f", " s")
        numbers = ", ".join(f"{k}={_fmt(v, '.4g')}" for k, v in (event.get("data") or {}).items())
        table.add_row(when, str(event.get("kind")), str(event.get("message")), numbers)
    return table
