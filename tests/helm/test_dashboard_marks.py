"""The dashboard's plan-change and recovery annotations, evaluated by promtool on given series.

An annotation marks the step at which its counter went up: once, not as a band over a window,
and not when the counter resets (a restarted controller). The recovery and checkpoint panels
read rates over a window, not totals since the start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_support import CHART

DASHBOARD = CHART / "files" / "grafana-dashboard.json"
SERIES = '{run="r", reason="join"}'
# 15 s apart: appears at 1 (0 s), goes up at 30 s, resets to 0 at 75 s, up again at 105 s.
VALUES = "1 1 2 2 2 0 0 1"
MARKED_AT_S = {0, 30, 105}


def annotation(name: str) -> str:
    doc = json.loads(DASHBOARD.read_text())
    (found,) = [a for a in doc["annotations"]["list"] if a.get("name") == name]
    assert found["step"] == "15s"  # the expression's offset is one step
    return found["expr"].replace("$run", "r")


@pytest.mark.parametrize(("name", "metric"), [
    ("Plan changes", "orchestrator_plan_changes_total"),
    ("Recoveries", "orchestrator_recoveries_total"),
])
def test_annotation_marks_each_increase_once_and_never_a_reset(name, metric, tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: scripts/install_tools.sh installs Prometheus")
    expr = annotation(name)
    cases = []
    for t in range(0, 8 * 15, 15):
        samples = [{"labels": SERIES, "value": 1}] if t in MARKED_AT_S else []
        cases.append({"expr": expr, "eval_time": f"{t}s", "exp_samples": samples})
    test = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": metric + SERIES, "values": VALUES}],
        "promql_expr_test": cases,
    }]}
    path = tmp_path / "marks.test.yaml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_recovery_and_checkpoint_panels_use_windows() -> None:
    doc = json.loads(DASHBOARD.read_text())
    section = False
    checked = 0
    for panel in doc["panels"]:
        if panel["type"] == "row":
            section = panel["title"].startswith("Failures, recoveries and checkpoints")
            continue
        if section:
            for target in panel["targets"]:
                expr = target["expr"]
                windowed = "rate(" in expr or "increase(" in expr or "offset 10m" in expr
                assert windowed, (panel["title"], expr)
                checked += 1
    assert checked >= 6


def test_window_counts_a_first_recovery(tmp_path: Path) -> None:
    """The series of a run's first recovery appears with the recovery; the panel still shows it,
    and ten minutes later it is out of the window."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: scripts/install_tools.sh installs Prometheus")
    doc = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in doc["panels"] if p["title"].startswith("Lost steps and recoveries")]
    expr = panel["targets"][1]["expr"].replace("$run", "r")
    # Absent for 2 minutes, then 1 recovery (the series appears), 2 more minutes.
    values = "_x8 1x8"
    cases = [{"expr": expr, "eval_time": "150s", "exp_samples": [{"labels": '{run="r"}',
                                                                  "value": 1}]},
             {"expr": expr, "eval_time": "60s", "exp_samples": []}]
    test = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": 'orchestrator_recoveries_total{run="r", reason="failure"}',
                          "values": values}],
        "promql_expr_test": cases,
    }]}
    path = tmp_path / "window.test.yaml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
