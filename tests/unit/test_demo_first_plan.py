"""The demo's first plan, from its planning inputs (no Ray): it uses both device types with
uneven batch shares, beats uniform data parallel, and the demo prints the uniform line.

The profile is the demo model's, measured on a CPU core by the profiler (the T4 at its emulated
x5 stretch, which takes the least CPU time of the repeats, so the file does not depend on how busy
the host was). The A100-80's profile is the same work unstretched, as the emulation defines it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.demo.baseline import FirstPlan, first_plan
from orchestrator.demo.scenario import DemoScenario
from orchestrator.spec.profiles import ProfileFile, ProfileSet, read_profile

PROFILE = Path(__file__).parent / "demo_data" / "gpt-demo-T4.json"


def _scaled(profile: ProfileFile, device_type: str, factor: float) -> ProfileFile:
    entries = [
        e.model_copy(
            update={
                "layers": {
                    i: t.model_copy(
                        update={
                            "forward_s": t.forward_s * factor,
                            "backward_s": t.backward_s * factor,
                            "update_s": t.update_s * factor,
                        }
                    )
                    for i, t in e.layers.items()
                }
            }
        )
        for e in profile.entries
    ]
    return profile.model_copy(update={"device_type": device_type, "entries": entries})


def demo_profiles(scenario: DemoScenario, fast_factor: float = 1.0) -> ProfileSet:
    """Profiles of every starting type; ``fast_factor`` scales the fastest type's times (a host
    that measured it faster or slower than the emulation's exact ratio)."""
    t4 = read_profile(PROFILE)
    t4_speed = next(k.emulated_speed for k in scenario.start if k.device_type == "T4")
    reference = _scaled(t4, "A100-80", t4_speed)  # the unstretched CPU work
    files = [_scaled(reference, "A100-80", fast_factor)]
    files += [
        _scaled(reference, k.device_type, 1.0 / k.emulated_speed)
        for k in scenario.all_kinds()
        if k.device_type != "A100-80"
    ]
    return ProfileSet(files)


def test_the_profile_is_the_demo_models() -> None:
    scenario = DemoScenario()
    profile = read_profile(PROFILE)
    from orchestrator.demo.baseline import demo_job_spec

    shape = demo_job_spec(scenario).model.shape
    assert profile.model == shape.name
    assert profile.sequence_length == shape.sequence_length
    planned = demo_job_spec(scenario).training.microbatch_sizes
    assert set(planned) <= {e.microbatch_size for e in profile.entries}


# The emulation's ratio exactly (1.0), and busy hosts: the fastest type is profiled by the wall
# clock (it is not stretched), which is never below the CPU time the slower types are stretched
# from, so a busy host only makes it look slower. The first plan is heterogeneous either way.
@pytest.mark.parametrize("fast_factor", [1.0, 1.25, 1.5])
def test_first_plan_uses_every_type_with_uneven_shares(fast_factor: float) -> None:
    scenario = DemoScenario()
    first = first_plan(scenario, demo_profiles(scenario, fast_factor))
    counts = first.plan.device_counts()
    assert set(counts) == {"A100-80", "T4"}, counts
    shares = {r.batch_size for r in first.plan.replicas}
    assert len(shares) > 1, first.plan.replicas  # uneven batch shares
    # The fast type takes the largest share.
    largest = max(first.plan.replicas, key=lambda r: r.batch_size)
    assert {s.device_type for s in largest.stages} == {"A100-80"}
    # Uniform data parallel on the same nodes: every worker the same share, slower.
    assert first.uniform_plan is not None and first.uniform_step_s is not None
    uniform_shares = {r.batch_size for r in first.uniform_plan.replicas}
    assert len(uniform_shares) == 1
    assert len(first.uniform_plan.replicas) == sum(k.num_devices for k in scenario.start)
    assert first.uniform_step_s > 1.5 * first.step_s


def test_uniform_line_names_shares_step_and_ratio() -> None:
    scenario = DemoScenario()
    first = first_plan(scenario, demo_profiles(scenario))
    line = first.uniform_text(planner_step_s=first.step_s)
    assert line.startswith("uniform data parallel (as Ray Train runs: 4 workers, batch 12 each)")
    assert f"{first.uniform_step_s:.4f} s" in line and "emulated" in line
    assert f"{first.uniform_step_s / first.step_s:.2f}x" in line
    doc = first.to_json()
    assert doc["uniform_batch_per_worker"] == [12, 12, 12, 12]


def test_uniform_line_says_why_when_there_is_none() -> None:
    first = FirstPlan(
        plan=first_plan(DemoScenario(), None).plan,
        step_s=0.1,
        uniform_plan=None,
        uniform_step_s=None,
        uniform_note="global batch 2 < 4 devices",
    )
    assert first.uniform_text() == (
        "uniform data parallel (as Ray Train runs): not possible (global batch 2 < 4 devices)"
    )


def test_the_line_follows_the_initial_plans_own_lines_once() -> None:
    from orchestrator.control.events import PlanReason
    from orchestrator.demo.baseline import UniformLine

    scenario = DemoScenario()
    note = UniformLine(first_plan(scenario, demo_profiles(scenario)))
    assert note.take() is None  # no plan yet
    note.on_plan(PlanReason.INITIAL, 0.5)
    line = note.take()
    assert line is not None and "uniform data parallel" in line and "this plan's 0.5000 s" in line
    assert note.take() is None
    note.on_plan(PlanReason.FAILURE, 0.9)  # later plans get no line
    assert note.take() is None
    doc = note.to_json()
    assert doc is not None and doc["plan_predicted_step_s"] == 0.5


def test_summary_prints_the_uniform_comparison() -> None:
    from orchestrator.demo.report import render
    from orchestrator.demo.summary import build_summary
    from orchestrator.demo.timeline import Timeline

    controller = _run_summary("finished", 60)
    summary = build_summary(DemoScenario(steps=60), controller, Timeline(48), [], Path("/w"))
    first = first_plan(DemoScenario(), demo_profiles(DemoScenario()))
    summary.uniform_data_parallel = first.to_json()
    text = "\n".join(render(summary))
    ratio = first.uniform_step_s / first.step_s  # type: ignore[operator]
    assert "uniform data parallel on the starting nodes (4 workers, batch 12 each" in text
    assert f"{ratio:.2f}x the initial plan's (emulated)" in text
    assert summary.to_json()["uniform_data_parallel"]["uniform_over_plan"] == ratio


def _run_summary(state: str, steps: int, events=(), **figures):
    """A controller's summary with the given figures (the rest empty)."""
    from orchestrator.control.events import ControllerStateName
    from orchestrator.runtime.elastic.summary import RunSummary

    base = dict(
        reason="", steps_run=steps, first_loss=None, last_loss=None, mean_step_s=0.0,
        step_indices=(), losses=(), emulated=False, failure_count=0, lost_steps_total=0,
        recoveries=(), switch_costs_s=(), checkpoint_step=None, checkpoint_path="",
    )  # fmt: skip
    base.update(figures)
    return RunSummary(state=ControllerStateName(state), steps=steps, events=tuple(events), **base)
