"""One pipeline stage of one replica: the engine a Ray actor wraps (one per device).

Life cycle: ``StageEngine(config)`` builds this rank's layers (seeded per layer, so any partition
initialises them alike) and optimizers; ``setup(...)`` joins the process groups; ``train_step(k)``
runs step ``k``'s pipeline schedule, all-reduces shared layers' gradients and updates;
``get_layer_states``/``set_layer_states`` move parameters and optimizer state by planner layer
index (checkpoints, re-plans); ``shutdown()`` leaves the groups.

Loss weighting: microbatch ``j`` of size ``m_j`` contributes ``loss_j * m_j / global_batch_size``.
Summed over microbatches and replicas (gradients are all-reduced with SUM), that is the
global-batch mean loss, so one step of any plan equals one single-process step on the whole batch.

The parts: :mod:`.engine_config` (``EngineConfig``, ``StepResult``, ``preflight``) and
:mod:`.layer_states` (``get_layer_states``/``set_layer_states``); this module runs the steps.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from orchestrator.errors import SpecError
from orchestrator.spec.reports import MemoryUse
from orchestrator.worker import evaluate, layerwise, recompute, sharding, tensor_parallel, topology
from orchestrator.worker.data import DataConfig, make_dataset
from orchestrator.worker.dropout import sample_streams
from orchestrator.worker.emulation import SharedReferences, Stretcher
from orchestrator.worker.engine_config import EngineConfig, StepResult, preflight
from orchestrator.worker.finite import FiniteGuard
from orchestrator.worker.grad_sync import OverlappedGradSync
from orchestrator.worker.groups import GradientGroups, backend_for_device, init_world
from orchestrator.worker.layer_states import LayerStates
from orchestrator.worker.layers import build_layers
from orchestrator.worker.memory_account import (
    ActivationAccount,
    DeviceMemory,
    memory_use,
    storage_bytes,
)
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
    PrecisionPolicy,
    parse_precision,
)
from orchestrator.worker.schedule import microbatch_sizes
from orchestrator.worker.subgroups import leave_world
from orchestrator.worker.tied import TiedGradients, copy_initial_weights, tied_copies

# The config, result and preflight live in worker/engine_config.py and the layer-state moves in
# worker/layer_states.py; callers import them from here as before.
__all__ = [
    "DataConfig",
    "EngineConfig",
    "StageEngine",
    "StepResult",
    "build_layers",
    "preflight",
]

log = logging.getLogger(__name__)


class StageEngine(LayerStates):
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
        self.stretcher = Stretcher(config.slowdown_factor, _shared_references(config, self.spec))
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
                self.config.plan,
                self.sharding,
                self.layers,
                lambda: self._activations,
                self.stretcher.aside,
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
        updated = self.stretcher.run(self._update, self._sync, key=self._update_key())
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
            collective_s=self.stretcher.aside_s,
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

    def _update_key(self) -> tuple[str, tuple[int, ...]]:
        """The update's reference key: the sizes of what this rank steps (its slices, when it
        shards), so ranks sharing reference times share them only for the same work."""
        slices = self.sharding.slice_numels if self.sharding is not None else ()
        return ("update", slices)

    def _grads(self) -> list[torch.Tensor | None]:
        return [p.grad for layer in self.layers.values() for p in layer.parameters()]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

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


def _shared_references(config: EngineConfig, spec: topology.RankSpec) -> SharedReferences | None:
    """Where a rank shares its reference CPU times with this host's other ranks running the
    same work (``SharedReferences``): the same model, layers, place in the pipeline, precision,
    optimizer and sharding level and group (microbatch sizes are in the keys, a sharded rank's
    slice sizes in its update's key). A stage's holders that shard it run the same forward and
    backward (under the layer-by-layer levels, the same compute between the same collectives),
    so they learn the device's speed together: learned alone, each of four ranks that computed
    in lockstep on two cores kept its own least time, up to 10% apart, and the slowest one set
    the step. Not for tensor-parallel ranks, whose work depends on their shard of each layer."""
    if spec.tp != 1:
        return None
    group = [list(g.sharded) for g in topology.shard_groups(config.plan) if spec.rank in g.sharded]
    signature = [
        config.model_factory,
        config.model_kwargs,
        list(spec.layers),
        spec.is_first_stage,
        spec.is_last_stage,
        config.precision,
        config.optimizer,
        config.overlap_grad_reduce,
        spec.sharding.value,
        group,
    ]
    return SharedReferences.for_work(json.dumps(signature, sort_keys=True, default=str))
