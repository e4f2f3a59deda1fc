"""Executes a stage's schedule: forwards, backwards and the point-to-point traffic between them.

Written out with ``dist.isend``/``dist.irecv`` rather than ``torch.distributed.pipelining``: the
plan's replicas have different stage boundaries and batch shares and all-reduce in custom
per-layer groups, and every rank here already knows its neighbours, its microbatch sizes and the
shapes that cross each boundary; an explicit runner is short and states those facts directly.

Activations go forward to ``next_rank``, gradients back to ``prev_rank``, on the world group.
Between one pair of ranks each direction carries its messages in schedule order, which both
sides agree on, so the default tag is enough.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.worker.emulation import Stretcher
from orchestrator.worker.model_api import LayeredModel
from orchestrator.worker.schedule import FORWARD, actions_for
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
    _pending: list[tuple[dist.Work, torch.Tensor]] = field(default_factory=list)

    def run(
        self,
        schedule: str,
        sizes: Sequence[int],
        weights: Sequence[float],
        inputs: torch.Tensor | None,
        targets: torch.Tensor | None,
    ) -> float | None:
        """Forward and backward every microbatch; return the weighted loss on the last stage."""
        spec = self.spec
        input_chunks = _split(inputs, sizes)
        target_chunks = _split(targets, sizes)
        in_flight: dict[int, _InFlight] = {}
        loss_total = 0.0
        for kind, mb in actions_for(schedule, len(sizes), spec.stage, spec.num_stages):
            if kind == FORWARD:
                state = self._forward(mb, sizes[mb], input_chunks, target_chunks, weights[mb])
                in_flight[mb] = state
                if spec.is_last_stage:
                    loss_total += float(state.output.detach())
            else:
                self._backward(in_flight.pop(mb), sizes[mb])
        self._drain()
        return loss_total if spec.is_last_stage else None

    def _forward(
        self,
        mb: int,
        size: int,
        input_chunks: list[torch.Tensor] | None,
        target_chunks: list[torch.Tensor] | None,
        weight: float,
    ) -> _InFlight:
        received: torch.Tensor | None = None
        if self.spec.is_first_stage:
            assert input_chunks is not None
            x = input_chunks[mb]
        else:
            received = self._recv(self.spec.prev_rank, size).requires_grad_(True)
            x = received

        def compute() -> torch.Tensor:
            out = x
            for layer in self.layers:
                out = layer(out)
            if self.spec.is_last_stage:
                assert target_chunks is not None
                out = self.model.loss(out, target_chunks[mb]) * weight
            return out

        output = self.stretcher.run(compute, self._sync, key=("forward", size))
        if not self.spec.is_last_stage:
            for dst in self.spec.next_ranks:  # several when the next stage is tensor parallel
                self._send(output.detach(), dst)
        return _InFlight(input=received, output=output)

    def _backward(self, state: _InFlight, size: int) -> None:
        if self.spec.is_last_stage:
            self.stretcher.run(state.output.backward, self._sync, key=("backward", size))
        else:
            grad = self._recv(self.spec.next_rank, size)
            self.stretcher.run(
                lambda: state.output.backward(grad), self._sync, key=("backward", size)
            )
        if state.input is not None:
            assert state.input.grad is not None, "stage input received no gradient"
            for dst in self.spec.prev_ranks:
                self._send(state.input.grad, dst)

    def _recv(self, src: int | None, size: int) -> torch.Tensor:
        assert src is not None
        shape = self.model.boundary_shape(size)
        buf = torch.empty(shape, dtype=self.model.boundary_dtype, device=self.device)
        dist.irecv(buf, src=src).wait()
        return buf

    def _send(self, tensor: torch.Tensor, dst: int | None) -> None:
        assert dst is not None
        # Keep the tensor alive until the send completes.
        tensor = tensor.contiguous()
        self._pending.append((dist.isend(tensor, dst=dst), tensor))

    def _drain(self) -> None:
        for work, _tensor in self._pending:
            work.wait()
        self._pending.clear()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _split(batch: torch.Tensor | None, sizes: Sequence[int]) -> list[torch.Tensor] | None:
    return None if batch is None else list(torch.split(batch, list(sizes)))
