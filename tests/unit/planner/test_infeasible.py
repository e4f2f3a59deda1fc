"""Infeasible clusters: the message names the real cause with its figures, never 'missing 0.0'."""

from __future__ import annotations

import re

import pytest

from orchestrator.errors import InfeasibleError
from orchestrator.planner import make_plan
from orchestrator.planner.infeasible import GiB, MiB, size_text
from orchestrator.planner.selection import SearchConfig
from orchestrator.spec.model import ModelSpec, TrainingSpec

from .toy import cluster

# Three planner layers of about 0.2 GiB each (state and one microbatch): no two share a 0.3 GiB
# device, while two such devices together hold the whole model (0.59 GiB), so the lower bound
# is met and the pipeline depth is what fails.
WIDE = ModelSpec(
    name="w",
    num_layers=1,
    hidden_size=1024,
    num_heads=16,
    sequence_length=256,
    vocab_size=12288,
    dtype="bf16",
)


def _message(
    model: ModelSpec,
    training: TrainingSpec,
    devices: int,
    gib: float,
    config: SearchConfig | None = None,
) -> str:
    c = cluster(("dev", 1, devices), memory_gib={"dev": gib}).resolve()
    with pytest.raises(InfeasibleError) as err:
        make_plan(c, model, training, config=config)
    text = str(err.value)
    assert "missing 0.0" not in text
    return text


def test_sizes_below_a_gib_are_shown_in_mib() -> None:
    assert size_text(2.5 * GiB) == "2.5 GiB"
    assert size_text(20 * MiB) == "20.0 MiB"
    assert size_text(1000) == "0.1 MiB"  # a real shortfall never reads as zero
    assert size_text(0) == "0.0 MiB"


def test_too_few_devices_for_the_pipeline_depth() -> None:
    tr = TrainingSpec(global_batch_size=8, microbatch_sizes=[1], max_tensor_parallel=1)
    text = _message(WIDE, tr, devices=2, gib=0.30)
    assert "too few devices for the pipeline depth" in text
    assert "at least 3 stages on dev (307.2 MiB usable each)" in text
    assert "the cluster has 2 devices" in text


def test_max_pipeline_stages_below_the_depth_needed_is_named() -> None:
    tr = TrainingSpec(
        global_batch_size=8, microbatch_sizes=[1], max_tensor_parallel=1, max_pipeline_stages=2
    )
    # Unsharded: the depth is what fails (sharded over the three devices, the model fits).
    text = _message(WIDE, tr, devices=3, gib=0.30, config=SearchConfig(sharded=False))
    assert "at least 3 stages on dev" in text and "max_pipeline_stages is 2" in text


def test_tensor_parallel_limited_by_the_heads_is_named() -> None:
    # The embedding of a 200k vocabulary does not fit at tp 2; tp 4 would split it further but
    # does not divide the 6 heads.
    m = ModelSpec(
        name="h",
        num_layers=2,
        hidden_size=1536,
        num_heads=6,
        sequence_length=256,
        vocab_size=200000,
        dtype="bf16",
    )
    # (Sharded over the eight devices it fits: the message is the unsharded search's.)
    training = TrainingSpec(global_batch_size=8, microbatch_sizes=[1])
    text = _message(m, training, 8, 2.0, config=SearchConfig(sharded=False))
    assert "no device holds the largest layer" in text
    assert "at tp 2 (tp 4 does not divide num_heads 6)" in text
    assert "missing 394.2 MiB" in text


def test_small_shortfall_is_in_mib_not_zero_gib() -> None:
    tr = TrainingSpec(global_batch_size=8, microbatch_sizes=[1], max_tensor_parallel=1)
    text = _message(WIDE, tr, devices=2, gib=0.205)
    missing = re.search(r"missing ([0-9.]+) MiB", text)
    assert missing is not None and 100 < float(missing.group(1)) < 1024, text
