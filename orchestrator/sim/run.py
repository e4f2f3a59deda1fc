"""One simulated run: the real controller on the simulated world, until a horizon of seconds.

:func:`simulate` wires :class:`~orchestrator.control.controller.Controller` to the simulated
ports and steps it until the simulated clock passes the trace's horizon. Goodput is the committed
samples of a run with failures over those of the same run without (:func:`goodput`).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.control.config import ControllerConfig
from orchestrator.control.controller import Controller
from orchestrator.control.events import EventKind
from orchestrator.control.ports import Planner, PlanProposal
from orchestrator.policies.failure import FailurePolicy
from orchestrator.sim.costs import CostModel, StateMove
from orchestrator.sim.planner import PlanCache, TimedPlanner
from orchestrator.sim.trace import FailureTrace
from orchestrator.sim.world import (
    SimClock,
    SimCluster,
    SimHolderStore,
    SimHolderWorkers,
    SimStore,
    SimWorkers,
)
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo

# A run at scale survives any number of interruptions; the backoff is the policy's default.
UNLIMITED_FAILURES = 10**9


@dataclass(frozen=True)
class Scenario:
    """What one simulated run needs besides the planner."""

    nodes: tuple[NodeInfo, ...]
    trace: FailureTrace
    costs: CostModel
    replace_after_s: float = 900.0
    checkpoint_interval_steps: int = 250
    failure: FailurePolicy = field(
        default_factory=lambda: FailurePolicy(max_failures=UNLIMITED_FAILURES)
    )


@dataclass
class Outcome:
    """What a simulated run did by the horizon."""

    committed_steps: int
    samples: int
    sim_s: float
    interruptions: int  # interruptions in the trace up to the horizon (any node)
    failures: int  # those the controller saw (a node that hosted workers)
    lost_steps: int
    recovery_s: list[float]  # failure -> first committed step, per recovery
    switches: int  # plan changes at a step boundary (joins of the replacements)
    planner_fresh_s: list[float]  # wall seconds of real planner calls
    planner_charged_s: list[float]  # what every re-plan cost the run (a repeat: its first call)
    planner_calls: int
    moved_bytes: list[float]  # per launch
    launch_s: list[float]
    checkpoint_launch_s: list[float]  # the launches that restored a checkpoint
    checkpoint_write_s: float
    fetch_s: float
    wall_s: float = 0.0  # host seconds the simulation took

    @property
    def median_recovery_s(self) -> float:
        return statistics.median(self.recovery_s) if self.recovery_s else 0.0


def simulate(
    scenario: Scenario,
    planner: Planner,
    *,
    poll_interval_s: float = 1.0,
    logger: logging.Logger | None = None,
    plan_cache: PlanCache | None = None,
) -> Outcome:
    """Step a real controller on the simulated world until the trace's horizon.

    ``plan_cache`` shares the timed planner's plans between runs on the same nodes and planner.
    """
    import time

    started = time.perf_counter()
    clock = SimClock()
    cluster, workers, store = _world(scenario, clock)
    timed = TimedPlanner(planner, clock.advance)
    if plan_cache is not None:
        timed.cache = plan_cache

    def plan(snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]) -> PlanProposal:
        proposal = timed(snapshot, slowdown_by_node)
        workers.expect(proposal)
        return proposal

    if logger is None:
        logger = logging.getLogger("orchestrator.sim")
        logger.disabled = True
    controller = Controller(
        config=ControllerConfig(
            total_steps=UNLIMITED_FAILURES,
            checkpoint_interval_steps=scenario.checkpoint_interval_steps,
            poll_interval_s=poll_interval_s,
            failure=scenario.failure,
        ),
        probe=cluster,
        workers=workers,
        checkpoints=store,
        planner=plan,
        clock=clock,
        logger=logger,
    )
    # As a run on the runtime: a state that waits (a recovery's backoff) is slept through on the
    # simulated clock, at most a poll interval at a time.
    controller.run(until=lambda: clock.now_s() >= scenario.trace.horizon_s)
    if controller.done:
        raise RuntimeError(f"simulated run stopped early: {controller.state}")
    outcome = _outcome(controller, clock, cluster, workers, store, timed, scenario.trace.horizon_s)
    outcome.wall_s = time.perf_counter() - started
    return outcome


def _world(scenario: Scenario, clock: SimClock) -> tuple[SimCluster, SimWorkers, SimStore]:
    """The simulated cluster, workers and checkpoint store for the scenario's state move: its
    own step because the two moves pair different worker and store kinds."""
    cluster = SimCluster(
        clock,
        list(scenario.nodes),
        scenario.trace,
        detect_s=scenario.costs.detect_s,
        replace_after_s=scenario.replace_after_s,
    )
    workers: SimWorkers
    store: SimStore
    if scenario.costs.move is StateMove.KEEP_SURVIVORS:  # as the runtime runs now
        holders = SimHolderWorkers(clock, cluster, scenario.costs)
        store = holders.store = SimHolderStore(clock, scenario.costs)
        workers = holders
    else:
        workers = SimWorkers(clock, cluster, scenario.costs)
        store = SimStore(clock, scenario.costs)
    return cluster, workers, store


def _outcome(
    controller: Controller,
    clock: SimClock,
    cluster: SimCluster,
    workers: SimWorkers,
    store: SimStore,
    timed: TimedPlanner,
    horizon_s: float,
) -> Outcome:
    """What the run did, read from the controller's events and the simulated parts' totals
    (apart from the loop: it reads the run's record and changes nothing)."""
    recoveries = [
        float(seconds)
        for e in controller.events
        if e.kind is EventKind.RECOVERY
        and isinstance(seconds := e.data.get("recovery_s"), int | float)
    ]
    switches = sum(
        1 for e in controller.events if e.kind is EventKind.REPLAN and "trigger" in e.data
    )
    batch = workers.last_plan.global_batch_size if workers.last_plan else 0
    return Outcome(
        committed_steps=controller.next_step,
        samples=controller.next_step * batch,
        sim_s=clock.now_s(),
        interruptions=sum(1 for t, _ in cluster.interruptions if t <= horizon_s),
        failures=controller.failure_count,
        lost_steps=controller.lost_steps_total,
        recovery_s=recoveries,
        switches=switches,
        planner_fresh_s=timed.fresh_wall_s,
        planner_charged_s=[wall_s for _, wall_s, _ in timed.calls],
        planner_calls=len(timed.calls),
        moved_bytes=list(workers.moved_bytes),
        launch_s=list(workers.launch_s),
        checkpoint_launch_s=list(workers.checkpoint_launch_s),
        checkpoint_write_s=store.write_s_total,
        fetch_s=workers.fetch_s_total,
    )


def goodput(run: Outcome, reference: Outcome) -> float:
    """Committed samples per simulated second, over the same for the run without failures."""
    return (run.samples / run.sim_s) / (reference.samples / reference.sim_s)
