"""Run the demo: start the emulated cluster, profile, train elastically, crash a node, add one.

Order: the local cluster starts with every device type the run will see (the joining type's node
only long enough to be profiled, then stopped), the example GPT is profiled on each type (so the
planner plans with measured numbers), the elastic controller actor trains the job, and this
driver, polling the controller, crashes a node of the fastest type after ``crash_at_step`` steps
and starts the joining node at ``join_at_step``. Everything started here is stopped in a
``finally`` (Ctrl-C included); nothing runs ``ray stop``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.demo.baseline import FirstPlan, UniformLine, first_plan
from orchestrator.demo.cluster import ClusterNode, LocalCluster
from orchestrator.demo.output import DemoOutput, ray_output_to
from orchestrator.demo.scenario import DemoScenario, write_job
from orchestrator.demo.summary import DemoSummary, build_summary
from orchestrator.demo.timeline import PlanLog, Timeline
from orchestrator.runtime.elastic.summary import RunSummary

if TYPE_CHECKING:  # the runtime (and Ray) load only when training starts
    from orchestrator.runtime.elastic.controller_actor import RunHandle

POLL_S = 0.25


def run_demo(
    scenario: DemoScenario, workdir: Path, output: DemoOutput, profile_cache: Path
) -> DemoSummary:
    """The whole demo; the cluster is stopped whatever happens."""
    cluster = LocalCluster()
    with ray_output_to(workdir / "ray-driver.log"):
        try:
            return _run(scenario, workdir, output, profile_cache, cluster)
        finally:
            output.line("stopping the local cluster ...")
            cluster.shutdown()


def _run(
    scenario: DemoScenario,
    workdir: Path,
    output: DemoOutput,
    profile_cache: Path,
    cluster: LocalCluster,
) -> DemoSummary:
    import ray

    kinds = [*scenario.start, scenario.joiner]
    names = ", ".join(
        f"{k.num_devices}x {k.device_type} (speed {k.emulated_speed:g})" for k in kinds
    )
    output.line(f"starting a local Ray cluster: nodes of one CPU per device, emulating {names}")
    started_s = time.time()
    cluster.start(kinds)
    ray.init(address=cluster.address, log_to_driver=False)
    output.line(f"  {len(kinds)} nodes up in {time.time() - started_s:.1f} s ({cluster.address})")
    job_file = write_job(scenario, workdir)
    profiled = _profile(job_file, output, profile_cache)
    # The joining type was only there to be profiled: it joins for real mid-run.
    cluster.stop(cluster.nodes[-1])
    _wait_for_nodes(len(scenario.start))
    uniform = UniformLine(_first_plan(scenario, job_file, output))
    timeline, summary = _train(scenario, job_file, cluster, output, uniform)
    result = build_summary(scenario, summary, timeline, profiled, workdir, cluster.temp_dir)
    result.uniform_data_parallel = uniform.to_json()
    return result


def _first_plan(scenario: DemoScenario, job_file: Path, output: DemoOutput) -> FirstPlan | None:
    """The planner's plan for the starting nodes and uniform data parallel beside it, from the
    profiles just measured (the controller plans from the same files)."""
    from orchestrator.errors import UserError
    from orchestrator.runtime.jobs import load_job
    from orchestrator.spec.profiles import ProfileSet

    job = load_job(job_file)
    assert job.profiles is not None
    try:
        profiles = ProfileSet.load([job.resolve_path(job.profiles, job_file)])
        return first_plan(scenario, profiles.for_model(job.model.shape.name))
    except UserError as exc:  # the controller will say what is wrong; the baseline is extra
        output.line(f"  (no uniform data-parallel comparison: {exc})")
        return None


def _profile(job_file: Path, output: DemoOutput, cache: Path) -> list[Any]:
    from orchestrator.runtime.discovery import discover_nodes
    from orchestrator.runtime.jobs import load_job, worker_job
    from orchestrator.runtime.profiling import profile_device_types

    job = load_job(job_file)
    assert job.profiles is not None
    started_s = time.time()
    done = profile_device_types(
        worker_job(job, job_file),
        discover_nodes(),
        job.training.microbatch_sizes,
        job.resolve_path(job.profiles, job_file),
        cache,
        out=output.line,
    )
    for item in done:
        how = "from cache" if item.from_cache else "measured"
        emulated = f", emulated x{item.slowdown_factor:g} slower" if item.emulated else ""
        output.line(f"  profile {item.device_type}: {how}{emulated}")
    output.line(f"  profiles ready in {time.time() - started_s:.1f} s")
    return done


def _wait_for_nodes(count: int, timeout_s: float = 30.0) -> None:
    from orchestrator.runtime.discovery import discover_nodes

    deadline = time.monotonic() + timeout_s
    while len(discover_nodes()) != count and time.monotonic() < deadline:
        time.sleep(0.2)


def _train(
    scenario: DemoScenario,
    job_file: Path,
    cluster: LocalCluster,
    output: DemoOutput,
    uniform: UniformLine,
) -> tuple[Timeline, RunSummary]:

    from orchestrator.runtime.elastic.controller_actor import RunHandle
    from orchestrator.runtime.elastic.session import ElasticJob
    from orchestrator.telemetry.logs import progress

    spec = ElasticJob.from_file(job_file)
    job = spec.job
    timeline = Timeline(job.training.global_batch_size)
    output.line(f"training {job.model.shape.name} for {scenario.steps} steps (elastic controller)")
    handle = RunHandle.start(spec)
    try:
        with progress("training", scenario.steps, console=output.console) as bar:
            output.attach_bar(output.console)
            try:
                summary = _follow(handle, scenario, cluster, timeline, output, bar, uniform)
            finally:
                output.attach_bar(None)
    finally:
        handle.stop()
    return timeline, summary


def _follow(
    handle: RunHandle,
    scenario: DemoScenario,
    cluster: LocalCluster,
    timeline: Timeline,
    output: DemoOutput,
    bar: Any,
    uniform: UniformLine,
) -> RunSummary:
    """Follow the run's typed updates; print its decisions; crash and add nodes on schedule."""
    from orchestrator.runtime.elastic.session import describe_plan
    from orchestrator.runtime.elastic.updates import PlanApplied, StepDone

    last_printed = 0
    steps = 0
    while True:
        done = handle.wait(POLL_S)
        now_s = time.time()
        for update in handle.updates():
            if isinstance(update, PlanApplied):
                devices = update.plan.device_counts()
                replicas = [line.strip() for line in describe_plan(update.plan)]
                log = PlanLog(now_s, update.reason, devices, update.predicted_step_s, replicas)
                timeline.add_plan(now_s, log)
                uniform.on_plan(update.reason, update.predicted_step_s)
            elif isinstance(update, StepDone):
                steps = update.report.step + 1
        for line in handle.lines(steps=False):  # the steps are the progress bar instead
            output.line(line)
        beside = uniform.take()  # after the initial plan's own lines (they precede its update)
        if beside is not None:
            output.line(beside)
        if done:
            return handle.result()
        timeline.record(time.time(), steps)
        bar.update(completed=steps)
        if not output.is_terminal and steps >= last_printed + 10:
            last_printed = steps - steps % 10
            output.line(f"  ... {steps}/{scenario.steps} steps")
        _maybe_crash(scenario, cluster, timeline, output, steps)
        _maybe_join(scenario, cluster, timeline, output, steps)


