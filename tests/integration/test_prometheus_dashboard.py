"""The Grafana dashboard and the alert rules, proven against a real Prometheus.

Real: Debian's ``prometheus`` server (started here on loopback, 1 s scrapes, a temporary TSDB)
and ``promtool``; the controller's telemetry exporter and server; and the training run they
watch (``ray_run.py``): the elastic controller with its Ray ports on a local multi-node Ray
cluster (``ray.cluster_utils.Cluster``), Ray actor worker groups training the example GPT with
torch.distributed (gloo), checkpoints on disk, and one node SIGKILLed mid-run. Device speeds are
emulated (CPU nodes labelled ``A100-40`` and ``V100-16``); nothing else is.

Every PromQL expression of the dashboard (panels and annotations) must return a finite value
over the run, and so must the series each alert rule compares; a panel that shows nothing fails.
The test fails, never skips, when prometheus or promtool is missing.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_server import PrometheusServer, finite_values, require_binary
from ray_run import run_elastic_on_ray

from orchestrator.cli.main import main
from orchestrator.telemetry import METRIC_NAMES, Telemetry

# The training run the dashboard watches.
TRAINING_RUN = run_elastic_on_ray

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "helm/orchestrator/files/grafana-dashboard.json"
ALERT_RULES = REPO / "helm/orchestrator/files/alert-rules.yaml"
RULE_TESTS = Path(__file__).with_name("alert-rules.test.yaml")
RUN = "it-ray"
# Grafana's $__rate_interval with 1 s scrapes and a 1 s step: max(4 x scrape, step + scrape).
RATE_INTERVAL = "4s"
# An alert expression is `<series> <op> <number>` (a convention of alert-rules.yaml).
ALERT_SPLIT = re.compile(
    r"^(?P<series>.+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<threshold>[-+0-9.eE]+)$", re.S
)


def grafana_expr(expr: str) -> str:
    """The query Grafana would send for this run."""
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$run", RUN)


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, expr) of every panel target and annotation of the dashboard."""
    doc = json.loads(DASHBOARD.read_text())
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))

    walk(doc["panels"])
    for annotation in doc["annotations"]["list"]:
        if "expr" in annotation:
            found.append((f"annotation {annotation['name']!r}", annotation["expr"]))
    return found


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERT_RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def split_alert(expr: str) -> tuple[str, str, str]:
    match = ALERT_SPLIT.match(expr.strip())
    assert match, f"alert expression does not end in `<op> <number>`: {expr}"
    return match["series"], match["op"], match["threshold"]


