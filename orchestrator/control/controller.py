"""The elastic controller: one explicit state machine, stepped one transition at a time.

::

                 +-------------+  enough usable devices   +----------+
     start ----> | DISCOVERING | -----------------------> | PLANNING |<-------------------+
                 +-------------+ <----------------------- +----------+                    |
                     |  ^          no plan fits (wait)         | plan chosen              |
       timeout       |  |                                      v                          |
       (too few      |  |                              +-----------+   workers lost     |
        devices)     |  |                              | LAUNCHING | -------------+     |
                     v  |                              +-----------+              |     |
                 +--------+    budget spent            | launched                 v     |
                 | FAILED | <------------------+       v                  +------------+|
                 +--------+                    |  +---------+  lost       | RECOVERING |+
                     ^                         +--| RUNNING | ----------> +------------+
                     |  step raised a bug         +---------+    ^   read survivors or checkpoint,
                     +--------------------------- |  |  ^  |     |   wait the backoff, re-plan
                                                  |  |  |  |     |
                     join / straggler: switch     |  |  |  | all steps done
                     pays; preemption notice      v  |  |  v
                                           +----------+ |  +----------+
                                           | RESIZING |-+  | FINISHED |
                                           +----------+    +----------+
                      read every layer, stop, launch the new plan (no lost steps); a worker
                      lost while resizing goes to RECOVERING

:meth:`Controller.step` does one transition or one training step: it hands the current state to
its handler (``control/starting.py``, ``control/running.py``), which returns the next state, and
is the only place that enters a state and tells the callbacks. :meth:`Controller.run` loops until
FINISHED or FAILED, sleeping only between steps while a state waits (:func:`proceed_at_s`). The
handlers reach the world only through the ports in ``control/ports.py``, held with the config,
the journal and the run's ledger in a :class:`~orchestrator.control.context.RunContext`; every
decision goes to the run's event list, the structured log and the callbacks (see
``control/journal.py``). Steps are counted from 0: after ``next_step`` committed steps, the next
step to run is ``next_step``; a checkpoint "at step c" holds the state after c steps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from orchestrator.control import running, starting
from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.config import ControllerConfig
from orchestrator.control.context import RunContext
from orchestrator.control.events import PlanReason, RunEvent
from orchestrator.control.journal import Journal
from orchestrator.control.ledger import RunLedger
from orchestrator.control.measure import SwitchCostMeter
from orchestrator.control.ports import (
    CheckpointStore,
    Clock,
    ClusterProbe,
    Planner,
    WorkerGroupPort,
)
from orchestrator.control.states import (
    ControllerState,
    DiscoveringState,
    FailedState,
    FinishedState,
    LaunchingState,
    PlanningState,
    RecoveringState,
    ResizingState,
    RunningState,
    proceed_at_s,
)
from orchestrator.policies.readmit import ReadmitPolicy
from orchestrator.policies.rejoin import RejoinPolicy


class Controller:
    """Drives one training run through the states above."""

    def __init__(
        self,
        *,
        config: ControllerConfig,
        probe: ClusterProbe,
        workers: WorkerGroupPort,
        checkpoints: CheckpointStore,
        planner: Planner,
        clock: Clock,
        callbacks: Sequence[ControllerCallback] = (),
        logger: logging.Logger | None = None,
    ) -> None:
        readmit = ReadmitPolicy(
            cooldown_s=config.readmit_cooldown_s,
            backoff=config.readmit_backoff,
            max_cooldown_s=config.readmit_max_cooldown_s,
            threshold=config.straggler_threshold,
            window=config.straggler_window_steps,
        )
        self.ctx = RunContext(
            config,
            probe,
            workers,
            checkpoints,
            planner,
            clock,
            Journal(callbacks, logger),
            RunLedger(switch_cost=SwitchCostMeter(config.initial_switch_cost_s)),
            RejoinPolicy(config.rejoin_cooldown_s),
            readmit,
        )
        self.state: ControllerState = DiscoveringState(
            since_s=clock.now_s(), reason=PlanReason.INITIAL
        )

    # -- what the run knows (read these; the handlers write them) --------------------------

    @property
    def config(self) -> ControllerConfig:
        return self.ctx.config

    @property
    def ledger(self) -> RunLedger:
        return self.ctx.ledger

    @property
    def journal(self) -> Journal:
        return self.ctx.journal

    @property
    def events(self) -> list[RunEvent]:
        """Every decision and observation so far, oldest first."""
        return self.ctx.journal.events

    @property
    def next_step(self) -> int:
        return self.ctx.ledger.next_step

    @property
    def failure_count(self) -> int:
        return self.ctx.ledger.failure_count

    @property
    def lost_steps_total(self) -> int:
        return self.ctx.ledger.lost_steps_total

    @property
    def switch_cost(self) -> SwitchCostMeter:
        return self.ctx.ledger.switch_cost

    @property
    def planner(self) -> Planner:
        return self.ctx.planner

    @planner.setter
    def planner(self, planner: Planner) -> None:
        self.ctx.planner = planner

    @property
    def done(self) -> bool:
        return self.state.name.is_terminal

    # -- stepping --------------------------------------------------------------------------

    def step(self) -> ControllerState:
        """Do one transition or one training step; return the state after it."""
        if not self.done:
            self._enter(self._handle(self.state))
        return self.state

    def wait_s(self) -> float:
        """Seconds until the current state may proceed (0: step now)."""
        return max(0.0, proceed_at_s(self.state) - self.ctx.now_s())

    def run(
        self, max_steps: int | None = None, *, until: Callable[[], bool] | None = None
    ) -> ControllerState:
        """Step until FINISHED or FAILED (or ``max_steps`` calls to :meth:`step`, or ``until``
        says so before a call: the simulator's horizon)."""
        calls = 0
        while (
            not self.done
            and (max_steps is None or calls < max_steps)
            and (until is None or not until())
        ):
            self.step()
            calls += 1
            # Sleep between steps, never inside one, and at most a poll interval at a time.
            wait_s = min(self.wait_s(), self.config.poll_interval_s)
            if wait_s > 0 and not self.done:
                self.ctx.clock.sleep(wait_s)
        return self.state

    def _handle(self, state: ControllerState) -> ControllerState:
        ctx = self.ctx
        match state:
            case DiscoveringState():
                return starting.discover(ctx, state)
            case PlanningState():
                return starting.plan(ctx, state)
            case LaunchingState():
                return starting.launch(ctx, state)
            case RunningState():
                return running.run_one(ctx, state)
            case RecoveringState():
                return running.recover(ctx, state)
            case ResizingState():
                return running.resize(ctx, state)
            case FinishedState() | FailedState():
                return state

    def _enter(self, state: ControllerState) -> None:
        """Replace the state; tell the callbacks when its name changes."""
        previous = self.state.name
        self.state = state
        if state.name is not previous:
            journal = self.ctx.journal
            journal.logger.debug(
                "state %s -> %s",
                previous,
                state.name,
                extra={"event": {"kind": "state", "from": str(previous), "to": str(state.name)}},
            )
            name = state.name
            journal.notify("on_state", lambda cb: cb.on_state(name))
