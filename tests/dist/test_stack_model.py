"""Your own nn.Module (examples/own-model): the stack adapter computes the module's own loss and
gradients, the planner's shape is counted and measured, and a pipeline plan trains exactly as
single-process training does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_cases import layer_relative_errors, make_plan

from orchestrator.errors import SpecError
from orchestrator.models.stack import StackModel, stack_model_spec, stack_piece
from orchestrator.spec.job import JobSpec
from orchestrator.runtime.jobs import load_job
from orchestrator.worker.data import DataConfig
from orchestrator.worker.engine import EngineConfig
from orchestrator.worker.layers import build_layers
from orchestrator.worker.local import run_local
from orchestrator.worker.recipe import OptimizerRecipe
from orchestrator.worker.reference import ReferenceTrainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-model"
SEQ = 32


@pytest.fixture(autouse=True)
def _example_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))


def test_adapter_equals_the_module(tmp_path: Path) -> None:
    model = StackModel("my_model:build", SEQ, 256, build_kwargs={"depth": 3})
    layers = build_layers(model, range(model.num_planner_layers), 0, torch.device("cpu"))
    ids = torch.randint(0, 256, (2, SEQ + 1))
    out = ids[:, :-1]
    for i in range(model.num_planner_layers):
        out = layers[i](out)
    loss = model.loss(out, ids[:, 1:])
    loss.backward()
    # The module itself, whole and eager, holding the layers' weights.
    import my_model

    whole = my_model.build(depth=3)
    for i in range(model.num_planner_layers):
        stack_piece(whole, i).load_state_dict(layers[i].state_dict())
    ref = whole.loss(whole(ids[:, :-1]), ids[:, 1:])
    ref.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
    for i in range(model.num_planner_layers):
        for (name, p), q in zip(
            layers[i].named_parameters(), stack_piece(whole, i).parameters(), strict=True
        ):
            assert torch.allclose(p.grad, q.grad, atol=1e-7), (i, name)
    assert model.boundary_shape(5) == (5, SEQ, 64)


def test_shape_is_counted_and_the_job_form_measures_it(tmp_path: Path) -> None:
    model = StackModel("my_model:build", SEQ, 256)
    spec = stack_model_spec(model)
    assert spec.total_params == sum(p.numel() for p in model.module.parameters())  # on meta
    assert (spec.num_layers, spec.hidden_size) == (4, 64)
    job_file = tmp_path / "job.yaml"
    job_file.write_text((EXAMPLE / "job.yaml").read_text())
    job = load_job(job_file)
    assert job.model.shape.layer_param_counts == spec.layer_param_counts
    job_file.write_text("name: x\nmodel: {stack: my_model:nothing, sequence_length: 8}\ndata: {}\n")
    with pytest.raises(SpecError, match="vocab_size"):
        load_job(job_file)


@pytest.mark.slow  # 3 ranks, 2 steps: ~20 s on an idle 2-core machine
def test_pipeline_plan_equals_single_process() -> None:
    factory = "orchestrator.models.stack:make_stack_model"
    kwargs = {"module": "my_model:build", "sequence_length": SEQ, "vocab_size": 256}
    # 6 planner layers: embed, 4 blocks, head; two stages in one replica, a whole model in another
    plan = make_plan([(4, [((0, 2), "A100"), ((2, 6), "A100")]), (2, [((0, 6), "A100")])])
    recipe = OptimizerRecipe(name="adamw", learning_rate=3e-3, weight_decay=0.1, grad_clip_norm=0.5)
    data = DataConfig(sequence_length=SEQ)
    config = EngineConfig(
        model_factory=factory, model_kwargs=kwargs, plan=plan, rank=0, data=data, recipe=recipe
    )
    run = run_local(config, range(2), {})
    ref = ReferenceTrainer(factory, kwargs, data, plan.global_batch_size, recipe=recipe)
    for step in range(2):
        ref.train_step(step)
    errors = layer_relative_errors(run.layer_states, ref.layer_params())
    assert max(errors.values()) <= 1e-5, errors
