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

Each worker builds only its stage's pieces when the module allows it
(:mod:`orchestrator.models.stack_meta`): the module is constructed on the ``meta`` device (no
memory) and a piece becomes real by its modules' ``reset_parameters`` under the engine's seed for
that planner layer. A module whose construction writes values elsewhere (``torch.randn`` in
``__init__``, a custom init loop, a buffer computed in ``__init__``) is built whole once per worker
under ``init_seed`` instead, each planner layer a copy of its piece, and the log says why.
The planner's shape (:func:`stack_model_spec`) comes from counting each piece's parameters and
one measured forward of ``embed`` (the width of what crosses a stage boundary); the profiler
(``orchestrator profile``) measures the times.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from torch import nn

from orchestrator.errors import SpecError
from orchestrator.models.stack_meta import build_on_meta, materialize, unsafe_pieces
from orchestrator.spec.devices import Dtype
from orchestrator.spec.model import ModelSpec
from orchestrator.worker.model_api import load_factory

logger = logging.getLogger(__name__)

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
        module, self.whole_reason = build_on_meta(factory, dict(build_kwargs or {}))
        if self.whole_reason is None:
            self._check(module, build)
            self.whole_reason = unsafe_pieces(
                [stack_piece(module, i) for i in self._indices(module)]
            )
        if self.whole_reason is not None:
            logger.info("stack %s is built whole in every worker: %s", build, self.whole_reason)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(init_seed)
                module = factory(**(build_kwargs or {}))
            self._check(module, build)
        self.module = module
        self.name = name or build.partition(":")[2]
        self.sequence_length = sequence_length
        self.vocab_size = vocab_size
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            embed = self.build_layer(0)
            sample = embed(torch.zeros(1, sequence_length, dtype=torch.long))
        self._boundary = tuple(sample.shape[1:])
        self._dtype: torch.dtype = sample.dtype

    @property
    def per_stage(self) -> bool:
        """True when a worker materializes only the pieces it builds (the module is on meta)."""
        return self.whole_reason is None

    @staticmethod
    def _indices(module: nn.Module) -> range:
        return range(len(module.blocks) + 2)  # type: ignore[arg-type]

    @staticmethod
    def _check(module: Any, build: str) -> None:
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

    @property
    def num_planner_layers(self) -> int:
        return len(self.module.blocks) + 2

    def piece(self, index: int) -> nn.Module:
        """The module's own piece for planner layer ``index`` (not a copy; on ``meta`` when
        :attr:`per_stage`)."""
        return stack_piece(self.module, index)

    def build_layer(self, index: int) -> nn.Module:
        if self.per_stage:
            return materialize(self.piece(index))
        return copy.deepcopy(self.piece(index))

    def boundary_shape(self, batch_size: int) -> tuple[int, ...]:
        return (batch_size, *self._boundary)

    @property
    def boundary_dtype(self) -> torch.dtype:
        return self._dtype

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.module.loss(output, targets)  # type: ignore[no-any-return]


def stack_piece(module: nn.Module, index: int) -> nn.Module:
    """Planner layer ``index`` of a stack module: ``embed``, a block, or ``head``."""
    blocks: Any = module.blocks
    if index == 0:
        return module.embed  # type: ignore[return-value]
    if index == len(blocks) + 1:
        return module.head  # type: ignore[return-value]
    return blocks[index - 1]  # type: ignore[no-any-return]


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
