"""Where an emulated rank's compute departs from its per-layer profile, term by term (one process).

For the runtime benchmark's model (bench/runtime_emulated.py: 8-block byte GPT, hidden 128,
sequence 64, fp32, Adam) at one microbatch size, the least thread CPU time of:

- each stage's forward + backward as the profiler times it: layer by layer, back to back
  (``worker/profiler.py``), summed over the stage's layers: what the cost model adds up;
- the stage as one call, back to back;
- the stage as one call through the emulation's ``Stretcher`` at the stage's factor, as a rank
  runs it (each call padded to ``factor x`` its least CPU time by sleeping);

and, for a sharded holder's update over ``k`` holders: the profiled per-layer optimizer steps
over ``k`` (what the cost model charges), the optimizer step on the holder's flat slice (what
the engine runs, stretched), and the CPU of gathering the updated slices into the whole
parameters (not stretched: communication).

Run: .venv/bin/python bench/emulated_stage_calls.py [--microbatch 4] [--repeats 31]
Everything is measured on this host's CPU; the stretched figures are emulated.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch

from orchestrator.worker.data import DataConfig, make_dataset
from orchestrator.worker.emulation import Stretcher
from orchestrator.worker.engine import build_layers
from orchestrator.worker.model_api import build_model
from orchestrator.worker.optim import make_optimizer

SHAPE = {
    "name": "gpt-bench",
    "num_layers": 8,
    "hidden_size": 128,
    "num_heads": 4,
    "sequence_length": 64,
    "vocab_size": 256,
    "dtype": "fp32",
}
# (first layer, end, emulated factor): the stages of the runtime benchmark's planned plan, an
# A100-80 replica (speed 0.25: 4x) and the two stages of a T4 pipeline (0.0625: 16x).
STAGES = ((0, 10, 4.0), (0, 5, 16.0), (5, 10, 16.0))


def least_cpu_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return min(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a worker runs
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    model = build_model("orchestrator.models.gpt:make_gpt", dict(SHAPE))
    layers = build_layers(model, range(model.num_planner_layers), 0, torch.device("cpu"))
    mb = args.microbatch
    inputs, targets = make_dataset(DataConfig(sequence_length=64), 0).batch(0, mb, 0, mb)
    last = model.num_planner_layers - 1

    def stage_cpu_s(group: list[int], stretcher: Stretcher | None, repeats: int) -> float:
        """Least CPU of the group's forward + backward as one call each."""
        grad = None if group[-1] == last else torch.ones(model.boundary_shape(mb))
        fs, bs = [], []
        for _ in range(repeats + 1):
            if group[0] == 0:
                x = inputs
            else:
                with torch.no_grad():
                    x = layers[0](inputs).detach().requires_grad_(True)

            def forward(x: torch.Tensor = x) -> torch.Tensor:
                out = x
                for i in group:
                    out = layers[i](out)
                return model.loss(out, targets) if group[-1] == last else out

            start = time.thread_time()
            out = stretcher.run(forward, key="f") if stretcher else forward()
            mid = time.thread_time()
            if stretcher:
                stretcher.run(lambda out=out: out.backward(grad), key="b")
            else:
                out.backward(grad)
            fs.append(mid - start)
            bs.append(time.thread_time() - mid)
            for i in group:
                layers[i].zero_grad(set_to_none=True)
        if stretcher is not None:
            return (stretcher.reference_cpu_s("f") or 0.0) + (stretcher.reference_cpu_s("b") or 0.0)
        return min(fs[1:]) + min(bs[1:])

    print(f"forward + backward, microbatch {mb}, least thread CPU ms (ratio to the layers' sum)")
    for lo, hi, factor in STAGES:
        layers_s = sum(stage_cpu_s([i], None, args.repeats) for i in range(lo, hi))
        call_s = stage_cpu_s(list(range(lo, hi)), None, args.repeats)
        # fewer repeats when stretched: each lasts factor x its CPU time
        stretched_s = stage_cpu_s(
            list(range(lo, hi)), Stretcher(factor), max(8, int(args.repeats * 4 / factor))
        )
        print(
            f"  layers [{lo},{hi}): layers' sum {layers_s * 1e3:.2f}, one call"
            f" {call_s * 1e3:.2f} ({call_s / layers_s:.3f}), one call stretched x{factor:g}"
            f" {stretched_s * 1e3:.2f} ({stretched_s / layers_s:.3f})"
        )
    print("sharded update over k = 4 holders, least thread CPU ms")
    for lo, hi, _ in STAGES[1:]:
        params = [p for i in range(lo, hi) for p in layers[i].parameters()]
        optimizers = []
        for i in range(lo, hi):
            for p in layers[i].parameters():
                p.grad = torch.randn_like(p)
            optimizers.append(make_optimizer("adam", layers[i].parameters(), 1e-6))
        per_layer_s = sum(least_cpu_s(o.step, args.repeats) for o in optimizers)
        numel = sum(p.numel() for p in params)
        k = 4
        bounds = [(numel * j // k, numel * (j + 1) // k) for j in range(k)]
        mine = torch.zeros(bounds[0][1] - bounds[0][0], requires_grad=True)
        mine.grad = torch.randn_like(mine)
        slice_s = least_cpu_s(make_optimizer("adam", [mine], 1e-6).step, args.repeats)
        others = [torch.randn(b - a) for a, b in bounds[1:]]

        def gather(
            mine: torch.Tensor = mine,
            others: list[torch.Tensor] = others,
            params: list[torch.nn.Parameter] = params,
        ) -> None:  # worker/sharding.py ShardedState._gather + the copy back
            flat = torch.cat([mine.detach().clone(), *others])
            offset = 0
            with torch.no_grad():
                for p in params:
                    p.copy_(flat[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()

        gather_s = least_cpu_s(gather, args.repeats)
        print(
            f"  layers [{lo},{hi}) ({numel / 1e6:.2f} M parameters): per-layer steps / k"
            f" {per_layer_s / k * 1e3:.2f}, step on the slice {slice_s * 1e3:.2f},"
            f" gather {gather_s * 1e3:.2f}"
        )
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
