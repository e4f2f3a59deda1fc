"""What one rank is given and what it reports: the engine's configuration, its per-step result,
and the checks a configuration passes before any process group exists.

:class:`~.engine.StageEngine` runs one rank from an :class:`EngineConfig`; the Ray side ships the
config to the actor, and the driver collects a :class:`StepResult` per rank and step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import MemoryUse
from orchestrator.worker import sharding, tensor_parallel, topology
from orchestrator.worker.data import DataConfig
from orchestrator.worker.model_api import LayeredModel, build_model, check_layer_count
from orchestrator.worker.precision import Precision, parse_precision
from orchestrator.worker.recipe import OptimizerRecipe
from orchestrator.worker.schedule import Schedule


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
    # Weight decay, schedule, clipping; None: ``optimizer`` at a constant ``learning_rate``.
    recipe: OptimizerRecipe | None = None
    # fp32, or bf16/fp16 compute over fp32 master weights (worker/precision.py).
    precision: str = Precision.FP32.value
    # TF32 for fp32 matmuls on GPUs that have it (Ampere and later); no effect on the CPU.
    tf32: bool = True
    loss_scale_init: float = 2.0**16  # fp16's first loss scale (GradScaler's default)
    # Start each bucket's gradient all-reduce during the backward (worker/grad_sync.py); off:
    # one blocking all-reduce per group after the backward.
    overlap_grad_reduce: bool = True
    grad_bucket_mb: float = 25.0
    # Non-finite steps skipped (update dropped) before training stops (worker/finite.py).
    skip_nonfinite_steps: int = 0
    # Count the memory term by term (worker/memory_account.py) on the first two steps a rank runs
    # and every ``memory_account_every`` steps after (the hooks cost a Python call per saved
    # tensor; a plan's memory is the same every step); other steps repeat the last count.
    account_memory: bool = True
    memory_account_every: int = 50
    # Validation loss after every ``eval_every``-th step's update (0: never) over
    # ``eval_batches`` global batches of the held-out split (worker/evaluate.py).
    eval_every: int = 0
    eval_batches: int = 4

    @property
    def optimizer_recipe(self) -> OptimizerRecipe:
        if self.recipe is not None:
            return self.recipe
        return OptimizerRecipe(name=self.optimizer, learning_rate=self.learning_rate)


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
    # fp16: the step overflowed somewhere, so no rank applied it (it must not count as done).
    overflow_skipped: bool = False
    loss_scale: float = 1.0  # the scale this step's loss was multiplied by (1.0 unless fp16)
    memory: MemoryUse | None = None  # what the rank held this step (worker/memory_account.py)
    # Last stage of an evaluated step: this replica's weighted share of the validation loss
    # after the step's update (the shares add up like ``loss``); None otherwise.
    eval_loss: float | None = None
    eval_after_steps: int | None = None  # the evaluated weights hold this many steps' updates
    # Bytes of the rank's layer parameters as they stand at the step's end, after its update and
    # before the next gather (a ``full`` holder has released them: 0), and of the parameter
    # slices it keeps for its shard groups.
    end_param_bytes: int = 0
    end_slice_bytes: int = 0
    # Wall seconds of the collectives run inside the compute calls (the layer-by-layer sharded
    # path's gathers and reductions, worker/layerwise.py), part of ``compute_s``.
    collective_s: float = 0.0


def preflight(config: EngineConfig) -> LayeredModel:
    """Checks that need no process group: factory importable, layer counts agree, the model can
    take the plan's tp degrees, sharding levels the engine executes."""
    topology.check_executable(config.plan)
    Schedule(config.schedule)
    parse_precision(config.precision)
    model = build_model(config.model_factory, dict(config.model_kwargs))
    check_layer_count(model, config.plan.num_layers)
    tensor_parallel.check_model(model, config.plan)
    sharding.check_recipe(config.plan, config.optimizer_recipe, config.precision)
    return model
