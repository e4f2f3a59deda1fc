"""The Prometheus exporter: every metric of the contract, with its type, labels and values."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from telemetry_scenario import a100_only_plan

from orchestrator.control.events import ControllerStateName
from orchestrator.telemetry.metrics import METRIC_NAMES, PrometheusCallback

# Name as exposed -> (type, labels other than the histogram's `le`).
EXPECTED = {
    "orchestrator_devices": ("gauge", {"run", "device_type", "state"}),
    "orchestrator_controller_state": ("gauge", {"run", "state"}),
    "orchestrator_steps_total": ("counter", {"run"}),
    "orchestrator_step_duration_seconds": ("histogram", {"run"}),
    "orchestrator_predicted_step_duration_seconds": ("gauge", {"run"}),
    "orchestrator_throughput_samples_per_second": ("gauge", {"run"}),
    "orchestrator_predicted_throughput_samples_per_second": ("gauge", {"run"}),
    "orchestrator_loss": ("gauge", {"run"}),
    "orchestrator_eval_loss": ("gauge", {"run"}),
    "orchestrator_plan_changes_total": ("counter", {"run", "reason"}),
    "orchestrator_plan_bound_ratio": ("gauge", {"run"}),
    "orchestrator_recoveries_total": ("counter", {"run", "reason"}),
    "orchestrator_recovery_duration_seconds": ("histogram", {"run", "reason"}),
    "orchestrator_lost_steps_total": ("counter", {"run"}),
    "orchestrator_checkpoint_duration_seconds": ("histogram", {"run", "operation"}),
    "orchestrator_stage_busy_ratio": ("gauge", {"run", "replica", "stage", "device_type"}),
    "orchestrator_stage_memory_bytes": (
        "gauge",
        {"run", "replica", "stage", "device_type", "term"},
    ),
    "orchestrator_emulated": ("gauge", {"run"}),
}


def scrape(callback: PrometheusCallback) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Parse the exposition text: sample name -> {sorted label pairs: value}."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    text = generate_latest(callback.registry).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def families(callback: PrometheusCallback) -> dict[str, tuple[str, set[str]]]:
    """Exposed metric name -> (type, label names seen on its samples, without `le`)."""
    found: dict[str, tuple[str, set[str]]] = {}
    text = generate_latest(callback.registry).decode()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created") or family.type == "unknown":
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        found[name] = (family.type, labels)
    return found


def value(samples, name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def test_every_metric_appears_with_its_type_and_labels(scripted_run):
    callback = PrometheusCallback("run-a")
    scripted_run(callback)
    assert families(callback) == EXPECTED
    assert set(METRIC_NAMES) == set(EXPECTED)


def test_values_follow_the_scripted_run(scripted_run):
    callback = PrometheusCallback("run-a")
    scripted_run(callback)
    s = scrape(callback)
    run = {"run": "run-a"}
    # 3 steps before the loss, 2 redone after it.
    assert value(s, "orchestrator_steps_total", **run) == 5
    assert value(s, "orchestrator_step_duration_seconds_count", **run) == 5
    assert value(s, "orchestrator_step_duration_seconds_sum", **run) == 3 * 0.55 + 2 * 0.85
    assert value(s, "orchestrator_predicted_step_duration_seconds", **run) == 0.8
    assert value(s, "orchestrator_plan_bound_ratio", **run) == 0.8 / 0.5
    assert value(s, "orchestrator_predicted_throughput_samples_per_second", **run) == 16 / 0.8
    assert value(s, "orchestrator_throughput_samples_per_second", **run) == 16 / 0.85
    assert value(s, "orchestrator_loss", **run) == 3.0 / 3
    assert value(s, "orchestrator_eval_loss", **run) == 2.5  # the last evaluation's, kept
    assert value(s, "orchestrator_plan_changes_total", **run, reason="initial") == 1
    assert value(s, "orchestrator_plan_changes_total", **run, reason="failure") == 1
    assert value(s, "orchestrator_plan_changes_total", **run, reason="join") == 0
    assert value(s, "orchestrator_recoveries_total", **run, reason="failure") == 1
    assert value(s, "orchestrator_recovery_duration_seconds_sum", **run, reason="failure") == 4.5
    assert value(s, "orchestrator_lost_steps_total", **run) == 2
    for operation, seconds in (("save", 0.2), ("load", 0.3)):
        labels = {**run, "operation": operation}
        assert value(s, "orchestrator_checkpoint_duration_seconds_count", **labels) == 1
        assert value(s, "orchestrator_checkpoint_duration_seconds_sum", **labels) == seconds
    assert value(s, "orchestrator_emulated", **run) == 1


def test_controller_state_is_one_hot(scripted_run):
    callback = PrometheusCallback("run-a")
    scripted_run(callback)
    states = scrape(callback)["orchestrator_controller_state"]
    assert len(states) == len(ControllerStateName)
    on = [dict(labels)["state"] for labels, v in states.items() if v == 1]
    assert on == ["finished"]
    assert sum(states.values()) == 1


def test_a_device_type_that_vanishes_drops_to_zero(scripted_run):
    callback = PrometheusCallback("run-a")
    scripted_run(callback)
    s = scrape(callback)
    assert value(s, "orchestrator_devices", run="run-a", device_type="A100", state="alive") == 3
    assert value(s, "orchestrator_devices", run="run-a", device_type="L4", state="alive") == 0
    callback.on_devices({"A100": 2}, {"A100": 1})
    s = scrape(callback)
    assert value(s, "orchestrator_devices", run="run-a", device_type="A100", state="draining") == 1


def test_stage_busy_ratios_belong_to_the_current_plan(scripted_run):
    callback = PrometheusCallback("run-a")
    scripted_run(callback)
    busy = scrape(callback)["orchestrator_stage_busy_ratio"]
    # After the re-plan only replica 0 / stage 0 on A100 exists; the L4 stage's series ended.
    labels = (("device_type", "A100"), ("replica", "0"), ("run", "run-a"), ("stage", "0"))
    assert set(busy) == {labels}
    assert abs(busy[labels] - 0.6) < 1e-9


def test_stage_memory_by_term_from_the_ranks_that_counted_it(scripted_run):
    callback = PrometheusCallback("run-a")
    scripted_run(callback)
    memory = scrape(callback)["orchestrator_stage_memory_bytes"]
    stage = (("device_type", "A100"), ("replica", "0"), ("run", "run-a"), ("stage", "0"))
    by_term = {dict(k)["term"]: v for k, v in memory.items() if k[:4] == stage}
    assert by_term == {
        "weights": 400,
        "grads": 400,
        "optimizer": 800,
        "weight_copies": 0,
        "activations": 1000,
    }
    assert all(dict(k)["device_type"] == "A100" for k in memory)  # the L4 stage counted none


def test_free_text_reasons_become_low_cardinality_labels():
    callback = PrometheusCallback("run-b")
    callback.on_recovery("lost ranks [2, 3] on nodes ['n1']: actor died (while running)", 1.0, 4)
    callback.on_recovery("node n2 drained after a preemption notice", 2.0, 0)
    callback.on_plan(a100_only_plan(), 0.8, 0.5, "operator request")
    s = scrape(callback)
    assert value(s, "orchestrator_recoveries_total", run="run-b", reason="failure") == 1
    assert value(s, "orchestrator_recoveries_total", run="run-b", reason="preemption") == 1
    assert value(s, "orchestrator_plan_changes_total", run="run-b", reason="other") == 1
    reasons = {dict(k)["reason"] for k in s["orchestrator_recoveries_total"]}
    assert reasons == {
        "initial",
        "failure",
        "join",
        "straggler",
        "speedup",
        "readmit",
        "preemption",
        "restart",
    }


def test_negative_lost_steps_count_as_none():
    callback = PrometheusCallback("run-b")
    callback.on_recovery("failure", 1.0, -3)
    assert value(scrape(callback), "orchestrator_lost_steps_total", run="run-b") == 0


def test_two_runs_in_one_process_do_not_collide(scripted_run):
    first, second = PrometheusCallback("one"), PrometheusCallback("two")
    scripted_run(first)
    assert value(scrape(first), "orchestrator_steps_total", run="one") == 5
    assert value(scrape(second), "orchestrator_steps_total", run="two") == 0
