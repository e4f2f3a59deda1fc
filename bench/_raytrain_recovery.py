"""Ray Train v2 elastic data parallel on a running local cluster; the recovery benchmark's baseline.

Run as its own driver process (``python bench/_raytrain_recovery.py --address ... --progress F``)
so the benchmark's main process stays free to crash and add nodes from its main thread.

``TorchTrainer`` with ``ScalingConfig(num_workers=(min, max))`` and ``FailureConfig``, the tool
people use today: every worker builds the same GPT (same per-layer seeds as ours), reads its slice
of step ``k``'s global batch, all-reduces one flat gradient (gloo) and steps Adam. Rank 0 saves a
checkpoint (model, optimizer, step) every ``--checkpoint-interval`` steps through
``ray.train.report``; after a failure Ray Train restarts the whole worker group and the loop
resumes from ``ray.train.get_checkpoint()``.

Rank 0 appends ``<committed steps> <wall time> <world size> <group id>`` to the progress file
after every step (a new id per worker-group start), so the benchmark reads when each step
completed, which group ran it, and from where training resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any


def _train_loop(config: dict[str, Any]) -> None:
    import uuid

    import ray
    import torch
    import torch.distributed as dist
    from ray import train

    from orchestrator.worker.data import DataConfig, make_dataset
    from orchestrator.worker.emulation import SharedReferences, Stretcher, parse_speed
    from orchestrator.worker.layers import build_layers
    from orchestrator.worker.model_api import build_model
    from orchestrator.worker.optim import make_optimizer

    torch.set_num_threads(1)
    group = uuid.uuid4().hex[:8]  # tells this worker group's steps from the previous group's
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model = build_model(config["model_factory"], config["model_kwargs"])
    num_layers = model.num_planner_layers
    layers = build_layers(model, range(num_layers), config["seed"], torch.device("cpu"))
    net = torch.nn.Sequential(*[layers[i] for i in sorted(layers)])
    params = list(net.parameters())
    optimizer = make_optimizer("adam", params, config["learning_rate"])
    start_step = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as path:
            saved = torch.load(os.path.join(path, "state.pt"), weights_only=False)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start_step = int(saved["step"])
    dataset = make_dataset(DataConfig(sequence_length=config["sequence_length"]), config["seed"])
    gbs = config["global_batch_size"]
    lo, hi = gbs * rank // world, gbs * (rank + 1) // world
    speed = parse_speed(ray.get_runtime_context().get_node_labels())
    # Where the benchmark asks for it, the workers running the same share of the same model on
    # this host share its reference CPU times (orchestrator/worker/emulation.py), as ours do.
    work = json.dumps([config["model_factory"], config["model_kwargs"], hi - lo], sort_keys=True)
    stretcher = Stretcher(
        config["fastest_speed"] / speed if speed else 1.0, SharedReferences.for_work(work)
    )

    def fwd_bwd(x: torch.Tensor, y: torch.Tensor) -> None:
        # Weighted by this worker's share so the all-reduced sum is the global-batch mean.
        (model.loss(net(x), y) * ((hi - lo) / gbs)).backward()

    for step in range(start_step, config["steps"]):
        x, y = dataset.batch(step, gbs, lo, hi - lo)
        optimizer.zero_grad(set_to_none=False)
        stretcher.run(lambda x=x, y=y: fwd_bwd(x, y), key="forward+backward")
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        stretcher.run(optimizer.step, key="update")
        done = step + 1
        if rank == 0:
            with open(config["progress_path"], "a") as f:
                f.write(f"{done} {time.time():.6f} {world} {group}\n")
        if done % config["checkpoint_interval"] == 0 or done == config["steps"]:
            _report(done, net, optimizer, rank)


def _report(done: int, net: Any, optimizer: Any, rank: int) -> None:
    import torch
    from ray import train

    if rank != 0:
        train.report({"step": done}, checkpoint=None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": done}
        torch.save(state, os.path.join(tmp, "state.pt"))
        train.report({"step": done}, checkpoint=train.Checkpoint.from_directory(tmp))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import cloudpickle
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(address=args.address, log_to_driver=False)
    # bench/ is no package the workers can import: ship the training loop by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config = json.loads(args.config)
    config.update(progress_path=args.progress, checkpoint_interval=args.checkpoint_interval)
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config=config,
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(
            num_workers=(args.min_workers, args.max_workers),
            use_gpu=False,
            resources_per_worker={"CPU": 1},
        ),
        run_config=RunConfig(
            name=f"recovery-{time.time_ns()}",
            storage_path=args.storage,
            failure_config=FailureConfig(max_failures=args.max_failures),
        ),
    )
    started = time.time()
    result = trainer.fit()
    return {"ok": result.error is None, "wall_s": time.time() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--config", required=True, help="JSON: model, data, steps, batch")
    parser.add_argument("--checkpoint-interval", type=int, required=True)
    parser.add_argument("--min-workers", type=int, required=True)
    parser.add_argument("--max-workers", type=int, required=True)
    parser.add_argument("--max-failures", type=int, default=3, help="FailureConfig's budget")
    parser.add_argument("--result", required=True, help="where to write the JSON result")
    args = parser.parse_args()
    result = run(args)
    with open(args.result, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
