"""Your own ``nn.Module`` as a layered model: a stack of blocks.

A module with ``embed`` (token ids -> hidden states), ``blocks`` (an ``nn.ModuleList`` of
hidden -> hidden), ``head`` (hidden -> logits) and ``loss(logits, targets)`` (the mean over the
microbatch) becomes a :class:`~orchestrator.worker.model_api.LayeredModel` whose planner layers
are ``embed``, each block and ``head``::

    model:
      stack: my_model:build        # a function returning the module (a file in the working dir)
      sequence_length: 64
      vocab_size: 256
      kwargs: {width: 128}         # passed to build

The module is built once per worker under ``init_seed`` (so every plan starts from the same
weights) and each planner layer is a copy of its piece; models too large for one process belong
in a Hugging Face folder or a hand-written factory, which build only a stage's own layers.
The planner's shape (:func:`stack_model_spec`) comes from counting each piece's parameters and
one measured forward of ``embed`` (the width of what crosses a stage boundary); the profiler
(``orchestrator profile``) measures the times.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from orchestrator.errors import SpecError
from orchestrator.spec.devices import Dtype
from orchestrator.spec.model import ModelSpec
from orchestrator.worker.model_api import load_factory

REQUIRED = ("embed", "blocks", "head", "loss")
STACK_FACTORY = "orchestrator.models.stack:make_stack_model"


class StackModel:
    """A :class:`~orchestrator.worker.model_api.LayeredModel` over a user's stack module."""

    def __init__(
        self,
        build: str,
        sequence_length: int,
        vocab_size: int,
        name: str | None = None,
        init_seed: int = 0,
        build_kwargs: dict[str, Any] | None = None,
    ) -> None:
        factory = load_factory(build, field="model.stack")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            module = factory(**(build_kwargs or {}))
        missing = [a for a in REQUIRED if not hasattr(module, a)]
        if not isinstance(module, nn.Module) or missing:
            raise SpecError(
                f"{build!r} returned {type(module).__name__} without {', '.join(missing)}",
                field="model.stack",
                fix="return an nn.Module with embed, blocks (nn.ModuleList), head and loss",
            )
        if not isinstance(module.blocks, nn.ModuleList) or len(module.blocks) == 0:
            raise SpecError(
                f"{build!r}: blocks must be a non-empty nn.ModuleList",
                field="model.stack",
                fix="keep the blocks in an nn.ModuleList",
            )
        self.module = module
        self.name = name or build.partition(":")[2]
        self.sequence_length = sequence_length
        self.vocab_size = vocab_size
        with torch.no_grad():
            sample = module.embed(torch.zeros(1, sequence_length, dtype=torch.long))
        self._boundary = tuple(sample.shape[1:])
        self._dtype = sample.dtype

    @property
    def num_planner_layers(self) -> int:
        return len(self.module.blocks) + 2

    def piece(self, index: int) -> nn.Module:
        """The module's own piece for planner layer ``index`` (not a copy)."""
        if index == 0:
            return self.module.embed  # type: ignore[no-any-return]
        if index == self.num_planner_layers - 1:
            return self.module.head  # type: ignore[no-any-return]
        return self.module.blocks[index - 1]  # type: ignore[no-any-return]

    def build_layer(self, index: int) -> nn.Module:
        return copy.deepcopy(self.piece(index))

    def boundary_shape(self, batch_size: int) -> tuple[int, ...]:
        return (batch_size, *self._boundary)

    @property
    def boundary_dtype(self) -> torch.dtype:
        return self._dtype

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.module.loss(output, targets)  # type: ignore[no-any-return]


def make_stack_model(
    module: str,
    sequence_length: int,
    vocab_size: int,
    name: str | None = None,
    init_seed: int = 0,
    build_kwargs: dict[str, Any] | None = None,
    **_shape: Any,
) -> StackModel:
    """Model factory: ``orchestrator.models.stack:make_stack_model`` with ``module`` (the
    ``"file:function"`` that builds the stack); the job's other shape fields are ignored."""
    return StackModel(module, sequence_length, vocab_size, name, init_seed, build_kwargs)


def stack_model_spec(model: StackModel) -> ModelSpec:
    """The planner's shape: counted parameters per planner layer, the measured boundary width."""
    counts = [
        sum(p.numel() for p in model.piece(i).parameters()) for i in range(model.num_planner_layers)
    ]
    hidden = int(model._boundary[-1])
    return ModelSpec(
        name=model.name,
        num_layers=model.num_planner_layers - 2,
        hidden_size=hidden,
        num_heads=1,
        sequence_length=model.sequence_length,
        vocab_size=model.vocab_size,
        dtype=Dtype.FP32,
        layer_param_counts=counts,
    )


def measured_shape(
    build: str, sequence_length: int, vocab_size: int, build_kwargs: dict[str, Any]
) -> ModelSpec:
    """Build the stack once and measure its planner shape (for the job spec's ``stack`` form)."""
    model = StackModel(build, sequence_length, vocab_size, build_kwargs=build_kwargs)
    return stack_model_spec(model)
