"""What the demo does: the emulated cluster, the job, and when a node crashes and one joins.

The job is the example GPT (``orchestrator.models.gpt``, byte-level, on the corpus shipped in the
package) planned by the planner from profiles measured on the emulated device types. The timeline
is in committed steps: a node of the fastest type is crashed (SIGKILL) at ``crash_at_step``, a new
node joins at ``join_at_step``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.demo.cluster import NodeKind
from orchestrator.errors import UserError

A100 = NodeKind("A100-80", 1.0)
T4 = NodeKind("T4", 0.2)
# The joiner brings two devices, so the switch pays well within the demo's few minutes.
L4_X2 = NodeKind("L4", 0.5, num_devices=2)

# Below this many steps there is no room for a crash, its recovery and a join with steps between.
MIN_STEPS = 30
# 200 steps of 48 samples: the same samples as 300 of 32.
DEFAULT_STEPS = 200


@dataclass(frozen=True)
class DemoScenario:
    """The cluster at the start, the node that joins, the run's length and its events."""

    steps: int = DEFAULT_STEPS
    seed: int = 0
    failure: bool = True
    # One fast node and three slow ones: the first plan gives the A100 the largest share and each
    # T4 a smaller one (uniform shares would let the T4s set the step), and the crash of the
    # A100 leaves T4 replicas that still hold every layer.
    start: tuple[NodeKind, ...] = (A100, T4, T4, T4)
    joiner: NodeKind = L4_X2
    checkpoint_interval_steps: int = 25

    def __post_init__(self) -> None:
        if self.steps < MIN_STEPS:
            raise UserError(
                f"--steps {self.steps} leaves no room for a crash, a recovery and a join",
                field="--steps",
                fix=f"pass --steps {MIN_STEPS} or more",
            )
        if self.seed < 0:
            raise UserError(f"--seed {self.seed} is negative", field="--seed", fix="pass 0 or more")

    @property
    def crash_at_step(self) -> int | None:
        """The crash comes after 15% of the steps (None: ``--no-failure``)."""
        return self.steps * 15 // 100 if self.failure else None

    @property
    def join_at_step(self) -> int:
        """The join comes at 25% of the steps.

        Enough steps must be left for the switch to pay with a wide margin: at 200 steps 150
        remain, and the predicted gain over them (the T4s alone, after the crash, against the T4s
        with the two L4s) is many times the measured switch cost (5-6 s). With fewer steps left
        the controller rightly keeps the old plan.
        """
        return self.steps * 25 // 100

    @property
    def crash_device_type(self) -> str:
        """The crash hits the fastest type: every good plan uses it."""
        return max(self.start, key=lambda k: k.emulated_speed).device_type

    def all_kinds(self) -> list[NodeKind]:
        """Every device type the run will see (profiled before training)."""
        seen: dict[str, NodeKind] = {}
        for kind in (*self.start, self.joiner):
            seen.setdefault(kind.device_type, kind)
        return list(seen.values())


def demo_job(scenario: DemoScenario) -> dict[str, Any]:
    """The job spec (docs/job.md) the demo trains: the example GPT, planned elastically."""
    return {
        "name": "demo",
        "model": {
            "factory": "orchestrator.models.gpt:make_gpt",
            "shape": {
                "name": "gpt-demo",
                "num_layers": 4,
                "hidden_size": 128,
                "num_heads": 4,
                "sequence_length": 64,
                "vocab_size": 256,
                "dtype": "fp32",
            },
        },
        "data": {},
        "training": {
            "global_batch_size": 48,
            # One size: how a CPU core batches 8 against 4 varies by run and would decide the
            # first plan (docs/demo.md, Cluster).
            "microbatch_sizes": [4],
            "mixed_precision": False,
            "steps": scenario.steps,
            "learning_rate": 0.003,
            "optimizer": "adam",
            "seed": scenario.seed,
            "schedule": "1f1b",
        },
        "checkpoint": {
            "dir": "checkpoints",
            "interval_steps": scenario.checkpoint_interval_steps,
            "resume": False,
        },
        "metrics": {"port": None},
        "profiles": "profiles",
        "elasticity": {"min_devices": 1, "max_failures": 3},
    }


def write_job(scenario: DemoScenario, workdir: Path) -> Path:
    """Write the job file (JSON, which is YAML) into ``workdir``; atomically."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "demo-job.yaml"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(demo_job(scenario), indent=2) + "\n")
    tmp.replace(path)
    return path
