"""Uniform data parallel with Ray Train's TorchTrainer, on the same emulated workers as ours.

This is the tool people use today: ``ScalingConfig(num_workers=N)``, one equal share of the global
batch per worker, gloo all-reduce of the gradients. Each worker builds the same model (same
per-layer seeds), reads the same global batch of step ``k`` and takes its equal slice. A worker on
a node labelled with an emulated speed stretches its compute exactly as ours do (the worker
side's ``Stretcher``: forward+backward and the optimizer update, each measured and stretched by
``fastest speed / node speed``). The gradient all-reduce is one flat tensor, like our engine's and
like DDP's bucket, and stays outside the stretch, as in our engine.

Step times are measured inside the workers (no driver round trip per step), which favours
TorchTrainer over our driver-timed steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BaselineResult:
    step_time_s: float
    num_workers: int
    emulated: bool


def _train_loop(config: dict[str, Any]) -> dict[str, Any]:
    import json

    import ray
    import torch
    import torch.distributed as dist
    from ray import train

    from orchestrator.worker.data import DataConfig, make_dataset
    from orchestrator.worker.emulation import SharedReferences, Stretcher, parse_speed
    from orchestrator.worker.layers import build_layers
    from orchestrator.worker.model_api import build_model
    from orchestrator.worker.optim import make_optimizer

    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model = build_model(config["model_factory"], config["model_kwargs"])
    layers = build_layers(
        model, range(model.num_planner_layers), config["seed"], torch.device("cpu")
    )
    net = torch.nn.Sequential(*[layers[i] for i in sorted(layers)])
    params = [p for p in net.parameters()]
    optimizer = make_optimizer(config["optimizer"], params, config["learning_rate"])
    dataset = make_dataset(DataConfig(**config["data"]), config["seed"])
    gbs = config["global_batch_size"]
    local = gbs // world  # equal batch per worker (the caller picks a divisible batch)
    speed = parse_speed(ray.get_runtime_context().get_node_labels())
    # The workers running the same share of the same model on this host share its reference
    # CPU times (orchestrator/worker/emulation.py), as ours do on the same local cluster.
    work = json.dumps(
        ["ray-train", config["model_factory"], config["model_kwargs"], local], sort_keys=True
    )
    stretcher = Stretcher(
        config["fastest_speed"] / speed if speed else 1.0, SharedReferences.for_work(work)
    )

    def fwd_bwd(x: torch.Tensor, y: torch.Tensor) -> float:
        loss = model.loss(net(x), y)
        loss.backward()
        return float(loss.detach())

    times: list[float] = []
    for step in range(config["warmup_steps"] + config["steps"]):
        started = time.perf_counter()
        x, y = dataset.batch(step, gbs, rank * local, local)
        optimizer.zero_grad(set_to_none=False)
        stretcher.run(lambda x=x, y=y: fwd_bwd(x, y), key="forward+backward")
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        stretcher.run(optimizer.step, key="update")
        times.append(time.perf_counter() - started)
    measured = times[config["warmup_steps"] :]
    # Every worker waits for the slowest in the all-reduce, so all report about the same mean.
    return {"step_time_s": sum(measured) / len(measured), "emulated": speed is not None}


def run_torchtrainer(
    job: Any,
    global_batch_size: int,
    num_workers: int,
    fastest_speed: float,
    steps: int,
    warmup_steps: int = 3,
) -> BaselineResult:
    """Train ``steps`` steps with TorchTrainer on ``num_workers`` one-CPU workers."""
    import sys

    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # bench/ is no package the workers can import: ship the training loop by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config = {
        "model_factory": job.model_factory,
        "model_kwargs": dict(job.model_kwargs),
        "data": dict(job.data),
        "optimizer": job.optimizer,
        "learning_rate": job.learning_rate,
        "seed": job.seed,
        "global_batch_size": global_batch_size,
        "fastest_speed": fastest_speed,
        "steps": steps,
        "warmup_steps": warmup_steps,
    }
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config=config,
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(
            num_workers=num_workers, use_gpu=False, resources_per_worker={"CPU": 1}
        ),
        run_config=RunConfig(
            name=f"baseline-{time.time_ns()}", storage_path="/tmp/ray-train-bench"
        ),
    )
    result = trainer.fit()
    metrics = result.return_value  # rank 0's return value
    return BaselineResult(float(metrics["step_time_s"]), num_workers, bool(metrics["emulated"]))
