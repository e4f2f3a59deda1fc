"""The demo's first plan beside uniform data parallel, both costed by the same cost model.

Uniform data parallel is how Ray Train (and torchrun) run a job: every worker holds the whole
model and takes the same share of the batch, so the slowest device sets the step. The demo prints
what that would take per step on the nodes it starts, next to the plan the controller chose, with
the same profiles and the same cost model (:func:`orchestrator.planner.make_plan` costs it as one
of its baselines). It is predicted, not measured: running it too would need its own worker group
and steps, and two CPU cores already run every emulated device of the demo.

Pure (no Ray, no torch): the test of the demo's planning inputs runs it on stored profiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.control.events import PlanReason
from orchestrator.demo.scenario import DemoScenario, demo_job
from orchestrator.planner import make_plan
from orchestrator.spec.cluster import Cluster, Node
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.job import JobSpec
from orchestrator.spec.plan import Plan
from orchestrator.spec.profiles import ProfileSet


@dataclass(frozen=True)
class FirstPlan:
    """The planner's plan for the demo's starting nodes and the uniform data-parallel baseline."""

    plan: Plan
    step_s: float
    uniform_plan: Plan | None
    uniform_step_s: float | None
    uniform_note: str  # why there is no uniform figure, when there is none

    def uniform_text(self, planner_step_s: float | None = None) -> str:
        """One line: uniform data parallel's predicted step, and how it compares with the plan's
        (``planner_step_s``: the step the controller predicted for the plan it put in effect)."""
        if self.uniform_plan is None or self.uniform_step_s is None:
            return f"uniform data parallel (as Ray Train runs): not possible ({self.uniform_note})"
        shares = sorted({r.batch_size for r in self.uniform_plan.replicas})
        share = "/".join(str(s) for s in shares)
        step_s = planner_step_s if planner_step_s is not None else self.step_s
        ratio = self.uniform_step_s / step_s if step_s > 0 else float("inf")
        return (
            f"uniform data parallel (as Ray Train runs: {len(self.uniform_plan.replicas)} workers, "
            f"batch {share} each) on the same nodes: predicted step {self.uniform_step_s:.4f} s "
            f"(emulated, same cost model), {ratio:.2f}x this plan's {step_s:.4f} s"
        )

    def to_json(self, planner_step_s: float | None = None) -> dict[str, object]:
        step_s = planner_step_s if planner_step_s is not None else self.step_s
        return {
            "uniform_batch_per_worker": (
                [r.batch_size for r in self.uniform_plan.replicas] if self.uniform_plan else None
            ),
            "uniform_predicted_step_s": self.uniform_step_s,
            "plan_predicted_step_s": step_s,
            "uniform_over_plan": (
                self.uniform_step_s / step_s if self.uniform_step_s and step_s > 0 else None
            ),
            "note": self.uniform_note,
        }


def start_cluster(scenario: DemoScenario, catalog: DeviceCatalog | None = None) -> Cluster:
    """The planner's view of the demo's starting nodes: one node per entry, the catalog's
    bandwidths and the default network, as the controller sees discovered nodes."""
    catalog = catalog or DeviceCatalog.builtin()
    return Cluster(
        nodes=tuple(
            Node.from_device(f"node-{i}", catalog[kind.device_type], kind.num_devices)
            for i, kind in enumerate(scenario.start)
        )
    )


def demo_job_spec(scenario: DemoScenario) -> JobSpec:
    """The demo's job, validated."""
    return JobSpec.model_validate(demo_job(scenario))


def first_plan(scenario: DemoScenario, profiles: ProfileSet | None) -> FirstPlan:
    """Plan the demo's starting cluster as the controller does and cost uniform data parallel
    beside it."""
    job = demo_job_spec(scenario)
    training = job.training.planner_spec()
    result = make_plan(start_cluster(scenario), job.model.shape, training, profiles)
    uniform = result.baselines["uniform_data_parallel"]
    return FirstPlan(
        plan=result.plan,
        step_s=result.estimate.step_time_s,
        uniform_plan=uniform.plan,
        uniform_step_s=uniform.estimate.step_time_s if uniform.estimate else None,
        uniform_note=uniform.reason,
    )


class UniformLine:
    """Prints the uniform data-parallel line once, right after the run's initial plan.

    The run's progress lines of a plan precede its ``PlanApplied`` update, so the lines read
    after the update is seen include them: the line is taken after those."""

    def __init__(self, first: FirstPlan | None) -> None:
        self.first = first
        self.planner_step_s: float | None = None
        self._pending: str | None = None
        self._done = False

    def on_plan(self, reason: PlanReason, predicted_step_s: float) -> None:
        """A plan was put into effect; the first one (``initial``) gets the line."""
        if self._done or self.first is None or reason is not PlanReason.INITIAL:
            return
        self._done = True
        self.planner_step_s = predicted_step_s
        self._pending = "  " + self.first.uniform_text(predicted_step_s)

    def take(self) -> str | None:
        """The line, once, once the initial plan was seen (call it after printing the lines
        read after the plan's update)."""
        line, self._pending = self._pending, None
        return line

    def to_json(self) -> dict[str, object] | None:
        return None if self.first is None else self.first.to_json(self.planner_step_s)
