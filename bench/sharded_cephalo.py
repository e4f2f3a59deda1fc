"""Cephalo's own example, costed by our model: GPT-2.7B, sequence 512, fp16, one each of L4, L4,
A6000 and P40 (one GPU per node), global batch 64, the Cephalo profiles shipped with the package.

Compares, on the same cost model: our planner without the sharded data-parallel candidate
(pipelines only, ``SearchConfig(sharded=False)``), our planner's default search (with it), and
Cephalo's split (every GPU a whole replica, batches [13, 12, 34, 5], training state sharded) at
each sharding level and microbatch size. Prints step time, memory per GPU against capacity,
and GPUs used.

Run: .venv/bin/python bench/sharded_cephalo.py
"""

from __future__ import annotations

from orchestrator.costmodel import estimate_plan
from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.profiles.builtin import builtin_model, builtin_profiles
from orchestrator.spec import ClusterSpec, Dtype, Plan, TrainingSpec

GiB = 1024**3
DEVICES = ["L4", "L4", "A6000", "P40"]
CEPHALO_SPLIT = [13, 12, 34, 5]


def main() -> None:
    model = builtin_model("GPT-2.7B-s512").model_copy(update={"dtype": Dtype.FP16})
    cluster = ClusterSpec(
        node_groups=[
            {"name": f"n{i}-{d.lower()}", "device_type": d, "num_nodes": 1, "devices_per_node": 1}
            for i, d in enumerate(DEVICES)
        ]
    ).resolve()
    training = TrainingSpec(global_batch_size=64, microbatch_sizes=[1, 2, 4, 8])
    profiles = builtin_profiles("GPT-2.7B-s512")

    before = make_plan(cluster, model, training, profiles, SearchConfig(sharded=False))
    after = make_plan(cluster, model, training, profiles)  # the default search
    print(f"{'plan':<50} {'step s':>8} {'GPUs':>5} {'fits':>5}  memory GiB / capacity")
    for name, result in (("ours, pipelines only (before)", before), ("ours (after)", after)):
        est = result.estimate
        mem = " ".join(
            f"{d.device_type}:{d.memory_bytes / GiB:.1f}/{d.memory_capacity_bytes / GiB:.1f}"
            for d in est.devices
        )
        print(f"{name:<50} {est.step_time_s:>8.2f} {result.plan.num_devices:>5} {'yes':>5}  {mem}")
        for r in result.plan.replicas:
            stages = ", ".join(
                f"{s.device_type}[{s.layers[0]},{s.layers[1]}) {s.sharding.value}" for s in r.stages
            )
            print(f"{'':<4}batch {r.batch_size:>3}: {stages}")
        for line in result.choices:
            print(f"{'':<4}{line}")
    layers = model.num_planner_layers
    nodes = [n.name for n in cluster.nodes]
    best = None
    for level in ("none", "optimizer", "gradients", "full"):
        for mbs in (1, 2, 4):
            plan = Plan(
                global_batch_size=64,
                microbatch_size=mbs,
                replicas=[
                    {
                        "batch_size": b,
                        "stages": [
                            {"layers": [0, layers], "device_type": d, "node": n, "sharding": level}
                        ],
                    }
                    for b, d, n in zip(CEPHALO_SPLIT, DEVICES, nodes, strict=True)
                ],
            )
            est = estimate_plan(plan, cluster, model, training, profiles)
            mem = " ".join(f"{d.memory_bytes / GiB:.1f}" for d in est.devices)
            label = f"Cephalo split, sharding {level}, microbatch {mbs}"
            fits = "yes" if est.fits else "no"
            print(f"{label:<50} {est.step_time_s:>8.2f} {4:>5} {fits:>5}  {mem}")
            if est.fits and (best is None or est.step_time_s < best):
                best = est.step_time_s
    if best is not None:
        print(
            f"ours / best fitting Cephalo split: {after.estimate.step_time_s / best:.2f}x "
            f"(<= 1 is at least as fast); before: {before.estimate.step_time_s / best:.2f}x"
        )


if __name__ == "__main__":
    main()
