"""The runtime runs the precision its plan records, whatever the job's workers were given.

The job's worker settings carry fp32 (``training.precision`` unset); the plan records fp16. Each
rank then computes in fp16 under dynamic loss scaling: the step reports the scaler's first scale
(2^16; 1.0 in fp32) and every rank counts 16-bit weight copies (none in fp32).
"""

from __future__ import annotations

from ray_plans import A100, plan, tiny_job

from orchestrator.runtime.group import WorkerGroup
from orchestrator.spec.devices import Dtype

STEPS = 2


def test_workers_compute_in_the_plans_precision(ray_cluster: object) -> None:
    job = tiny_job()
    assert job.extra.get("precision", "fp32") == "fp32"
    two_stages = plan((8, [(0, 3, A100), (3, 6, A100)]))
    group = WorkerGroup(job)
    try:
        group.launch(two_stages.model_copy(update={"precision": Dtype.FP16}))
        reports = [group.step() for _ in range(STEPS)]
    finally:
        group.stop()
    for report in reports:
        assert report.loss_scale == 2.0**16 and not report.overflow_skipped
        counted = [t.memory for t in report.stage_timings if t.memory is not None]
        assert len(counted) == 2 and all(m.cast_weight_bytes > 0 for m in counted)
    assert reports[-1].loss < reports[0].loss
