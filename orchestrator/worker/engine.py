"""One pipeline stage of one replica: the engine a Ray actor wraps (one per device).

Life cycle: ``StageEngine(config)`` builds this rank's layers (seeded per layer, so any partition
initialises them alike) and optimizers; ``setup(...)`` joins the process groups; ``train_step(k)``
runs step ``k``'s pipeline schedule, all-reduces shared layers' gradients and updates;
``get_layer_states``/``set_layer_states`` move parameters and optimizer state by planner layer
index (checkpoints, re-plans); ``shutdown()`` leaves the groups.

Loss weighting: microbatch ``j`` of size ``m_j`` contributes ``loss_j * m_j / global_batch_size``.
Summed over microbatches and replicas (gradients are all-reduced with SUM), that is the
global-batch mean loss, so one step of any plan equals one single-process step on the whole batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.errors import SpecError
from orchestrator.spec.plan import Plan
from orchestrator.worker import topology
from orchestrator.worker.data import DataConfig, make_dataset
from orchestrator.worker.emulation import Stretcher
from orchestrator.worker.finite import FiniteGuard
from orchestrator.worker.groups import GradientGroups, backend_for_device, init_world
from orchestrator.worker.model_api import LayeredModel, build_model, check_layer_count
from orchestrator.worker.optim import make_optimizer
from orchestrator.worker.pipeline import PipelineRunner
from orchestrator.worker.schedule import Schedule, microbatch_sizes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """Everything one rank needs; picklable, so the Ray side ships it to the actor."""

    model_factory: str  # "package.module:function" returning a LayeredModel
    plan: Plan
    rank: int
    data: DataConfig
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    schedule: str = Schedule.ONE_F_ONE_B.value  # or "gpipe"
    optimizer: str = "adam"  # or "sgd"
    learning_rate: float = 3e-4
    seed: int = 0
    # Emulation: >1 stretches measured compute time; 1.0 = real speed. Refused on real GPUs.
    slowdown_factor: float = 1.0
    device: str | None = None  # None: cuda if available, else cpu
    # Non-finite steps skipped (update dropped) before training stops (worker/finite.py).
    skip_nonfinite_steps: int = 0


@dataclass(frozen=True)
class StepResult:
    """What one rank reports after a step."""

    step: int
    rank: int
    replica: int
    stage: int
    # Last stage only: this replica's weighted share of the global-batch mean loss (the shares of
    # all replicas add up to the global loss); None elsewhere.
    loss: float | None
    compute_s: float  # forward + backward + update, including the emulated stretch
    step_s: float  # wall time of the whole step on this rank
    samples: int  # samples of this replica's batch (count once per replica for throughput)
    emulated: bool


def preflight(config: EngineConfig) -> LayeredModel:
    """Checks that need no process group: factory importable, layer counts agree, tp == 1."""
    topology.check_supported(config.plan)
    Schedule(config.schedule)
    model = build_model(config.model_factory, dict(config.model_kwargs))
    check_layer_count(model, config.plan.num_layers)
    return model


class StageEngine:
    """This rank's layers, optimizer, data slice and pipeline schedule."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model = preflight(config)
        ranks = topology.ranks_for_plan(config.plan)
        if not 0 <= config.rank < len(ranks):
            raise SpecError(
                f"rank {config.rank} outside the plan's {len(ranks)} ranks",
                field="rank",
                fix=f"use 0..{len(ranks) - 1}",
            )
        self.spec = ranks[config.rank]
        default_device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(config.device or default_device)
        if config.slowdown_factor != 1.0 and self.device.type == "cuda":
            raise SpecError(
                "emulated slow-down requested on a real GPU",
                field="slowdown_factor",
                fix="emulation is for CPU nodes only; drop the emulated-speed label",
            )
        self.stretcher = Stretcher(config.slowdown_factor)
        self.layers = build_layers(self.model, self.spec.layer_indices, config.seed, self.device)
        self.optimizers = {
            i: make_optimizer(config.optimizer, layer.parameters(), config.learning_rate)
            for i, layer in self.layers.items()
        }
        self.dataset = make_dataset(config.data, config.seed) if self._needs_data else None
        self.finite_guard = FiniteGuard(config.skip_nonfinite_steps, config.learning_rate)
        self.groups: GradientGroups | None = None
        self.runner: PipelineRunner | None = None
        if self.stretcher.emulated:
            log.info(
                "rank %d (%s): emulated speed, compute stretched x%.2f",
                config.rank,
                self.spec.device_type,
                config.slowdown_factor,
            )

    @property
    def _needs_data(self) -> bool:
        return self.spec.is_first_stage or self.spec.is_last_stage

    def setup(
        self, master_addr: str, master_port: int, world_size: int, timeout_s: float = 60
    ) -> None:
        """Join the world group and create the gradient groups (collective over all ranks)."""
        expected = topology.world_size(self.config.plan)
        if world_size != expected:
            raise SpecError(
                f"world_size {world_size} != the plan's {expected} stages",
                field="world_size",
                fix="start one worker per stage of the plan",
            )
        backend = backend_for_device(self.device)
        init_world(backend, master_addr, master_port, self.config.rank, world_size, timeout_s)
        self.groups = GradientGroups(self.config.plan, self.config.rank)
        self.runner = PipelineRunner(
            spec=self.spec,
            layers=[self.layers[i] for i in self.spec.layer_indices],
            model=self.model,
            device=self.device,
            stretcher=self.stretcher,
        )

    def train_step(self, step: int) -> StepResult:
        """Run step ``step`` of training on the global batch (this rank's part of it)."""
        start_s = self.begin_step()
        loss = self.compute_gradients(step)
        self.apply_update()
        return self.step_result(step, loss, start_s)

    # The parts of a step, for workers that order them differently (the elastic worker applies
    # a step's update only once the step is committed everywhere).

    def begin_step(self) -> float:
        """Start timing a step (wall clock and emulated compute); returns the start time."""
        if self.runner is None or self.groups is None:
            raise RuntimeError("call setup() before train_step()")
        self.stretcher.reset()
        return time.perf_counter()

    def compute_gradients(self, step: int) -> float | None:
        """Forward and backward of this rank's microbatches, then the gradient all-reduce."""
        assert self.runner is not None and self.groups is not None, "call setup() first"
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        inputs, targets = self._batch(step)
        sizes = microbatch_sizes(self.spec.replica_batch_size, self.config.plan.microbatch_size)
        weights = [m / self.config.plan.global_batch_size for m in sizes]
        loss = self.runner.run(self.config.schedule, sizes, weights, inputs, targets)
        self.groups.all_reduce(self.layers)
        # Before any update: a non-finite step is stopped here, or skipped by dropping its grads.
        self.finite_guard.check(step, loss, self.layers, self.device)
        return loss

    def apply_update(self) -> None:
        """The optimizer step of every layer this rank holds (stretched when emulated)."""
        self.stretcher.run(self._update, self._sync, key="update")

    def step_result(self, step: int, loss: float | None, start_s: float) -> StepResult:
        return StepResult(
            step=step,
            rank=self.spec.rank,
            replica=self.spec.replica,
            stage=self.spec.stage,
            loss=loss,
            compute_s=self.stretcher.compute_s,
            step_s=time.perf_counter() - start_s,
            samples=self.spec.replica_batch_size,
            emulated=self.stretcher.emulated,
        )

    def _batch(self, step: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.dataset is None:
            return None, None
        spec = self.spec
        inputs, targets = self.dataset.batch(
            step,
            self.config.plan.global_batch_size,
            spec.replica_sample_offset,
            spec.replica_batch_size,
        )
        return (
            inputs.to(self.device) if spec.is_first_stage else None,
            targets.to(self.device) if spec.is_last_stage else None,
        )

    def _update(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def get_layer_states(self) -> dict[int, dict[str, Any]]:
        """Planner layer -> {"params": state_dict, "optimizer": state_dict}, on the CPU."""
        return {
            i: {
                "params": _to_cpu(layer.state_dict()),
                "optimizer": _to_cpu(self.optimizers[i].state_dict()),
            }
            for i, layer in self.layers.items()
        }

    def set_layer_states(self, states: dict[int, dict[str, Any]]) -> None:
        """Load this rank's layers from ``states`` (extra layers are ignored)."""
        missing = [i for i in self.layers if i not in states]
        if missing:
            raise SpecError(
                f"layer states lack planner layers {missing} that rank {self.spec.rank} holds",
                field="checkpoint.layers",
                fix="resume from a checkpoint of the same model",
            )
        for i, layer in self.layers.items():
            layer.load_state_dict(states[i]["params"])
            # Copy: load_state_dict keeps the given state tensors when dtype and device already
            # match, and callers may hand several ranks the same (e.g. shared-memory) tensors.
            self.optimizers[i].load_state_dict(_to_cpu(states[i]["optimizer"]))

    def shutdown(self) -> None:
        """Leave the process groups (safe to call twice)."""
        if dist.is_initialized():
            dist.destroy_process_group()
        self.groups = None
        self.runner = None


def build_layers(
    model: LayeredModel, indices: range, seed: int, device: torch.device
) -> dict[int, nn.Module]:
    """Build planner layers ``indices``, each under its own seed (``seed + index``)."""
    layers: dict[int, nn.Module] = {}
    for i in indices:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + i)
            layers[i] = model.build_layer(i).to(device=device, dtype=torch.float32)
    return layers


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj
