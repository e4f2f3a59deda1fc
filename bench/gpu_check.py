"""Checks and measurements that need a real GPU (run on a CUDA machine; prints figures).

1. Emulation stays off on a real GPU: an emulated-speed label gives factor 1.0, and asking the
   profiler or the engine to stretch time on CUDA is refused.
2. The profiler measures the example GPT on the GPU and writes the planner's profile format.
3. The cost model's FLOP-based estimate for this GPU type against those measurements.
4. The engine trains on CUDA with the NCCL backend (one rank, one stage) and its parameters after
   a few steps match single-process fp32 training on the CPU.
5. The example GPT (0.5B) trains in bf16 (autocast over fp32 masters) and in fp32 on CUDA:
   measured step time and peak memory (``torch.cuda.max_memory_allocated`` plus the CUDA
   context) against the cost model's prediction for the same plan, with the profile of step 2
   giving the measured layer times the prediction is built from; and in bf16 with activation
   recompute on its blocks (``recompute: true`` on the stage): the step costs each block's forward
   again, the peak drops to the blocks' inputs plus one block recomputing, both against the cost
   model's recompute terms.

Run: python bench/gpu_check.py --device-type H200 --out DIR  (e.g. DIR=bench/results)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from orchestrator.costmodel import CostTables
from orchestrator.errors import SpecError
from orchestrator.spec import ClusterSpec, ModelSpec, Plan, ProfileSet, TrainingSpec
from orchestrator.worker.data import DataConfig
from orchestrator.worker.emulation import slowdown_factor
from orchestrator.worker.engine import EngineConfig, StageEngine
from orchestrator.worker.profiler import ProfileRequest, profile, write_profile
from orchestrator.worker.reference import ReferenceTrainer

FACTORY = "orchestrator.models.gpt:make_gpt"
# A 0.5B-parameter GPT in fp32: 8 blocks of hidden 2048 at sequence length 1024.
SHAPE = {
    "num_layers": 8,
    "hidden_size": 2048,
    "num_heads": 16,
    "sequence_length": 1024,
    "vocab_size": 256,
    "name": "gpt-2048x8",
}
# (precision, activation recompute) rows of check 5.
VARIANTS = (("fp32", False), ("bf16", False), ("bf16", True))
SMALL = {"num_layers": 3, "hidden_size": 64, "num_heads": 4, "sequence_length": 32}


def check_emulation_off() -> None:
    assert slowdown_factor(0.25, 1.0, gpu_present=True) == 1.0
    request = ProfileRequest(
        FACTORY, SMALL, "H200", (1,), DataConfig(sequence_length=32), slowdown_factor=4.0
    )
    try:
        profile(request, torch.device("cuda"))
    except SpecError as exc:
        print(f"emulation refused on CUDA, as it must be: {exc}")
    else:
        raise AssertionError("the profiler stretched time on a real GPU")


def profile_gpu(device_type: str, out: Path, device: str = "cuda") -> Path:
    request = ProfileRequest(
        FACTORY,
        SHAPE,
        device_type,
        (1, 2, 4, 8),
        DataConfig(sequence_length=1024),
        warmup=3,
        repeats=7,
    )
    started = time.perf_counter()
    result = profile(request, torch.device(device))
    path = out / f"profile-{device_type}.json"
    write_profile(result, path)
    print(
        f"profiled {SHAPE['name']} on {device} in "
        f"{time.perf_counter() - started:.1f} s -> {path.name}"
    )
    return path


def compare_with_cost_model(device_type: str, path: Path) -> None:
    spec = ModelSpec(dtype="fp32", **{k: v for k, v in SHAPE.items()})
    training = TrainingSpec(global_batch_size=8, microbatch_sizes=[1, 2, 4, 8])
    cluster = ClusterSpec(
        node_groups=[
            {"name": "g", "device_type": device_type, "num_nodes": 1, "devices_per_node": 1}
        ]
    ).resolve()
    analytic = CostTables.for_cluster(spec, training, cluster)
    measured = CostTables.for_cluster(spec, training, cluster, ProfileSet.load([path]))
    print(
        f"{'mbs':>4} {'block fwd+bwd measured ms':>26} {'estimated ms':>13} {'est/meas':>9} "
        f"{'achieved TFLOP/s':>17} {'update ms meas/est':>19}"
    )
    from orchestrator.costmodel.compute import BACKWARD_TO_FORWARD_FLOPS, forward_flops_per_sample

    for mbs in (1, 2, 4, 8):
        m = measured.table(device_type, mbs, 1)
        a = analytic.table(device_type, mbs, 1)
        meas_s, est_s = m.compute_s(1, 2), a.compute_s(1, 2)
        flops = forward_flops_per_sample(spec, 1) * mbs * (1 + BACKWARD_TO_FORWARD_FLOPS)
        print(
            f"{mbs:>4} {meas_s * 1e3:>26.3f} {est_s * 1e3:>13.3f} {est_s / meas_s:>9.2f} "
            f"{flops / meas_s / 1e12:>17.1f} "
            f"{m.update_s(1, 2) * 1e3:>9.3f}/{a.update_s(1, 2) * 1e3:.3f}"
        )


def train_on_cuda() -> None:
    plan = Plan.model_validate(
        {
            "global_batch_size": 8,
            "microbatch_size": 2,
            "replicas": [{"batch_size": 8, "stages": [{"layers": [0, 5], "device_type": "H200"}]}],
        }
    )
    data = DataConfig(sequence_length=32)
    engine = StageEngine(
        EngineConfig(
            model_factory=FACTORY,
            model_kwargs=dict(SMALL),
            plan=plan,
            rank=0,
            data=data,
            learning_rate=1e-3,
        )
    )
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine.setup("127.0.0.1", port, world_size=1)
    backend = torch.distributed.get_backend()
    losses = [engine.train_step(step).loss for step in range(5)]
    states = engine.get_layer_states()
    engine.shutdown()
    ref = ReferenceTrainer(FACTORY, dict(SMALL), data, 8, learning_rate=1e-3)
    ref_losses = [ref.train_step(step) for step in range(5)]
    worst = 0.0
    for layer, params in ref.layer_params().items():
        got = states[layer]["params"]
        diff = torch.cat([(got[k].cpu() - params[k]).reshape(-1) for k in sorted(params)])
        base = torch.cat([params[k].reshape(-1) for k in sorted(params)])
        worst = max(worst, float(diff.norm() / base.norm()))
    print(
        f"engine on CUDA, backend {backend}: losses {[round(x, 4) for x in losses]}; "
        f"CPU reference {[round(x, 4) for x in ref_losses]}; worst layer relative error {worst:.2e}"
    )


def cuda_context_bytes() -> int:
    """Device memory in use that the caching allocator does not account for (the CUDA context,
    cuBLAS/cuDNN workspaces): what ``nvidia-smi`` shows beyond ``memory_reserved``."""
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return int(total - free - torch.cuda.memory_reserved())


def train_precision_vs_prediction(
    device_type: str,
    precision: str,
    profile_path: Path | None,
    steps: int = 8,
    recompute: bool = False,
) -> dict[str, float | str | bool]:
    """Train SHAPE on one GPU in ``precision`` (``recompute``: activation recompute on the
    blocks); measured vs predicted step time and peak."""
    from orchestrator.costmodel import estimate_plan

    gbs, mbs = 8, 2
    plan = Plan.model_validate(
        {
            "global_batch_size": gbs,
            "microbatch_size": mbs,
            "replicas": [
                {
                    "batch_size": gbs,
                    "stages": [
                        {
                            "layers": [0, SHAPE["num_layers"] + 2],
                            "device_type": device_type,
                            "recompute": recompute,
                        }
                    ],
                }
            ],
        }
    )
    spec = ModelSpec(dtype="bf16" if precision == "bf16" else "fp32", **dict(SHAPE))
    training = TrainingSpec(global_batch_size=gbs, microbatch_sizes=[mbs], precision=precision)
    cluster = ClusterSpec(
        node_groups=[
            {"name": "g", "device_type": device_type, "num_nodes": 1, "devices_per_node": 1}
        ]
    ).resolve()
    profiles = ProfileSet.load([profile_path]) if profile_path is not None else None
    predicted = estimate_plan(plan, cluster, spec, training, profiles)
    kwargs = {k: v for k, v in SHAPE.items() if k != "name"}
    engine = StageEngine(
        EngineConfig(
            model_factory=FACTORY,
            model_kwargs=kwargs,
            plan=plan,
            rank=0,
            data=DataConfig(sequence_length=int(SHAPE["sequence_length"])),
            learning_rate=1e-4,
            precision=precision,
        )
    )
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine.setup("127.0.0.1", port, world_size=1)
    cuda = engine.device.type == "cuda"
    step_s: list[float] = []
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for step in range(steps):
            start = time.perf_counter()
            engine.train_step(step)
            if cuda:
                torch.cuda.synchronize()
            step_s.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() + cuda_context_bytes() if cuda else float("nan")
    finally:
        engine.shutdown()
    measured_s = sorted(step_s[2:])[len(step_s[2:]) // 2]  # median after two warm-up steps
    row: dict[str, float | str | bool] = {
        "precision": precision,
        "recompute": recompute,
        "step_s_measured": measured_s,
        "step_s_predicted": predicted.step_time_s,
        "peak_bytes_measured": peak,
        "peak_bytes_predicted": predicted.peak_memory_bytes,
    }
    label = f"{precision}{' + recompute' if recompute else ''}"
    print(
        f"{label:>15}: step {measured_s * 1e3:.1f} ms measured vs "
        f"{predicted.step_time_s * 1e3:.1f} ms predicted "
        f"({predicted.step_time_s / measured_s:.2f}x); peak "
        f"{peak / 2**30:.2f} GiB measured (max_memory_allocated + CUDA context) vs "
        f"{predicted.peak_memory_bytes / 2**30:.2f} GiB predicted "
        f"({predicted.peak_memory_bytes / peak:.2f}x)"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device-type", default="H200")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--dry-run-on-cpu", action="store_true", help="smoke-test this script")
    args = parser.parse_args()
    if args.dry_run_on_cpu:
        SHAPE.update(num_layers=1, hidden_size=64, num_heads=4, sequence_length=1024)
        train_on_cuda()
        path = profile_gpu(args.device_type, args.out, "cpu")
        compare_with_cost_model(args.device_type, path)
        SHAPE.update(sequence_length=64)
        for precision, recompute in VARIANTS:
            train_precision_vs_prediction(args.device_type, precision, None, 3, recompute)
        return
    assert torch.cuda.is_available(), "this check needs a CUDA GPU"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    check_emulation_off()
    train_on_cuda()
    path = profile_gpu(args.device_type, args.out)
    compare_with_cost_model(args.device_type, path)
    rows = [
        train_precision_vs_prediction(args.device_type, p, path, recompute=r) for p, r in VARIANTS
    ]
    (args.out / f"gpu_precision-{args.device_type}.json").write_text(json.dumps(rows, indent=2))
    print(json.dumps({"ok": True}))


if __name__ == "__main__":
    main()
