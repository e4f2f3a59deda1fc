"""A training run on an emulated two-type cluster, driven by the real elastic controller.

What is real: the controller state machine (``orchestrator.control.Controller``) with its
policies and journal, the planner and cost model (``make_plan`` over the built-in OPT-350
profiles), the telemetry callbacks it feeds, torch training (a small stack of linear layers, one
per planner layer, trained with SGD on CPU; the loss is the real loss) and checkpoints written to
disk with ``torch.save`` (atomic rename).

What is emulated here, in-process, until the elastic Ray run (``orchestrator run``) can stand in:
the cluster (two nodes, ``a100-0`` with 2x A100-40 and ``v100-0`` with 2x V100-16, labelled as
emulated), device speed (each step sleeps the cost model's predicted step time of the plan), and
the failure: at ``fail_at_step`` node ``v100-0`` crashes and takes every worker down with it
(their collectives abort), so no survivor holds the layers and the controller restores from the
last checkpoint on the remaining A100 node (steps lost since that checkpoint).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.config import ControllerConfig
from orchestrator.control.controller import Controller
from orchestrator.control.events import StageTiming, StepReport
from orchestrator.control.ports import PlanProposal, SystemClock, WorkerLost
from orchestrator.control.recovery import CheckpointRef, LayerState, RestoreKind, RestoreSource
from orchestrator.control.snapshot import EMULATED_SPEED_LABEL, ClusterSnapshot, NodeInfo
from orchestrator.planner.search import make_plan
from orchestrator.policies.failure import FailurePolicy
from orchestrator.profiles.builtin import builtin_model, builtin_profiles
from orchestrator.spec.model import TrainingSpec
from orchestrator.spec.plan import Plan

MODEL_NAME = "OPT-350"
GLOBAL_BATCH_SIZE = 8
WIDTH = 8  # features of the small torch layers that stand in for the model's layers
FAILED_NODE = "v100-0"


def emulated_nodes() -> list[NodeInfo]:
    return [
        NodeInfo("a100-0", "A100-40", 2, {EMULATED_SPEED_LABEL: "1.0"}),
        NodeInfo(FAILED_NODE, "V100-16", 2, {EMULATED_SPEED_LABEL: "0.4"}),
    ]


class EmulatedProbe:
    """The cluster as a list of nodes the test changes (a node crash removes one)."""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self.nodes = list(nodes)
        self.sequence = 0

    def snapshot(self) -> ClusterSnapshot:
        self.sequence += 1
        return ClusterSnapshot.of(self.sequence, self.nodes)

    def crash(self, node_id: str) -> None:
        self.nodes = [n for n in self.nodes if n.node_id != node_id]


class RealPlanner:
    """The project's planner and cost model over the built-in profiles of ``MODEL_NAME``."""

    def __init__(self) -> None:
        self.model = builtin_model(MODEL_NAME)
        self.profiles = builtin_profiles(MODEL_NAME)
        self.training = TrainingSpec(global_batch_size=GLOBAL_BATCH_SIZE)
        self.predicted_s: dict[str, float] = {}  # plan JSON -> predicted step seconds

    def __call__(
        self, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> PlanProposal:
        result = make_plan(snapshot.to_cluster(), self.model, self.training, self.profiles)
        self.predicted_s[result.plan.to_json()] = result.estimate.step_time_s
        return PlanProposal(result.plan, result.estimate.step_time_s, result.bound_step_time_s)


class DiskCheckpoints:
    """Layer-indexed checkpoints in a folder, one file per step, written atomically."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def _path(self, step: int) -> Path:
        return self.folder / f"step-{step:08d}.pt"

    def latest(self) -> CheckpointRef | None:
        files = sorted(self.folder.glob("step-*.pt"))
        if not files:
            return None
        saved = torch.load(files[-1], weights_only=False)
        return CheckpointRef(saved["step"], saved["meta"])

    def save(
        self, step: int, states: Mapping[int, LayerState], meta: Mapping[str, object]
    ) -> CheckpointRef:
        tmp = self._path(step).with_suffix(".tmp")
        torch.save({"step": step, "states": dict(states), "meta": dict(meta)}, tmp)
        os.replace(tmp, self._path(step))
        return CheckpointRef(step, dict(meta))

    def load(self, step: int) -> dict[int, LayerState]:
        return dict(torch.load(self._path(step), weights_only=False)["states"])


@dataclass(frozen=True)
class Rank:
    rank: int
    replica: int
    stage: int
    device_type: str
    node: str
    layers: tuple[int, int]


def ranks_of(plan: Plan, nodes: Sequence[NodeInfo]) -> list[Rank]:
    """One rank per device of every stage, on the stage's node (or a node of its type)."""
    by_type = {n.device_type: n.node_id for n in nodes}
    ranks: list[Rank] = []
    for r_index, replica in enumerate(plan.replicas):
        for s_index, stage in enumerate(replica.stages):
            node = stage.node or by_type[stage.device_type]
            for _ in range(stage.tp):
                ranks.append(
                    Rank(len(ranks), r_index, s_index, stage.device_type, node, stage.layers)
                )
    return ranks


class EmulatedWorkerGroup:
    """Trains a real torch model in-process; sleeps the predicted step time to emulate devices.

    Data parallelism is exact here: every replica would hold the same weights after a step, so
    one copy of the layers stands for all of them.
    """

    def __init__(
        self,
        planner: RealPlanner,
        probe: EmulatedProbe,
        checkpoints: DiskCheckpoints,
        *,
        fail_at_step: int,
    ) -> None:
        self.planner, self.probe, self.checkpoints = planner, probe, checkpoints
        self.fail_at_step = fail_at_step
        self.failed = False
        self.ranks: list[Rank] = []
        self.alive = False
        self.plan: Plan | None = None
        self.layers: list[torch.nn.Linear] = []
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(64, WIDTH, generator=generator)
        self.targets = torch.tanh(self.inputs @ torch.randn(WIDTH, WIDTH, generator=generator))

    def launch(self, plan: Plan, restore: RestoreSource) -> None:
        torch.manual_seed(1)
        self.layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(plan.num_layers)]
        states: Mapping[int, LayerState] = {}
        if restore.kind is RestoreKind.CHECKPOINT:
            assert restore.checkpoint_step is not None
            states = self.checkpoints.load(restore.checkpoint_step)
        elif restore.kind is RestoreKind.REPLICAS:
            states = restore.states
        for index, state in states.items():
            self.layers[index].load_state_dict(state)  # type: ignore[arg-type]
        self.plan = plan
        self.ranks = ranks_of(plan, self.probe.nodes)
        self.alive = True

    def step(self, step: int) -> StepReport:
        assert self.plan is not None and self.alive
        started = time.perf_counter()
        if step == self.fail_at_step and not self.failed:
            self.failed, self.alive = True, False
            self.probe.crash(FAILED_NODE)
            # The crash takes the whole group down (its collectives abort on every rank), so no
            # survivor holds the layers; only the crashed node is gone for good.
            raise WorkerLost(
                [r.rank for r in self.ranks],
                {FAILED_NODE},
                f"injected failure: node {FAILED_NODE} crashed at step {step}",
            )
        loss = self._train_once()
        predicted_s = self.planner.predicted_s[self.plan.to_json()]
        time.sleep(max(predicted_s - (time.perf_counter() - started), 0.0))
        step_s = time.perf_counter() - started
        return StepReport(step, loss, step_s, self.plan.global_batch_size, self._timings(step_s))

    def _train_once(self) -> float:
        x = self.inputs
        for layer in self.layers:
            x = torch.tanh(layer(x))
        loss = torch.nn.functional.mse_loss(x, self.targets)
        for layer in self.layers:
            layer.zero_grad()
        loss.backward()
        with torch.no_grad():
            for layer in self.layers:
                for p in layer.parameters():
                    p -= 0.05 * p.grad  # type: ignore[operator]
        return float(loss.detach())

    def _timings(self, step_s: float) -> tuple[StageTiming, ...]:
        # A stage computes for its share of the replica's layers; the rest of the step it waits.
        assert self.plan is not None
        timings = []
        for r_index, replica in enumerate(self.plan.replicas):
            busy = 0.9 * replica.batch_size / max(r.batch_size for r in self.plan.replicas)
            for s_index, stage in enumerate(replica.stages):
                share = stage.num_layers / max(s.num_layers for s in replica.stages)
                timings.append(
                    StageTiming(r_index, s_index, stage.device_type, busy * share * step_s, step_s)
                )
        return tuple(timings)

    def layer_holders(self) -> Mapping[int, tuple[int, ...]]:
        if not self.alive:
            return {}
        return {
            layer: tuple(r.rank for r in self.ranks if r.layers[0] <= layer < r.layers[1])
            for layer in range(len(self.layers))
        }

    def placement(self) -> Mapping[int, str]:
        return {r.rank: r.node for r in self.ranks}

    def fetch_layer_states(self, sources: Mapping[int, int]) -> dict[int, LayerState]:
        if not self.alive:
            raise WorkerLost([r.rank for r in self.ranks], {r.node for r in self.ranks}, "gone")
        return {
            layer: {k: v.clone() for k, v in self.layers[layer].state_dict().items()}
            for layer in sources
        }

    def stop(self) -> None:
        self.alive = False