def _maybe_crash(
    scenario: DemoScenario,
    cluster: LocalCluster,
    timeline: Timeline,
    output: DemoOutput,
    steps: int,
) -> None:
    at = scenario.crash_at_step
    if at is None or timeline.crashed_at_s is not None or steps < at:
        return
    victim = _node_of_type(cluster, scenario.crash_device_type)
    if victim is None:
        return
    timeline.crashed_at_s = cluster.crash(victim)
    timeline.crashed_node = victim.node_id
    timeline.crashed_at_step = steps
    output.line(
        f">>> crash: SIGKILL of node {victim.node_id[:8]} ({victim.kind.device_type}) "
        f"after step {steps}"
    )


def _maybe_join(
    scenario: DemoScenario,
    cluster: LocalCluster,
    timeline: Timeline,
    output: DemoOutput,
    steps: int,
) -> None:
    if timeline.joined_at_s is not None or steps < scenario.join_at_step:
        return
    if timeline.crashed_at_s is not None and steps <= (timeline.crashed_at_step or 0):
        return  # still recovering: let the run settle first
    timeline.joined_at_s = time.time()
    node = cluster.add(scenario.joiner)
    timeline.joined_node = node.node_id
    timeline.joined_at_step = steps
    output.line(
        f">>> join: new node {node.node_id[:8]} ({scenario.joiner.num_devices}x "
        f"{scenario.joiner.device_type}, emulated speed "
        f"{scenario.joiner.emulated_speed:g}) at step {steps}"
    )


def _node_of_type(cluster: LocalCluster, device_type: str) -> ClusterNode | None:
    for node in cluster.alive_nodes():
        if node.kind.device_type == device_type:
            return node
    return None
