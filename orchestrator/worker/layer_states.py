"""Moving a rank's layers in and out by planner layer index: parameters and optimizer state.

Checkpoints and re-plans read each rank's layers with :meth:`LayerStates.get_layer_states` and
load them into the ranks of the next plan with :meth:`LayerStates.set_layer_states`, whatever the
two plans' partitions, tensor-parallel degrees and sharding.
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.errors import SpecError
from orchestrator.worker import tensor_parallel
from orchestrator.worker.precision import LossScaling, attach_loss_scale, restore_loss_scale
from orchestrator.worker.sharding import ShardedState
from orchestrator.worker.topology import RankSpec


class LayerStates:
    """The layer-state export and import of :class:`~.engine.StageEngine` (its attributes below)."""

    spec: RankSpec
    layers: dict[int, torch.nn.Module]
    optimizers: dict[int, torch.optim.Optimizer]
    scaling: LossScaling | None
    sharding: ShardedState | None

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


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj
