"""Build a user's stack module on the ``meta`` device and materialize one piece at a time.

Constructing the module under ``torch.device("meta")`` allocates no memory and draws no random
numbers. A piece (the embedding, one block, the head) then becomes real by ``to_empty`` on the
CPU and a call of every ``reset_parameters`` (or ``_reset_parameters``) of its modules, children
before parents, under the random state the caller seeded: the order in which an eager
construction runs them, so such a piece equals the same piece constructed eagerly under that
seed (torch's own layers, and blocks that initialise their own parameters in
``reset_parameters``).

That is only faithful when construction put nothing else into the tensors, so the construction
is watched (a ``TorchFunctionMode``): any value-producing factory (``torch.randn``, ``ones``,
``arange``, ``tensor`` ...) or in-place write (``normal_``, ``fill_``, ``copy_`` ...) made outside
a ``reset_parameters`` method, a parameter or buffer of a module without one, or a tensor created
off the meta device makes the module unsafe, and the caller builds it whole instead.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

RESET_METHODS = ("reset_parameters", "_reset_parameters")
# Factories whose result holds values (lost on the meta device); torch.empty* holds none.
VALUE_FACTORIES = frozenset(
    {
        torch.zeros,
        torch.ones,
        torch.full,
        torch.rand,
        torch.randn,
        torch.randint,
        torch.randperm,
        torch.normal,
        torch.arange,
        torch.linspace,
        torch.logspace,
        torch.eye,
        torch.tensor,
        torch.as_tensor,
        torch.from_numpy,
        torch.zeros_like,
        torch.ones_like,
        torch.full_like,
        torch.rand_like,
        torch.randn_like,
        torch.randint_like,
    }
)
# In-place methods that change no values.
HARMLESS_IN_PLACE = frozenset({"requires_grad_", "share_memory_", "retain_grad_"})
MAX_FRAMES = 64  # how far up a call looks for a reset_parameters frame


def _inside_reset() -> bool:
    frame = sys._getframe(2)
    for _ in range(MAX_FRAMES):
        if frame is None:
            return False
        if frame.f_code.co_name in RESET_METHODS:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _caller() -> str:
    """``Class.method (file.py:line)`` of the first frame outside torch."""
    torch_root = str(Path(torch.__file__).parent)
    for info in inspect.stack()[2:]:
        if not info.filename.startswith(torch_root) and info.filename != __file__:
            owner = info.frame.f_locals.get("self")
            where = (
                f"{type(owner).__name__}.{info.function}" if owner is not None else info.function
            )
            return f"{where} ({Path(info.filename).name}:{info.lineno})"
    return "construction"


def _writes_values(func: Callable[..., Any]) -> bool:
    if func in VALUE_FACTORIES:
        return True
    name = getattr(func, "__name__", "")
    if name == "__setitem__":
        return True
    return name.endswith("_") and not name.startswith("__") and name not in HARMLESS_IN_PLACE


class ConstructionWatch(TorchFunctionMode):
    """Records value writes made outside ``reset_parameters`` while a module is constructed."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if not self.reasons and _writes_values(func) and not _inside_reset():
            short = getattr(func, "__name__", str(func))
            name = f"torch.{short}" if func in VALUE_FACTORIES else f"Tensor.{short}"
            self.reasons.append(f"{_caller()} calls {name} outside reset_parameters")
        return func(*args, **(kwargs or {}))


def build_on_meta(factory: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[Any, str | None]:
    """``factory(**kwargs)`` constructed on the meta device, and why it cannot be materialized
    piece by piece (None when it can; the pieces are checked by :func:`unsafe_pieces`)."""
    watch = ConstructionWatch()
    try:
        with torch.device("meta"), watch:
            module = factory(**kwargs)
    except Exception as exc:  # e.g. a value read back (.item()) during construction
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return None, f"constructing it on the meta device failed ({type(exc).__name__}: {first})"
    return module, (watch.reasons[0] if watch.reasons else None)


def _reset_method(module: nn.Module) -> Callable[[], Any] | None:
    for name in RESET_METHODS:
        method = getattr(module, name, None)
        if callable(method):
            return method  # type: ignore[no-any-return]
    return None


def unsafe_pieces(pieces: list[nn.Module]) -> str | None:
    """Why some piece's (planner layer's) tensors would not all be set by its modules' resets;
    None when they all are."""
    for index, piece in enumerate(pieces):
        for name, module in piece.named_modules():
            own = [
                *module.named_parameters(recurse=False),
                *module.named_buffers(recurse=False),
            ]
            for tensor_name, tensor in own:
                path = f"{name}.{tensor_name}" if name else tensor_name
                label = f"{path} ({type(module).__name__}) of planner layer {index}"
                if tensor.device.type != "meta":
                    return f"{label} was created on {tensor.device}, not under the meta device"
                if _reset_method(module) is None:
                    return f"{label} belongs to a module without reset_parameters"
    return None


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def materialize(meta_piece: nn.Module) -> nn.Module:
    """A real CPU copy of a meta piece, initialised by its modules' resets, children first,
    under the caller's random state."""
    import copy

    piece = copy.deepcopy(meta_piece).to_empty(device="cpu")
    with torch.no_grad():
        for module in _post_order(piece):
            reset = _reset_method(module)
            if reset is not None:
                reset()
    return piece
