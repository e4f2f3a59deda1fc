"""Ours in fp32 / bf16 / bf16 + recompute against Ray Train's TorchTrainer with torch.autocast.

On an emulated cluster (one-CPU Ray nodes labelled A100-80, emulated speed ``--speed``): the same
two-replica data-parallel layout TorchTrainer runs (``ScalingConfig(num_workers=2)``, an equal
share of the batch each), run by

- our runtime from a plan recording its precision (``Plan.precision``; the workers run exactly
  it): fp32, bf16, and bf16 with activation recompute on every stage;
- TorchTrainer, a hand-written loop with ``torch.autocast("cpu", torch.bfloat16)`` around the
  forward and the loss (PyTorch's recipe: backward outside autocast, fp32 parameters), gloo
  all-reduce of the flat gradient, and the same emulated stretch of its compute as ours; and in
  fp32 as the same-run baseline.

Per variant: step time (ours timed at the driver, TorchTrainer inside its workers, which favours
it), throughput, our cost model's step time for the plan, and per rank the memory the rank counted
(``worker/memory_account.py``: weights, gradients, optimizer state, 16-bit weight copies,
activations in flight) against the cost model's terms for the same rank. Predictions use layer
times profiled on this host in the variant's precision (the profiler's measurement run inside
the same autocast the workers use) and stretched by the emulated speed; memory from the cost
model's formulas and the profile's runtime constants. On the CPU, bf16 autocast is no faster
than fp32 (no bf16 matrix units are used here): what this shows is that each precision trains
as planned and costed, not GPU speed-ups (``bench/gpu_check.py`` measures those). TorchTrainer's
memory is not counted (its loop has no memory account). Everything is emulated on CPUs.

Run: .venv/bin/python bench/precision_emulated.py [--steps 6] [--speed 0.5] [--microbatch 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from emulated_cluster import emulated_cluster

from orchestrator.costmodel import CostTables, estimate_plan
from orchestrator.costmodel.memory_terms import memory_terms
from orchestrator.costmodel.precision import costed_inputs
from orchestrator.runtime.actor import WorkerJob
from orchestrator.runtime.discovery import cluster_from_nodes, discover_nodes
from orchestrator.runtime.group import WorkerGroup
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan
from orchestrator.spec.profiles import ProfileFile, ProfileSet
from orchestrator.worker.data import DataConfig
from orchestrator.worker.profiler import ProfileRequest, profile

FACTORY = "orchestrator.models.gpt:make_gpt"
DEVICE = "A100-80"
SHAPE = ModelSpec(
    name="gpt-precision-bench",
    num_layers=4,
    hidden_size=128,
    num_heads=4,
    sequence_length=64,
    vocab_size=256,
    dtype="fp32",
)
# One microbatch per replica by default: each rank computes its share in one forward and
# backward, as each TorchTrainer worker does (--microbatch 4: four 1F1B-free microbatches).
GLOBAL_BATCH, MICROBATCH, WORKERS = 32, 16, 2
VARIANTS = (("fp32", False), ("bf16", False), ("bf16", True))
MiB = 2**20


def shape_kwargs() -> dict[str, Any]:
    return SHAPE.model_dump(mode="json", exclude_none=True)


def bench_job() -> WorkerJob:
    return WorkerJob(
        model_factory=FACTORY,
        model_kwargs=shape_kwargs(),
        data={"sequence_length": SHAPE.sequence_length},
        optimizer="adam",
        learning_rate=1e-3,
    )


def bench_plan(precision: str, recompute: bool) -> Plan:
    """Two whole-model replicas, an equal share each: TorchTrainer's layout."""
    on = {"recompute": True} if recompute else {}
    stage = {"layers": [0, SHAPE.num_planner_layers], "device_type": DEVICE, **on}
    return Plan.model_validate(
        {
            "global_batch_size": GLOBAL_BATCH,
            "microbatch_size": MICROBATCH,
            "precision": precision,
            "replicas": [{"batch_size": GLOBAL_BATCH // WORKERS, "stages": [stage]}] * WORKERS,
        }
    )


def training(precision: str) -> TrainingSpec:
    return TrainingSpec(
        global_batch_size=GLOBAL_BATCH, microbatch_sizes=[MICROBATCH], precision=precision
    )


def profiled(precision: str, slowdown: float) -> ProfileFile:
    """The model's layer times on this host in ``precision`` (the timed runs inside the autocast
    the workers use), stretched as the emulated workers stretch theirs."""
    request = ProfileRequest(
        FACTORY,
        shape_kwargs(),
        DEVICE,
        (MICROBATCH,),
        DataConfig(sequence_length=SHAPE.sequence_length),
        slowdown_factor=slowdown,
        repeats=7,
    )
    if precision == "fp32":
        return profile(request, torch.device("cpu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        timed = profile(request, torch.device("cpu"))
    # Only the times come from the autocast run; the byte fields stay the profiler's own (its
    # fp32 and 16-bit activation counts are each measured in their own format).
    base = profile(request, torch.device("cpu"))
    entries = []
    for fp32_entry, bf16_entry in zip(base.entries, timed.entries, strict=True):
        layers = {
            i: t.model_copy(
                update={
                    "forward_s": bf16_entry.layers[i].forward_s,
                    "backward_s": bf16_entry.layers[i].backward_s,
                    "update_s": bf16_entry.layers[i].update_s,
                }
            )
            for i, t in fp32_entry.layers.items()
        }
        entries.append(fp32_entry.model_copy(update={"layers": layers}))
    return base.model_copy(
        update={"entries": entries, "dtype": precision, "source": base.source + "; bf16 autocast"}
    )


def measure_ours(
    job: WorkerJob, plan: Plan, steps: int, warmup: int = 2
) -> tuple[float, dict[int, Any]]:
    """Mean driver-timed step of ``plan``; the last step's counted memory per rank."""
    group = WorkerGroup(job)
    try:
        group.launch(plan)
        for _ in range(warmup):
            group.step()
        started = time.perf_counter()
        reports = [group.step() for _ in range(steps)]
        elapsed_s = time.perf_counter() - started
        assert group.emulated, "the benchmark cluster is emulated; every worker must say so"
    finally:
        group.stop()
    memory = {t.replica: t.memory for t in reports[-1].stage_timings}
    return elapsed_s / steps, memory


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

    torch.set_num_threads(1)
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model = build_model(config["model_factory"], config["model_kwargs"])
    layers = build_layers(
        model, range(model.num_planner_layers), config["seed"], torch.device("cpu")
    )
    net = torch.nn.Sequential(*[layers[i] for i in sorted(layers)])
    params = list(net.parameters())
    optimizer = make_optimizer(config["optimizer"], params, config["learning_rate"])
    dataset = make_dataset(DataConfig(**config["data"]), config["seed"])
    gbs = config["global_batch_size"]
    local = gbs // world
    speed = parse_speed(ray.get_runtime_context().get_node_labels())
    # Shared with the host's workers on the same work, as ours are (worker/emulation.py).
    work = json.dumps(
        ["ray-train", config["model_factory"], config["model_kwargs"], local, config["precision"]],
        sort_keys=True,
    )
    stretcher = Stretcher(1.0 / speed if speed else 1.0, SharedReferences.for_work(work))
    sixteen = config["precision"] == "bf16"

    def fwd_bwd(x: torch.Tensor, y: torch.Tensor) -> float:
        # PyTorch's mixed-precision recipe: forward and loss under autocast, backward outside.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=sixteen):
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
    return {"step_time_s": sum(measured) / len(measured), "emulated": speed is not None}


def run_torchtrainer(job: WorkerJob, precision: str, steps: int, warmup: int = 2) -> float:
    """TorchTrainer's mean in-worker step time in ``precision`` on ``WORKERS`` workers."""
    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config = {
        "model_factory": job.model_factory,
        "model_kwargs": dict(job.model_kwargs),
        "data": dict(job.data),
        "optimizer": job.optimizer,
        "learning_rate": job.learning_rate,
        "seed": job.seed,
        "global_batch_size": GLOBAL_BATCH,
        "precision": precision,
        "steps": steps,
        "warmup_steps": warmup,
    }
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config=config,
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(
            num_workers=WORKERS, use_gpu=False, resources_per_worker={"CPU": 1}
        ),
        run_config=RunConfig(
            name=f"precision-{time.time_ns()}", storage_path="/tmp/ray-train-bench"
        ),
    )
    metrics = trainer.fit().return_value
    assert metrics["emulated"], "TorchTrainer's workers must run on the emulated nodes"
    return float(metrics["step_time_s"])


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def rounds_of(runs: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[Any]]:
    """Every run once per round, in turn (spreads a shared machine's load over all alike)."""
    out: dict[str, list[Any]] = {name: [] for name in runs}
    for r in range(rounds):
        for name, run in runs.items():
            out[name].append(run())
            step_s = out[name][-1][0] if isinstance(out[name][-1], tuple) else out[name][-1]
            print(f"  round {r + 1}: {name:<26} step {step_s:.4f} s (load {load_average()})")
    return out


def main() -> None:
    global MICROBATCH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--speed", type=float, default=0.5, help="emulated speed of the nodes")
    parser.add_argument("--microbatch", type=int, default=MICROBATCH, help="our plans' microbatch")
    parser.add_argument("--only-ours", action="store_true", help="skip TorchTrainer")
    args = parser.parse_args()
    MICROBATCH = args.microbatch
    torch.set_num_threads(1)  # as the workers run
    job = bench_job()
    slowdown = 1.0 / args.speed
    print(f"load average at start: {load_average()} on {os.cpu_count()} cores")
    print(
        f"emulated: {WORKERS} x {DEVICE} @{args.speed}; GPT {SHAPE.num_layers} blocks, hidden "
        f"{SHAPE.hidden_size}, seq {SHAPE.sequence_length}; batch {GLOBAL_BATCH}, microbatch "
        f"{MICROBATCH}; Adam"
    )
    profiles = {p: ProfileSet([profiled(p, slowdown)]) for p in ("fp32", "bf16")}
    with emulated_cluster([(DEVICE, args.speed, WORKERS)]):
        cluster = cluster_from_nodes(discover_nodes())
        runs: dict[str, Callable[[], Any]] = {}
        predicted: dict[str, tuple[float, dict[int, Any]]] = {}
        for precision, recompute in VARIANTS:
            name = f"ours, {precision}" + (" + recompute" if recompute else "")
            plan = bench_plan(precision, recompute)
            est = estimate_plan(plan, cluster, SHAPE, training(precision), profiles[precision])
            model, costed = costed_inputs(SHAPE, training(precision), plan.precision)
            tables = CostTables.for_cluster(model, costed, cluster, profiles[precision])
            terms = {t.replica: t for t in memory_terms(plan, tables)}
            predicted[name] = (est.step_time_s, terms)
            runs[name] = lambda plan=plan: measure_ours(job, plan, args.steps)
        for precision in () if args.only_ours else ("fp32", "bf16"):
            runs[f"TorchTrainer, {precision}"] = lambda p=precision: run_torchtrainer(
                job, p, args.steps
            )
        results = rounds_of(runs, args.rounds)
    print("\nvariant                     step s  samples/s  predicted s  meas/pred")
    medians = {}
    for name, values in results.items():
        step_s = statistics.median(v[0] if isinstance(v, tuple) else v for v in values)
        medians[name] = step_s
        pred = (
            f"{predicted[name][0]:11.4f}  {step_s / predicted[name][0]:9.3f}"
            if (name in predicted)
            else f"{'-':>11}  {'-':>9}"
        )
        print(f"{name:<26} {step_s:7.4f}  {GLOBAL_BATCH / step_s:9.1f}  {pred}")
    print("\nthroughput ratios (same run)")
    base32 = medians["ours, fp32"]
    for name in predicted:
        print(f"  {name:<26} / ours, fp32: {base32 / medians[name]:.2f}x")
    tt32, tt16 = medians.get("TorchTrainer, fp32"), medians.get("TorchTrainer, bf16")
    for name in predicted if tt32 and tt16 else ():
        base = tt16 if "bf16" in name else tt32
        assert base is not None
        label = "TorchTrainer, bf16" if "bf16" in name else "TorchTrainer, fp32"
        print(f"  {name:<26} / {label}: {base / medians[name]:.2f}x")
    if tt32 and tt16:
        print(f"  TorchTrainer bf16 / TorchTrainer fp32: {tt32 / tt16:.2f}x")
    print("\ncounted memory per rank, last step (MiB; predicted / counted)")
    for name, (_, terms) in predicted.items():
        memory = results[name][-1][1]
        for replica in sorted(memory):
            got, want = memory[replica], terms[replica]
            cells = [
                ("weights", got.weights_bytes, want.weights_bytes),
                ("grads", got.grads_bytes, want.grads_bytes),
                ("optimizer", got.optimizer_bytes, want.optimizer_bytes),
                ("16-bit copies", got.cast_weight_bytes, want.cast_weight_bytes),
                ("activations", got.activations_peak_bytes, want.activations_bytes),
                ("total", got.total_bytes, want.counted_bytes),
            ]
            text = ", ".join(
                f"{n} {c / MiB:.2f}/{p / MiB:.2f}" + (f" ({p / c:.3f})" if c else "")
                for n, c, p in cells
            )
            print(f"  {name:<26} rank {replica}: {text}")
    print("all speeds emulated on CPU")


if __name__ == "__main__":
    main()
