"""Prometheus metrics of one run, fed by the controller's callbacks.

:class:`PrometheusCallback` owns a private :class:`~prometheus_client.CollectorRegistry` (so two
runs in one process, or a test, never collide with the global default registry) and turns every
controller hook into metric updates. The names below are a contract: the Grafana dashboard and the
alert rules in ``helm/orchestrator/files/`` query them, and a test runs those queries against a
real Prometheus.

Labels stay low-cardinality: ``run``, ``device_type``, ``state``, ``reason``, ``operation``,
``replica`` and ``stage``. Known label values (controller states, plan-change reasons) are created
at zero up front, so that ``increase()`` and ``changes()`` see the first event too (a counter
series that appears already at 1 shows no increase in PromQL).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.events import ControllerStateName
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import MemoryUse, StepReport

# Reasons the controller gives for a plan change (see ControllerCallback.on_plan); recoveries use
# the same vocabulary. Unknown reasons still work: their series appear on first use.
KNOWN_REASONS = (
    "initial",
    "failure",
    "join",
    "straggler",
    "speedup",
    "readmit",
    "preemption",
    "restart",
)
DEVICE_STATES = ("alive", "draining")
CHECKPOINT_OPERATIONS = ("save", "load")

# Step times range from milliseconds (emulated CPU runs) to minutes (large models).
STEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Recoveries: a killed actor is seen within milliseconds, a lost node after seconds, and a full
# restart from a checkpoint takes tens of seconds to minutes.
RECOVERY_BUCKETS_S = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
CHECKPOINT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# Every metric name the exporter defines; dashboards and alert rules may use only these.
METRIC_NAMES = (
    "orchestrator_devices",
    "orchestrator_controller_state",
    "orchestrator_steps_total",
    "orchestrator_step_duration_seconds",
    "orchestrator_predicted_step_duration_seconds",
    "orchestrator_throughput_samples_per_second",
    "orchestrator_predicted_throughput_samples_per_second",
    "orchestrator_loss",
    "orchestrator_eval_loss",
    "orchestrator_plan_changes_total",
    "orchestrator_plan_bound_ratio",
    "orchestrator_recoveries_total",
    "orchestrator_recovery_duration_seconds",
    "orchestrator_lost_steps_total",
    "orchestrator_checkpoint_duration_seconds",
    "orchestrator_stage_busy_ratio",
    "orchestrator_stage_memory_bytes",
    "orchestrator_emulated",
)


def reason_label(reason: str, *, default: str) -> str:
    """A low-cardinality ``reason`` label for a free-text reason.

    Known reasons pass through; a sentence (the controller passes a recovery's cause, e.g.
    "lost ranks [2, 3] on nodes ['n1'] (while running)") maps to the known reason it mentions,
    else to ``default``. Free text as a label would create a new series per failure.
    """
    text = reason.strip().lower()
    if text in KNOWN_REASONS:
        return text
    for needle, label in (
        ("preempt", "preemption"),
        ("drain", "preemption"),
        ("straggler", "straggler"),
        ("join", "join"),
        ("restart", "restart"),
    ):
        if needle in text:
            return label
    return default


class PrometheusCallback(ControllerCallback):
    """One run's state as Prometheus metrics; serve ``registry`` with the telemetry server."""

    def __init__(self, run: str, registry: CollectorRegistry | None = None) -> None:
        self.run = run
        self.registry = registry if registry is not None else CollectorRegistry()
        self._device_types_seen: set[str] = set()
        self._define_metrics()
        self._initialise_known_series()

    # -- definitions -------------------------------------------------------------------------

    def _define_metrics(self) -> None:
        r = self.registry
        self.devices = Gauge(
            "orchestrator_devices",
            "Devices in the cluster by type and state (alive, draining).",
            ["run", "device_type", "state"],
            registry=r,
        )
        self.controller_state = Gauge(
            "orchestrator_controller_state",
            "1 for the controller's current state, 0 for others.",
            ["run", "state"],
            registry=r,
        )
        # prometheus_client appends "_total" to a counter's name.
        self.steps = Counter(
            "orchestrator_steps",
            "Training steps committed.",
            ["run"],
            registry=r,
        )
        self.step_duration = Histogram(
            "orchestrator_step_duration_seconds",
            "Measured wall time of a training step.",
            ["run"],
            buckets=STEP_BUCKETS_S,
            registry=r,
        )
        self.predicted_step = Gauge(
            "orchestrator_predicted_step_duration_seconds",
            "Step time the cost model predicts for the current plan.",
            ["run"],
            registry=r,
        )
        self.throughput = Gauge(
            "orchestrator_throughput_samples_per_second",
            "Samples per second of the last committed step.",
            ["run"],
            registry=r,
        )
        self.predicted_throughput = Gauge(
            "orchestrator_predicted_throughput_samples_per_second",
            "Samples per second the cost model predicts for the current plan.",
            ["run"],
            registry=r,
        )
        self.loss = Gauge(
            "orchestrator_loss", "Loss of the last committed step.", ["run"], registry=r
        )
        self.eval_loss = Gauge(
            "orchestrator_eval_loss",
            "Validation loss of the last evaluation (training.eval_every).",
            ["run"],
            registry=r,
        )
        self.plan_changes = Counter(
            "orchestrator_plan_changes",
            "Plans put into effect, by reason.",
            ["run", "reason"],
            registry=r,
        )
        self.plan_bound_ratio = Gauge(
            "orchestrator_plan_bound_ratio",
            "Predicted step time over the physical (fluid) lower bound; 1 is ideal.",
            ["run"],
            registry=r,
        )
        self.recoveries = Counter(
            "orchestrator_recoveries",
            "Failures recovered from, by reason.",
            ["run", "reason"],
            registry=r,
        )
        self.recovery_duration = Histogram(
            "orchestrator_recovery_duration_seconds",
            "From a failure seen to the first step completed after it.",
            ["run", "reason"],
            buckets=RECOVERY_BUCKETS_S,
            registry=r,
        )
        self.lost_steps = Counter(
            "orchestrator_lost_steps",
            "Steps redone after recoveries (work lost since the last checkpoint).",
            ["run"],
            registry=r,
        )
        self.checkpoint_duration = Histogram(
            "orchestrator_checkpoint_duration_seconds",
            "Checkpoint save and load times.",
            ["run", "operation"],
            buckets=CHECKPOINT_BUCKETS_S,
            registry=r,
        )
        self.stage_busy = Gauge(
            "orchestrator_stage_busy_ratio",
            "Compute time of a pipeline stage over the step time (1 = never waits).",
            ["run", "replica", "stage", "device_type"],
            registry=r,
        )
        self.stage_memory = Gauge(
            "orchestrator_stage_memory_bytes",
            "Bytes a pipeline stage's rank counted last step, by term (weights, grads, optimizer,"
            " weight_copies, activations; device_peak on CUDA).",
            ["run", "replica", "stage", "device_type", "term"],
            registry=r,
        )
        self.emulated = Gauge(
            "orchestrator_emulated",
            "1 when device speeds are emulated (no real accelerators).",
            ["run"],
            registry=r,
        )

    def _initialise_known_series(self) -> None:
        run = self.run
        for state in ControllerStateName:
            self.controller_state.labels(run, state.value).set(0)
        self.steps.labels(run)
        self.step_duration.labels(run)
        self.lost_steps.labels(run)
        self.emulated.labels(run).set(0)
        for reason in KNOWN_REASONS:
            self.plan_changes.labels(run, reason)
            self.recoveries.labels(run, reason)
        for operation in CHECKPOINT_OPERATIONS:
            self.checkpoint_duration.labels(run, operation)

    # -- controller hooks --------------------------------------------------------------------

    def on_state(self, state: ControllerStateName) -> None:
        for candidate in ControllerStateName:
            self.controller_state.labels(self.run, candidate.value).set(
                1 if candidate == state else 0
            )

    def on_devices(self, alive_by_type: dict[str, int], draining_by_type: dict[str, int]) -> None:
        # A device type that vanished drops to 0 rather than disappearing, so graphs show the drop.
        self._device_types_seen.update(alive_by_type, draining_by_type)
        for device_type in sorted(self._device_types_seen):
            alive = alive_by_type.get(device_type, 0)
            draining = draining_by_type.get(device_type, 0)
            self.devices.labels(self.run, device_type, "alive").set(alive)
            self.devices.labels(self.run, device_type, "draining").set(draining)

    def on_plan(
        self, plan: Plan, predicted_step_s: float, bound_step_s: float, reason: str
    ) -> None:
        self.plan_changes.labels(self.run, reason_label(reason, default="other")).inc()
        self.predicted_step.labels(self.run).set(predicted_step_s)
        if predicted_step_s > 0:
            self.predicted_throughput.labels(self.run).set(
                plan.global_batch_size / predicted_step_s
            )
        if bound_step_s > 0:
            self.plan_bound_ratio.labels(self.run).set(predicted_step_s / bound_step_s)
        # The old plan's stages are gone; their series end here (Prometheus marks them stale).
        self.stage_busy.clear()
        self.stage_memory.clear()

    def on_step(self, report: StepReport, predicted_step_s: float) -> None:
        run = self.run
        self.steps.labels(run).inc()
        self.step_duration.labels(run).observe(report.step_duration_s)
        self.predicted_step.labels(run).set(predicted_step_s)
        self.throughput.labels(run).set(report.throughput_samples_per_s)
        self.loss.labels(run).set(report.loss)
        if report.eval_loss is not None:
            self.eval_loss.labels(run).set(report.eval_loss)
        for timing in report.stage_timings:
            if timing.step_s <= 0:
                continue
            ratio = min(max(timing.compute_s / timing.step_s, 0.0), 1.0)
            self.stage_busy.labels(
                run, str(timing.replica), str(timing.stage), timing.device_type
            ).set(ratio)
            if timing.memory is not None:
                for term, nbytes in _memory_terms(timing.memory):
                    self.stage_memory.labels(
                        run, str(timing.replica), str(timing.stage), timing.device_type, term
                    ).set(nbytes)

    def on_recovery(self, reason: str, duration_s: float, lost_steps: int) -> None:
        label = reason_label(reason, default="failure")
        self.recoveries.labels(self.run, label).inc()
        self.recovery_duration.labels(self.run, label).observe(duration_s)
        self.lost_steps.labels(self.run).inc(max(lost_steps, 0))

    def on_checkpoint(self, operation: str, duration_s: float) -> None:
        self.checkpoint_duration.labels(self.run, operation).observe(duration_s)

    def on_emulated(self, emulated: bool) -> None:
        self.emulated.labels(self.run).set(1 if emulated else 0)


def _memory_terms(memory: MemoryUse) -> list[tuple[str, float]]:
    terms = [
        ("weights", memory.weights_bytes),
        ("grads", memory.grads_bytes),
        ("optimizer", memory.optimizer_bytes),
        ("weight_copies", memory.cast_weight_bytes),
        ("activations", memory.activations_peak_bytes),
    ]
    if memory.device_peak_bytes is not None:
        terms.append(("device_peak", memory.device_peak_bytes))
    return [(term, float(nbytes)) for term, nbytes in terms]
