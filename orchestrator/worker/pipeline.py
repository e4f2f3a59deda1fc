"""Executes a stage's schedule: forwards, backwards and the point-to-point traffic between them.

Written out rather than with ``torch.distributed.pipelining``: the plan's replicas have different
stage boundaries and batch shares and all-reduce in custom per-layer groups, and every rank here
already knows its neighbours, its microbatch sizes and the shapes that cross each boundary; an
explicit runner is short and states those facts directly.

The order of compute and transfers is ``p2p_order.stage_program`` (data, replayed by the tests
against a transport where a send blocks until its receive is posted); each exchange runs as one
``batch_isend_irecv`` (``p2p.py``). Activations come from ``prev_rank`` and go forward to
``next_ranks``; gradients come from ``next_rank`` and go back to ``prev_ranks`` (several ranks when
a neighbour stage is tensor parallel: each of its positions gets the activation whole), on the
world group, in the compute dtype of the precision policy.

No device synchronisation per microbatch, except when emulating a device's speed or profiling
(``sync_each``): the stretch and the profiler need each piece's finished time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from orchestrator.worker.emulation import Stretcher
from orchestrator.worker.memory_account import ActivationAccount
from orchestrator.worker.model_api import LayeredModel
from orchestrator.worker.p2p import run_exchange
from orchestrator.worker.p2p_order import CommOp, Compute, Payload, stage_program
from orchestrator.worker.precision import Precision, PrecisionPolicy
from orchestrator.worker.schedule import FORWARD
from orchestrator.worker.topology import RankSpec


@dataclass
class _InFlight:
    """One microbatch between its forward and its backward."""

    input: torch.Tensor | None  # received activation (requires grad); None on the first stage
    output: torch.Tensor  # weighted loss on the last stage, else the activation sent on


@dataclass
class PipelineRunner:
    """Runs one step's schedule for one stage."""

    spec: RankSpec
    layers: list[nn.Module]
    model: LayeredModel
    device: torch.device
    stretcher: Stretcher
    policy: PrecisionPolicy | None = None  # None: fp32
    sync_each: bool = False  # synchronise the device after each piece (emulation, profiling)
    # Counts the activations each microbatch saves for backward (worker/memory_account.py).
    activations: ActivationAccount | None = None

    def __post_init__(self) -> None:
        if self.policy is None:
            self.policy = PrecisionPolicy(Precision.FP32, self.device.type)
        self._boundary_dtype = self.policy.boundary_dtype(self.model.boundary_dtype)

    def run(
        self,
        schedule: str,
        sizes: Sequence[int],
        weights: Sequence[float],
        inputs: torch.Tensor | None,
        targets: torch.Tensor | None,
        loss_scale: float = 1.0,
    ) -> float | None:
        """Forward and backward every microbatch; return the weighted loss on the last stage.

        ``loss_scale`` multiplies the loss before backward (fp16); the returned loss is unscaled.
        """
        spec = self.spec
        assert self.policy is not None
        input_chunks = _split(inputs, sizes)
        target_chunks = _split(targets, sizes)
        in_flight: dict[int, _InFlight] = {}
        if self.activations is not None:
            self.activations.reset()
        received: dict[tuple[Payload, int], torch.Tensor] = {}
        outgoing: dict[tuple[Payload, int], torch.Tensor] = {}
        loss_total = 0.0

        def buffer_for(op: CommOp) -> torch.Tensor:
            shape = self.model.boundary_shape(sizes[op.microbatch])
            return torch.empty(shape, dtype=self._boundary_dtype, device=self.device)

        program = stage_program(schedule, len(sizes), spec.stage, spec.num_stages)
        # One autocast region for the whole step: each weight is cast once, not per microbatch.
        with self.policy.autocast():
            for instr in program:
                if not isinstance(instr, Compute):
                    received.update(
                        run_exchange(
                            instr,
                            spec.prev_rank,
                            spec.next_rank,
                            lambda op: outgoing.pop((op.payload, op.microbatch)),
                            buffer_for,
                            # several when the neighbour stage is tensor parallel
                            prev_sends=spec.prev_ranks,
                            next_sends=spec.next_ranks,
                        )
                    )
                    continue
                kind, mb = instr.action
                if kind == FORWARD:
                    state = self._forward(
                        mb, sizes[mb], input_chunks, target_chunks, weights[mb], received
                    )
                    in_flight[mb] = state
                    if spec.is_last_stage:
                        loss_total += float(state.output.detach())
                    else:
                        outgoing[(Payload.ACTIVATION, mb)] = state.output.detach().to(
                            self._boundary_dtype
                        )
                else:
                    state = in_flight.pop(mb)
                    self._backward(state, mb, sizes[mb], received, loss_scale)
                    if state.input is not None:
                        assert state.input.grad is not None, "stage input received no gradient"
                        outgoing[(Payload.GRADIENT, mb)] = state.input.grad
        assert not outgoing and not received, "a transfer of the step was left unmatched"
        return loss_total if spec.is_last_stage else None

    def _forward(
        self,
        mb: int,
        size: int,
        input_chunks: list[torch.Tensor] | None,
        target_chunks: list[torch.Tensor] | None,
        weight: float,
        received: dict[tuple[Payload, int], torch.Tensor],
    ) -> _InFlight:
        recv_input: torch.Tensor | None = None
        if self.spec.is_first_stage:
            assert input_chunks is not None
            x = input_chunks[mb]
        else:
            recv_input = received.pop((Payload.ACTIVATION, mb)).requires_grad_(True)
            x = recv_input

        def compute() -> torch.Tensor:
            out = x
            for layer in self.layers:
                out = layer(out)
            if self.spec.is_last_stage:
                assert target_chunks is not None
                out = self.model.loss(out, target_chunks[mb]).float() * weight
            return out

        if self.activations is None:
            output = self.stretcher.run(compute, self._sync_piece, key=("forward", size))
        else:
            with self.activations.saving(mb):
                output = self.stretcher.run(compute, self._sync_piece, key=("forward", size))
        return _InFlight(input=recv_input, output=output)

    def _backward(
        self,
        state: _InFlight,
        mb: int,
        size: int,
        received: dict[tuple[Payload, int], torch.Tensor],
        loss_scale: float,
    ) -> None:
        assert self.policy is not None
        if self.spec.is_last_stage:
            loss = state.output if loss_scale == 1.0 else state.output * loss_scale

            def backward() -> None:
                with self.policy.no_autocast():  # type: ignore[union-attr]
                    loss.backward()

        else:
            grad = received.pop((Payload.GRADIENT, mb)).to(state.output.dtype)

            def backward() -> None:
                with self.policy.no_autocast():  # type: ignore[union-attr]
                    state.output.backward(grad)

        self.stretcher.run(backward, self._sync_piece, key=("backward", size))
        if self.activations is not None:
            self.activations.release(mb)

    @property
    def _sync_piece(self) -> Callable[[], None] | None:
        return self._sync if self.sync_each else None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _split(batch: torch.Tensor | None, sizes: Sequence[int]) -> list[torch.Tensor] | None:
    return None if batch is None else list(torch.split(batch, list(sizes)))
