"""Validation loss through the plan: forward only, under ``torch.no_grad``, nothing changed.

The validation set of an evaluation is ``eval_batches`` global batches of held-out windows
(``data.validation_fraction``): sample ``b * global_batch_size + p`` of it is held-out window
``b * global_batch_size + p`` (wrapping around the split), the same set at every evaluation so
successive losses compare. Like training, each replica takes its share of each batch
(``replica_sample_offset``, ``replica_batch_size``) and splits it into the plan's microbatches;
the microbatches flow forward through the replica's stages over the pipeline's point-to-point
machinery (``p2p_order.paired_program`` of forward actions only, each exchange one
``batch_isend_irecv``), so a stage sends activation ``j`` and receives ``j + 1`` together.

The last stage returns its replica's weighted share: microbatch ``j`` of size ``m_j`` counts
``loss_j * m_j / (eval_batches * global_batch_size)``; the replicas' shares add up to the mean
loss over the whole validation set, as the training loss's do.

Layers run in eval mode (no dropout) and are put back in training mode after; no gradient is
made, no optimizer stepped and no data position advanced, so training after an evaluation is
exactly training without it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from orchestrator.errors import SpecError
from orchestrator.worker.model_api import LayeredModel
from orchestrator.worker.p2p import run_exchange
from orchestrator.worker.p2p_order import CommOp, Compute, Payload, paired_program
from orchestrator.worker.precision import PrecisionPolicy
from orchestrator.worker.schedule import FORWARD, microbatch_sizes
from orchestrator.worker.topology import RankSpec


@runtime_checkable
class ValidationData(Protocol):
    """A dataset with a held-out split (token files, saved Hugging Face datasets)."""

    def validation_batch(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]: ...


def check_validation_data(dataset: object) -> ValidationData:
    """The dataset, if it holds out a validation split; otherwise one clear error."""
    if not isinstance(dataset, ValidationData):
        raise SpecError(
            f"training.eval_every needs a held-out split, and {type(dataset).__name__} has none",
            field="data.validation_fraction",
            fix="use data.tokens or data.hf_dataset with validation_fraction above 0",
        )
    return dataset


def is_eval_step(step: int, eval_every: int) -> bool:
    """Evaluate after step ``step``'s update when ``step + 1`` is a multiple of ``eval_every``."""
    return eval_every > 0 and (step + 1) % eval_every == 0


@contextmanager
def eval_mode(layers: Sequence[nn.Module]) -> Iterator[None]:
    """Layers in eval mode (dropout off), each put back as it was."""
    modes = [layer.training for layer in layers]
    for layer in layers:
        layer.eval()
    try:
        yield
    finally:
        for layer, mode in zip(layers, modes, strict=True):
            layer.train(mode)


def validation_loss(
    spec: RankSpec,
    layers: Sequence[nn.Module],
    model: LayeredModel,
    dataset: ValidationData | None,
    global_batch_size: int,
    microbatch_size: int,
    eval_batches: int,
    device: torch.device,
    policy: PrecisionPolicy,
) -> float | None:
    """This replica's weighted share of the validation loss (last stage; None elsewhere).

    Every rank of the plan calls it at the same point (each stage exchanges with its neighbours).
    """
    sizes = microbatch_sizes(spec.replica_batch_size, microbatch_size)
    total_samples = eval_batches * global_batch_size
    boundary_dtype = policy.boundary_dtype(model.boundary_dtype)
    actions = [(FORWARD, j) for j in range(len(sizes))]
    program = paired_program(actions, spec.stage, spec.num_stages)
    share = 0.0
    # Empty again after each batch (every activation sent is received in the same batch).
    received: dict[tuple[Payload, int], torch.Tensor] = {}
    outgoing: dict[tuple[Payload, int], torch.Tensor] = {}

    def buffer_for(op: CommOp) -> torch.Tensor:
        shape = model.boundary_shape(sizes[op.microbatch])
        return torch.empty(shape, dtype=boundary_dtype, device=device)

    with torch.no_grad(), eval_mode(layers), policy.autocast():
        for b in range(eval_batches):
            inputs, targets = _share(dataset, spec, b * global_batch_size, device)
            input_chunks = None if inputs is None else torch.split(inputs, list(sizes))
            target_chunks = None if targets is None else torch.split(targets, list(sizes))

            for instr in program:
                if not isinstance(instr, Compute):
                    received.update(
                        run_exchange(
                            instr,
                            spec.prev_rank,
                            spec.next_rank,
                            lambda op: outgoing.pop((op.payload, op.microbatch)),
                            buffer_for,
                            prev_sends=spec.prev_ranks,
                            next_sends=spec.next_ranks,
                        )
                    )
                    continue
                _, mb = instr.action
                if spec.is_first_stage:
                    assert input_chunks is not None
                    out = input_chunks[mb]
                else:
                    out = received.pop((Payload.ACTIVATION, mb))
                for layer in layers:
                    out = layer(out)
                if spec.is_last_stage:
                    assert target_chunks is not None
                    loss = model.loss(out, target_chunks[mb]).float()
                    share += float(loss) * sizes[mb] / total_samples
                else:
                    outgoing[(Payload.ACTIVATION, mb)] = out.to(boundary_dtype)
            assert not outgoing and not received, "a transfer of the evaluation was left unmatched"
    return share if spec.is_last_stage else None


def _share(
    dataset: ValidationData | None, spec: RankSpec, batch_start: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """This replica's samples of the validation batch starting at held-out window
    ``batch_start``: inputs on the first stage, targets on the last."""
    if dataset is None:
        return None, None
    inputs, targets = dataset.validation_batch(
        batch_start + spec.replica_sample_offset, spec.replica_batch_size
    )
    return (
        inputs.to(device) if spec.is_first_stage else None,
        targets.to(device) if spec.is_last_stage else None,
    )
