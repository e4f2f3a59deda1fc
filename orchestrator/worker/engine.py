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
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from orchestrator.errors import SpecError
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import MemoryUse
from orchestrator.worker import evaluate, layerwise, recompute, sharding, tensor_parallel, topology
from orchestrator.worker.data import DataConfig, make_dataset
from orchestrator.worker.dropout import sample_streams
from orchestrator.worker.emulation import Stretcher
from orchestrator.worker.finite import FiniteGuard
from orchestrator.worker.grad_sync import OverlappedGradSync
from orchestrator.worker.groups import GradientGroups, backend_for_device, init_world
from orchestrator.worker.layers import build_layers
from orchestrator.worker.memory_account import (
    ActivationAccount,
    DeviceMemory,
    memory_use,
    storage_bytes,
)
from orchestrator.worker.model_api import LayeredModel, build_model, check_layer_count
from orchestrator.worker.optim import (
    clip_coefficient,
    make_recipe_optimizer,
    scale_gradients,
    set_learning_rate,
    squared_norm,
)
from orchestrator.worker.p2p import warm_up
from orchestrator.worker.pipeline import PipelineRunner
from orchestrator.worker.precision import (
    DynamicLossScaler,
    LossScaling,
    Precision,
    PrecisionPolicy,
    attach_loss_scale,
    parse_precision,
    restore_loss_scale,
)
from orchestrator.worker.recipe import OptimizerRecipe
from orchestrator.worker.schedule import Schedule, microbatch_sizes
from orchestrator.worker.subgroups import leave_world
from orchestrator.worker.tied import TiedGradients, copy_initial_weights, tied_copies

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
        self.policy = PrecisionPolicy(parse_precision(config.precision), self.device.type)
        self.scaling = (
            LossScaling(DynamicLossScaler(scale=config.loss_scale_init))
            if self.policy.scales_loss
            else None
        )
        self._step_scale = 1.0
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.backends.cuda.matmul.allow_tf32 = config.tf32
            torch.backends.cudnn.allow_tf32 = config.tf32
        self.layers = build_layers(self.model, self.spec.layer_indices, config.seed, self.device)
        copy_initial_weights(self.model, self.layers, config.seed, self.device)
        self.recipe = config.optimizer_recipe
        self.optimizers = self._make_optimizers()
        self._step = 0
        self._skip_update = False
        self.dataset = make_dataset(config.data, config.seed) if self._needs_data else None
        if config.eval_every and self.dataset is not None:
            evaluate.check_validation_data(self.dataset)
        self.finite_guard = FiniteGuard(config.skip_nonfinite_steps, config.learning_rate)
        self.groups: GradientGroups | None = None
        self.tied: TiedGradients | None = None
        self.grad_sync: OverlappedGradSync | None = None
        self.sharding: sharding.ShardedState | None = None
        self.layerwise: layerwise.LayerwiseZero | None = None  # per-layer ZeRO (worker/layerwise)
        self.runner: PipelineRunner | None = None
        self.device_memory: DeviceMemory | None = None
        self._activations: ActivationAccount | None = None
        self._last_memory: MemoryUse | None = None
        # Sharded stages: the whole gradients held at the end of the backward (the state's peak;
        # the slices replace them only after it, in ShardedState.after_backward).
        self._backward_grad_bytes = 0
        self._steps_run = 0
        if self.stretcher.emulated:
            log.info(
                "rank %d (%s): emulated speed, compute stretched x%.2f",
                config.rank,
                self.spec.device_type,
                config.slowdown_factor,
            )

    def _make_optimizers(self) -> dict[int, torch.optim.Optimizer]:
        return {
            i: make_recipe_optimizer(self.recipe, layer.named_parameters())
            for i, layer in self.layers.items()
        }

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
        warm_up(self.device)
        # Group creation is collective over the world: tp groups first, then gradient groups.
        mesh = tensor_parallel.make_mesh(self.config.plan, self.spec, self.device)
        if mesh is not None:
            tensor_parallel.parallelize(self.layers, self.model, mesh)
            self.optimizers = self._make_optimizers()  # over the split parameters
        self.groups = GradientGroups(self.config.plan, self.config.rank)
        self.tied = TiedGradients(self.model, self.config.plan, self.config.rank)
        self.sharding = sharding.ShardedState(
            self.config.plan,
            self.config.rank,
            self.layers,
            self.optimizers,  # takes over (removes) the optimizers of its sharded layers
            self.recipe,
            self.groups.handles,
            tied_copies(self.model),
        )
        if self.sharding.groups and layerwise.applies(self.config.plan, self.model):
            self.layerwise = layerwise.LayerwiseZero(
                self.config.plan, self.sharding, self.layers, lambda: self._activations
            )
        # Every holder of a gradient group must build the same buffers, so the choice is the
        # plan's, not the rank's: sharded groups that reduce their own gradients
        # (worker/sharding.py) and tensor-parallel stages (whole-shape contributions of DTensor
        # slices, worker/groups.py) take the blocking path everywhere.
        overlap = self.config.overlap_grad_reduce and topology.overlaps_grad_reduce(
            self.config.plan
        )
        self.grad_sync = (
            OverlappedGradSync(
                self.groups.mine, self.layers, int(self.config.grad_bucket_mb * 1024 * 1024)
            )
            if overlap
            else None
        )
        self.runner = PipelineRunner(
            spec=self.spec,
            layers=recompute.stage_layers(
                [self.layers[i] for i in self.spec.layer_indices],
                self.spec.layer_indices,
                self.model.num_planner_layers,
                self.config.plan.replicas[self.spec.replica].stages[self.spec.stage].recompute,
            ),
            model=self.model,
            device=self.device,
            stretcher=self.stretcher,
            policy=self.policy,
            sync_each=self.stretcher.emulated,
        )
        self._activations = self._activation_account()

    def _activation_account(self) -> ActivationAccount | None:
        if not self.config.account_memory:
            return None
        self.device_memory = DeviceMemory(self.device)
        return ActivationAccount(p for layer in self.layers.values() for p in layer.parameters())

    def _counts_memory(self, step: int) -> bool:
        every = max(1, self.config.memory_account_every)
        return self._activations is not None and (self._steps_run < 2 or step % every == 0)

    def memory_use(self) -> MemoryUse | None:
        """This rank's memory terms as of its last counted step (None when not counted)."""
        if self.runner is None or self.runner.activations is None:
            return self._last_memory
        optimizers = list(self.optimizers.values())
        masters: list[torch.Tensor] = []
        if self.sharding is not None:
            for g in self.sharding.groups:
                if g.optimizer is not None:
                    optimizers.append(g.optimizer)
                masters.extend(g.pieces)
        counted = memory_use(
            self.layers.values(), optimizers, self.runner.activations, self.device_memory, masters
        )
        if self.layerwise is not None:
            counted = self.layerwise.memory(counted)
        elif self.sharding is not None:
            # The state's peak is the end of the backward: whole gradients (the slices that
            # replace them come after), and for ``full`` the whole parameters, released after it.
            held = counted.weights_bytes + self.sharding.released_weight_bytes()
            grads = max(counted.grads_bytes, self._backward_grad_bytes)
            counted = replace(counted, weights_bytes=held, grads_bytes=grads)
        self._last_memory = counted
        return self._last_memory

    def train_step(self, step: int) -> StepResult:
        """Run step ``step`` of training on the global batch (this rank's part of it)."""
        start_s = self.begin_step()
        loss = self.compute_gradients(step)
        self.apply_update()
        result = self.step_result(step, loss, start_s)
        if evaluate.is_eval_step(step, self.config.eval_every):
            result = replace(result, eval_loss=self.validation_loss(), eval_after_steps=step + 1)
        return result

    def validation_loss(self) -> float | None:
        """This replica's share of the validation loss with the current weights (worker/
        evaluate.py); every rank calls it together. Not timed as part of the step."""
        assert self.runner is not None, "call setup() first"
        self._gather_parameters()
        loss = evaluate.validation_loss(
            self.spec,
            self.runner.layers,
            self.model,
            self.dataset if self.dataset is None else evaluate.check_validation_data(self.dataset),
            self.config.plan.global_batch_size,
            self.config.plan.microbatch_size,
            self.config.eval_batches,
            self.device,
            self.policy,
        )
        return loss if self.spec.tp_rank == 0 else None

    # The parts of a step, for workers that order them differently (the elastic worker applies
    # a step's update only once the step is committed everywhere).

    def begin_step(self) -> float:
        """Start timing a step (wall clock and emulated compute); returns the start time."""
        if self.runner is None or self.groups is None:
            raise RuntimeError("call setup() before train_step()")
        self.stretcher.reset()
        if self.device_memory is not None:
            self.device_memory.begin_step()
        return time.perf_counter()

    def compute_gradients(self, step: int) -> float | None:
        """Forward and backward of this rank's microbatches, then the gradient all-reduce."""
        assert self.runner is not None and self.groups is not None, "call setup() first"
        # Every layer, not every optimizer: a shard group's layers have none of their own, and
        # a layer kept across a change of plan may arrive with its last step's gradients.
        for layer in self.layers.values():
            layer.zero_grad(set_to_none=True)
        if self.layerwise is None:
            self._gather_parameters()  # layer by layer, each layer is gathered where it runs
        inputs, targets = self._batch(step)
        sizes = microbatch_sizes(self.spec.replica_batch_size, self.config.plan.microbatch_size)
        weights = [m / self.config.plan.global_batch_size for m in sizes]
        scale = self.scaling.scale if self.scaling is not None else 1.0
        self._step_scale = scale
        if self.grad_sync is not None:
            self.grad_sync.begin(len(sizes))
        if self.layerwise is not None:
            self.layerwise.begin(len(sizes))
        offset = self.spec.replica_sample_offset
        self.runner.activations = self._activations if self._counts_memory(step) else None
        self._steps_run += 1
        with sample_streams(self.config.seed, step, offset, sizes):  # seeded dropout, if any
            loss = self.runner.run(self.config.schedule, sizes, weights, inputs, targets, scale)
        if self.layerwise is not None:
            self.layerwise.finish()  # the empty rounds; the gradient slice is summed
        if self.grad_sync is not None:
            self.grad_sync.finish()
        elif self.sharding is not None:
            self.groups.all_reduce(self.layers, skip=self.sharding.self_reduced)
        else:
            self.groups.all_reduce(self.layers)
        if self.tied is not None:
            self.tied.all_reduce(self.layers)
        if self.scaling is not None:
            self.scaling.settle(self._grads(), self.device)
        self._skip_update = False
        if self.scaling is None or not self.scaling.overflowed:  # fp16 overflow: skipped below
            # Before any update: a non-finite step is stopped here, or skipped (its gradients
            # dropped and no optimizer stepped, so weights and optimizer state stay as they are).
            self._skip_update = not self.finite_guard.check(
                step, loss, self.layers, self.device, self._slice_grads()
            )
        if self.sharding is not None and self.layerwise is None and not self._skip_update:
            self._backward_grad_bytes = storage_bytes(
                p.grad for layer in self.layers.values() for p in layer.parameters()
            )
            self.sharding.after_backward(self.layers)
        if self.recipe.grad_clip_norm is not None and not self._skip_update:
            # Gradients are still multiplied by the loss scale (1 unless fp16): so is the bound.
            self._clip_gradients(self.recipe.grad_clip_norm * scale)
        self._step = step
        return loss

    def _slice_grads(self) -> list[torch.Tensor]:
        """Gradient slices already reduced in the backward (layer by layer), for the finite
        check: the layers themselves hold no gradient then."""
        if self.layerwise is None or self.sharding is None:
            return []
        return [g.grad_slice for g in self.sharding.groups if g.grad_slice is not None]

    def _gather_parameters(self) -> None:
        """``sharding: full``: whole parameters from the shard group's slices before they are
        used (collective over each group's sharded holders)."""
        gathered = self.sharding is not None and self.sharding.ensure_whole(self.layers)
        if gathered and self._activations is not None:  # gathered parameters: new storage
            self._activations.track(p for layer in self.layers.values() for p in layer.parameters())

    def _clip_gradients(self, max_norm: float) -> None:
        """Clip by the global norm: each layer's squared norm counted by one holder (the lowest
        rank holding it; tied copies not at all), summed in one scalar all-reduce."""
        copies = tied_copies(self.model)
        owners = topology.checkpoint_writers(self.config.plan)  # lowest holder of each layer
        counted = [
            p
            for i, layer in self.layers.items()
            if owners[i] == self.spec.rank
            for name, p in layer.named_parameters()
            if (i, name) not in copies
        ]
        total = squared_norm(counted, self.device)
        if self.sharding is not None:
            # a shard group's layers: each sharded holder counts its slice of the summed
            # gradient where the group's writer shards (it then has no whole gradient)
            total += self.sharding.squared_norm(owners)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        coefficient = clip_coefficient(float(total), max_norm)
        scale_gradients(
            (p for layer in self.layers.values() for p in layer.parameters()), coefficient
        )
        if self.sharding is not None:
            self.sharding.scale_gradients(coefficient)

    def apply_update(self) -> None:
        """The optimizer step of every layer this rank holds (stretched when emulated), then the
        sharded holders' gather of the updated slices: communication, which emulation does not
        stretch (it is timed like the all-reduce, outside the rank's compute)."""
        updated = self.stretcher.run(self._update, self._sync, key="update")
        if updated and self.sharding is not None:
            self.sharding.gather_updated(self.layers)

    def step_result(self, step: int, loss: float | None, start_s: float) -> StepResult:
        return StepResult(
            step=step,
            rank=self.spec.rank,
            replica=self.spec.replica,
            stage=self.spec.stage,
            # A tp group's ranks compute the same loss; one of them reports it.
            loss=loss if self.spec.tp_rank == 0 else None,
            compute_s=self.stretcher.compute_s,
            step_s=time.perf_counter() - start_s,
            samples=self.spec.replica_batch_size,
            emulated=self.stretcher.emulated,
            overflow_skipped=self.scaling is not None and self.scaling.overflowed,
            loss_scale=self._step_scale,
            memory=self.memory_use(),
            end_param_bytes=sum(
                p.numel() * p.element_size()
                for layer in self.layers.values()
                for p in layer.parameters()
            ),
            end_slice_bytes=0
            if self.sharding is None
            else sum(t.numel() * t.element_size() for g in self.sharding.groups for t in g.pieces),
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
            self._to_device(inputs) if spec.is_first_stage else None,
            self._to_device(targets) if spec.is_last_stage else None,
        )

    def _to_device(self, batch: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return batch
        # Pinned host memory: the copy runs asynchronously, without a staging copy.
        return batch.pin_memory().to(self.device, non_blocking=True)

    def _update(self) -> bool:
        """The optimizer steps; False when the step's update is skipped."""
        if self._skip_update:
            return False  # a non-finite step the job allows skipping (worker/finite.py)
        if self.scaling is not None:
            if self.scaling.overflowed:
                return False  # fp16 overflow somewhere: every rank skips this step
            self.scaling.unscale_(self._grads())
        learning_rate = self.recipe.learning_rate_at(self._step)
        for opt in self.optimizers.values():
            set_learning_rate(opt, learning_rate)
            opt.step()
        if self.sharding is not None:
            self.sharding.update_slices(learning_rate)
        return True

    def _grads(self) -> list[torch.Tensor | None]:
        return [p.grad for layer in self.layers.values() for p in layer.parameters()]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def get_layer_states(self) -> dict[int, dict[str, Any]]:
        """Planner layer -> {"params": state_dict, "optimizer": state_dict}, on the CPU.

        In a tp group each rank returns its local part (``tensor_parallel.local_layer_state``);
        ``tensor_parallel.merge_layer_states`` joins a stage's parts into the whole state.
        """
        if self.spec.tp > 1:
            tp_states = {
                i: tensor_parallel.local_layer_state(layer, self.optimizers[i], self.spec)
                for i, layer in self.layers.items()
            }
            attach_loss_scale(tp_states, self.scaling)  # fp16: the scale travels with the layers
            return tp_states
        states = {
            i: {
                "params": _to_cpu(layer.state_dict()),
                "optimizer": _to_cpu(self.optimizers[i].state_dict()),
            }
            for i, layer in self.layers.items()
            if i in self.optimizers
        }
        if self.sharding is not None:
            # Sharded layers: whole params, this rank's slice of the optimizer state
            # (``sharding.merge_sharded_states`` joins the holders' slices).
            states.update(self.sharding.layer_states(self.layers))
        attach_loss_scale(states, self.scaling)  # fp16: the scale travels with the layers
        return states

    def set_layer_states(self, states: dict[int, dict[str, Any]]) -> None:
        """Load this rank's layers from ``states`` (extra layers are ignored)."""
        missing = [i for i in self.layers if i not in states]
        if missing:
            raise SpecError(
                f"layer states lack planner layers {missing} that rank {self.spec.rank} holds",
                field="checkpoint.layers",
                fix="resume from a checkpoint of the same model",
            )
        restore_loss_scale((states[i] for i in self.layers), self.scaling)
        if self.sharding is not None:
            self.sharding.materialize(self.layers)  # ``full``: whole shapes to load into
        if self.spec.tp > 1:
            for i, layer in self.layers.items():
                tensor_parallel.load_local(layer, self.optimizers[i], states[i], self.spec)
            return
        for i, layer in self.layers.items():
            if tensor_parallel.SHARD_KEY in states[i]:
                states[i] = tensor_parallel.merge_layer_states([states[i]])
            layer.load_state_dict(states[i]["params"])
            if i in self.optimizers:
                # Copy: load_state_dict keeps the given state tensors when dtype and device
                # already match, and callers may hand several ranks the same tensors.
                self.optimizers[i].load_state_dict(_to_cpu(states[i]["optimizer"]))
        if self.sharding is not None:
            self.sharding.load(self.layers, states)

    def leave_groups(self) -> None:
        """Leave every process group now and drop this engine's handles to them, keeping the
        layers, optimizers and sharding layout (for exports and a re-formation, which builds new
        groups). Why the handles: gloo closes a group's connections only when the last reference
        to it goes, and ``destroy_process_group`` alone leaves a subgroup this engine still holds
        (gradient, tied, shard groups) connected, so a peer waiting on this rank there would
        wait out its timeout; with the handles gone it fails at once with a closed connection.
        Every subgroup, the tensor-parallel ones too (their meshes live on in the layers'
        parameters), is destroyed by name before the world (``worker/subgroups.py``)."""
        import gc

        if self.grad_sync is not None:
            self.grad_sync.close()
        if self.layerwise is not None:
            self.layerwise.close()
        self.grad_sync = None
        self.layerwise = None
        self.groups = None
        self.runner = None
        if self.tied is not None:
            self.tied.groups = []
        if self.sharding is not None:
            for g in self.sharding.groups:
                g.all_handle = g.sharded_handle = None
        leave_world()
        gc.collect()  # the groups' last references may sit in reference cycles

    def shutdown(self) -> None:
        """Leave the process groups (safe to call twice)."""
        if self.grad_sync is not None:
            self.grad_sync.close()
        if self.layerwise is not None:
            self.layerwise.close()
        leave_world()
        self.groups = None
        self.layerwise = None
        self.grad_sync = None
        self.sharding = None
        self.runner = None


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj
