"""The layered-model protocol: how users bring their own model.

A model is a sequence of *planner layers* with the planner's indices: 0 is the embedding,
``1..N`` the blocks and ``N + 1`` the head. The engine builds only the layers of its stage, so a
model never has to exist whole in one process. A job names a factory by import path
(``"package.module:function"``); the factory takes keyword arguments from the job spec and returns
a :class:`LayeredModel`.

Contract, so that any plan computes the same update as single-process training:

- ``build_layer(i)`` is deterministic given the torch RNG state; the engine seeds the RNG per
  layer (``seed + i``) before calling it, so every partition initialises layer ``i`` alike.
- layer 0 takes the input batch (e.g. token ids) and every later layer takes the previous layer's
  output; the output of every layer but the last has shape ``boundary_shape(batch)`` and dtype
  ``boundary_dtype`` (what crosses a stage boundary).
- ``loss(output, targets)`` is the *mean* loss over the samples of one microbatch; the engine
  weights it by ``microbatch_size / global_batch_size``.
- no randomness in forward, or the engine cannot reproduce it across plans; dropout is allowed
  through ``orchestrator.worker.dropout.seeded_forward`` (seeded per step, layer and sample).
- optionally ``tied_parameters``: groups of ``(planner layer, parameter name)`` that are one
  weight (a tied LM head); the engine keeps the copies equal (``orchestrator.worker.tied``).

Tensor parallel (optional): a model that can run a stage on several devices also defines
``tensor_parallel_plan(index) -> {submodule name: "colwise" | "rowwise"}`` for planner layer
``index`` (what ``torch.distributed.tensor.parallel`` should split; unnamed modules stay
replicated, and the layer must give the same result whether split or not), and may define
``check_tensor_parallel(tp)`` raising :class:`SpecError` for a degree it cannot take. Its forward
must accept the split (e.g. count attention heads from the local projection width). Models
without ``tensor_parallel_plan`` run at tp 1 only.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from orchestrator.errors import SpecError

if TYPE_CHECKING:
    import torch
    from torch import nn


@runtime_checkable
class LayeredModel(Protocol):
    """A model the engine can cut into pipeline stages at any planner-layer boundary."""

    name: str

    @property
    def num_planner_layers(self) -> int:
        """Embedding + blocks + head."""
        ...

    def build_layer(self, index: int) -> nn.Module:
        """A fresh module for planner layer ``index`` (parameters in fp32)."""
        ...

    def boundary_shape(self, batch_size: int) -> tuple[int, ...]:
        """Shape of the tensor that leaves any non-final layer, for ``batch_size`` samples."""
        ...

    @property
    def boundary_dtype(self) -> torch.dtype:
        """Dtype of that tensor."""
        ...

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss over the microbatch's samples."""
        ...


def load_factory(path: str, field: str = "model.factory") -> Callable[..., Any]:
    """Import ``"package.module:function"``; a :class:`SpecError` names what failed."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise SpecError(
            f"model factory {path!r} is not of the form 'package.module:function'",
            field=field,
            fix="write e.g. orchestrator.models.gpt:make_gpt",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(
            f"cannot import module {module_name!r} of model factory {path!r}: {exc}",
            field=field,
            fix="check the module path and that it is on PYTHONPATH (or in the working dir)",
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise SpecError(
            f"module {module_name!r} has no callable {attr!r}",
            field=field,
            fix=f"define {attr}(**kwargs) in {module_name} or fix the name",
        )
    return factory  # type: ignore[no-any-return]


def build_model(factory_path: str, kwargs: dict[str, Any]) -> LayeredModel:
    """Call the factory and check that it returned a :class:`LayeredModel`."""
    factory = load_factory(factory_path)
    try:
        model = factory(**_accepted(factory, kwargs))
    except TypeError as exc:
        raise SpecError(
            f"model factory {factory_path!r} rejected its arguments {sorted(kwargs)}: {exc}",
            field="model.kwargs",
            fix="pass the keyword arguments the factory takes",
        ) from None
    if not isinstance(model, LayeredModel):
        raise SpecError(
            f"model factory {factory_path!r} returned {type(model).__name__}, which lacks the "
            "LayeredModel methods (num_planner_layers, build_layer, boundary_shape, "
            "boundary_dtype, loss)",
            field="model.factory",
            fix="return an object implementing orchestrator.worker.model_api.LayeredModel",
        )
    return model


def _accepted(factory: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` less the model-shape fields at their default that ``factory`` does not take.

    The runtime passes every shape field to the factory; a factory written before the shape
    gained a field (gated MLPs, norms, ...) keeps working as long as the job leaves that field at
    its default. A non-default value it does not take still fails, naming the argument.
    """
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: pass everything
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params}
    from orchestrator.spec.model import shape_defaults

    defaults = shape_defaults()
    return {k: v for k, v in kwargs.items() if k in names or k not in defaults or v != defaults[k]}


def check_layer_count(model: LayeredModel, plan_num_layers: int) -> None:
    """Raise :class:`SpecError` when the model and the plan disagree on the layer count."""
    if model.num_planner_layers != plan_num_layers:
        raise SpecError(
            f"the plan covers {plan_num_layers} planner layers but model {model.name!r} has "
            f"{model.num_planner_layers} (blocks + 2: embedding, head)",
            field="plan.replicas[].stages[].layers",
            fix="re-plan for this model with `orchestrator plan`",
        )