@dataclass(frozen=True)
class RunSummary:
    state: str
    steps: int
    failures: int
    lost_steps: int


def run_emulated_training(
    callbacks: Sequence[ControllerCallback],
    workdir: Path,
    *,
    total_steps: int = 20,
    fail_at_step: int = 12,
    checkpoint_interval_steps: int = 5,
) -> RunSummary:
    """Run the controller to the end; the callbacks see every hook it calls."""
    probe = EmulatedProbe(emulated_nodes())
    planner = RealPlanner()
    checkpoints = DiskCheckpoints(workdir / "checkpoints")
    workers = EmulatedWorkerGroup(planner, probe, checkpoints, fail_at_step=fail_at_step)
    config = ControllerConfig(
        total_steps=total_steps,
        checkpoint_interval_steps=checkpoint_interval_steps,
        poll_interval_s=0.5,
        discovery_timeout_s=30.0,
        failure=FailurePolicy(max_failures=3, initial_backoff_s=0.5),
    )
    controller = Controller(
        config=config,
        probe=probe,
        workers=workers,
        checkpoints=checkpoints,
        planner=planner,
        clock=SystemClock(),
        callbacks=callbacks,
    )
    final = controller.run()
    return RunSummary(
        str(final.name), controller.next_step, controller.failure_count, controller.lost_steps_total
    )
