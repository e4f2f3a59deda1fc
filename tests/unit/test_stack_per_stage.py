"""The stack form builds only a stage's pieces: the module is constructed on the meta device and
each piece is materialized by its modules' reset_parameters, equal to the same piece constructed
eagerly under the same seed; modules whose construction writes values elsewhere are built whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from orchestrator.models.stack import StackModel, stack_model_spec

HERE = Path(__file__).parent
EXAMPLE = HERE.parents[1] / "examples" / "own-model"


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(HERE))


def _equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_example_is_built_per_stage_as_an_eager_build_would() -> None:
    import my_model

    model = StackModel("my_model:build", 32, 256)
    assert model.per_stage, model.whole_reason
    assert {p.device.type for p in model.module.parameters()} == {"meta"}  # nothing allocated
    eager = {
        0: lambda: nn.Embedding(256, 64),
        2: lambda: my_model.MixerBlock(64, 32),
        5: lambda: nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256)),
    }
    for index, construct in eager.items():
        torch.manual_seed(11 + index)
        built = model.build_layer(index)
        torch.manual_seed(11 + index)
        assert _equal(built, construct()), index
        assert all(p.device.type == "cpu" for p in built.parameters())
    # The shape is still counted from the (meta) pieces and measured by one forward.
    spec = stack_model_spec(model)
    assert spec.total_params == sum(p.numel() for p in my_model.build().parameters())
    assert model.boundary_shape(3) == (3, 32, 64)


def test_a_safe_stack_of_torch_layers_and_own_resets() -> None:
    import stack_modules

    model = StackModel("stack_modules:safe", 4, 32)
    assert model.per_stage
    torch.manual_seed(3)
    built = model.build_layer(1)
    torch.manual_seed(3)
    w = 8
    assert _equal(built, nn.Sequential(nn.Linear(w, w), stack_modules.Scale(w), nn.GELU()))
    assert float(built[1].gain.detach().min()) >= 0.5  # its own reset ran, not left uninitialised


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        ("eager_randn", "EagerRandn.__init__ (stack_modules.py:"),
        ("eager_randn", "calls torch.randn outside reset_parameters"),
        ("buffer_in_init", "calls torch.arange"),
        ("no_reset", "w (NoReset) of planner layer 1 belongs to a module without reset_parameters"),
        ("init_loop", "calls Tensor.normal_ outside reset_parameters"),
    ],
)
def test_other_modules_are_built_whole_and_say_why(build: str, reason: str) -> None:
    model = StackModel(f"stack_modules:{build}", 4, 32, init_seed=5)
    assert not model.per_stage
    assert reason in (model.whole_reason or "")
    assert {p.device.type for p in model.module.parameters()} == {"cpu"}
    # Whole: every layer is a copy of the module's piece, built under init_seed.
    import stack_modules

    torch.manual_seed(5)
    whole = getattr(stack_modules, build)()
    for i in range(model.num_planner_layers):
        assert _equal(model.build_layer(i), model.piece(i))
    if build != "no_reset":  # torch.empty without an init: uninitialised in any build
        assert _equal(model.build_layer(1), whole.blocks[0])