class StatusPoller(threading.Thread):
    """Reads /v1/status every 0.2 s during the run: the server answers through re-plans."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.states, self.errors = url, [], []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                with urllib.request.urlopen(self.url + "/v1/status", timeout=5) as r:
                    self.states.append(json.loads(r.read())["state"])
            except OSError as exc:
                self.errors.append(str(exc))
            self.stopped.wait(0.2)


@pytest.fixture(scope="module")
def observed_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("observed-run")
    require_binary("promtool")
    with Telemetry(RUN, host="127.0.0.1", port=0, log_decisions=False) as telemetry:
        prometheus = PrometheusServer(workdir, [f"127.0.0.1:{telemetry.server.port}"]).start()
        try:
            # Start training only after the first scrape, so counters are seen rising from 0.
            prometheus.wait_for(f'orchestrator_steps_total{{run="{RUN}"}}')
            poller = StatusPoller(telemetry.url)
            poller.start()
            start_s = time.time()
            summary = TRAINING_RUN(telemetry.callbacks, workdir)
            time.sleep(4)  # a few more scrapes of the final values
            end_s = time.time()
            poller.stopped.set()
            poller.join(timeout=10)
            yield {
                "prometheus": prometheus,
                "telemetry": telemetry,
                "summary": summary,
                "start_s": start_s,
                "end_s": end_s,
                "poller": poller,
            }
        finally:
            prometheus.stop()


def test_the_run_failed_recovered_and_finished(observed_run):
    summary = observed_run["summary"]
    assert summary.state == "finished"
    assert summary.steps == 24
    assert summary.failures >= 1  # the crashed node
    assert summary.lost_steps <= 5  # at most one checkpoint interval


def test_every_dashboard_expression_returns_data(observed_run):
    prometheus, start_s, end_s = (observed_run[k] for k in ("prometheus", "start_s", "end_s"))
    queries = dashboard_queries()
    assert len(queries) >= 15
    empty = [
        f"{where}: {expr}"
        for where, expr in queries
        if not finite_values(prometheus.query_range(grafana_expr(expr), start_s, end_s))
    ]
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


def test_annotations_mark_the_recovery_and_the_replan(observed_run):
    prometheus, start_s, end_s = (observed_run[k] for k in ("prometheus", "start_s", "end_s"))
    reasons: dict[str, set[str]] = {}
    for where, expr in dashboard_queries():
        if where.startswith("annotation"):
            result = prometheus.query_range(grafana_expr(expr), start_s, end_s, step_s=1)
            reasons[where] = {series["metric"]["reason"] for series in result}
    # The crash is there; a real run on two busy cores may also re-plan for a straggler.
    assert {"initial", "failure"} <= reasons["annotation 'Plan changes'"]
    assert reasons["annotation 'Plan changes'"] <= {
        "initial",
        "failure",
        "straggler",
        "speedup",
        "readmit",
        "join",
    }
    assert reasons["annotation 'Recoveries'"] == {"failure"}


def test_queries_use_only_exported_metric_names():
    exprs = [expr for _, expr in dashboard_queries()]
    exprs += [rule["expr"] for rule in alert_rules()]
    used = set()
    for expr in exprs:
        for name in re.findall(r"\borchestrator_[a-z_]+", expr):
            used.add(re.sub(r"_(bucket|sum|count)$", "", name))
    assert used <= set(METRIC_NAMES), sorted(used - set(METRIC_NAMES))
    # Every exported metric is on the dashboard.
    dashboard_text = DASHBOARD.read_text()
    assert [n for n in METRIC_NAMES if n not in dashboard_text] == []


def test_run_variable_lists_the_run(observed_run):
    doc = json.loads(DASHBOARD.read_text())
    variable = next(v for v in doc["templating"]["list"] if v["name"] == "run")
    match = re.fullmatch(r"label_values\((\w+), run\)", variable["definition"])
    assert match
    assert RUN in observed_run["prometheus"].label_values("run", match[1])


def test_alert_rules_pass_promtool():
    promtool = require_binary("promtool")
    check = subprocess.run(
        [promtool, "check", "rules", str(ALERT_RULES)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in check.stdout
    unit = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULE_TESTS.parent,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_alert_series_return_data_and_stay_quiet_on_one_recovery(observed_run):
    prometheus, start_s, end_s = (observed_run[k] for k in ("prometheus", "start_s", "end_s"))
    # The run stepped steadily and recovered once: neither stalled nor looping. Rules with a
    # window longer than the run still return data (increase() over the samples there are).
    # Judged from the first committed step on: before it the run is still being planned and
    # launched, which the stalled rule's `for:` window (minutes) covers in production.
    stepped = prometheus.query_range(f'orchestrator_steps_total{{run="{RUN}"}} > 0', start_s, end_s)
    start_s = min(float(t) for series in stepped for t, _ in series["values"])
    quiet = {"OrchestratorJobStalled", "OrchestratorRecoveryLoop"}
    assert quiet <= {rule["alert"] for rule in alert_rules()}
    problems = []
    for rule in alert_rules():
        series, op, threshold = split_alert(rule["expr"])
        if not finite_values(prometheus.query_range(series, start_s, end_s)):
            problems.append(f"{rule['alert']}: no data for {series}")
            continue
        verdicts = finite_values(
            prometheus.query_range(f"({series}) {op} bool {threshold}", start_s, end_s)
        )
        if not verdicts:
            problems.append(f"{rule['alert']}: no data for the comparison")
        elif rule["alert"] in quiet and max(verdicts) != 0:
            problems.append(f"{rule['alert']}: would fire during a healthy run")
    assert not problems, "\n".join(problems)


def test_metrics_and_status_were_served_through_the_replan_and_recovery(observed_run):
    prometheus, start_s, end_s = (observed_run[k] for k in ("prometheus", "start_s", "end_s"))
    up = finite_values(prometheus.query_range('up{job="orchestrator"}', start_s, end_s))
    assert up and min(up) == 1  # every scrape during the run succeeded
    changes = prometheus.query(f'sum(orchestrator_plan_changes_total{{run="{RUN}"}})', end_s)
    # The initial plan and the one after the failure (plus any straggler re-plan on busy cores).
    assert finite_values(changes) and finite_values(changes)[0] >= 2.0
    poller = observed_run["poller"]
    assert poller.errors == []
    assert "running" in poller.states and poller.states[-1] == "finished"


def test_status_command_shows_the_recovery(observed_run, capsys):
    url = observed_run["telemetry"].url
    assert main(["status", "--address", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "finished" and doc["step"] == observed_run["summary"].steps - 1
    # One V100 node crashed: the final plan runs on at most the three devices left.
    assert 1 <= sum(doc["plan"]["devices"].values()) <= 3
    kinds = [event["kind"] for event in doc["events"]]
    assert "failure" in kinds and "recovery" in kinds
    assert doc["lost_steps"] == observed_run["summary"].lost_steps
    assert doc["emulated"] is True
